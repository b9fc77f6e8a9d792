"""Discovery referrals to the other storage hosts: the mesh that lets the fleet grow.

Each port kvagent created carries one referral (``ports/<id>/referrals/kvagent-<peer>``)
to every peer in ``target.peers`` that is not one of this host's own ports, so a GPU
host that discovers at any storage host finds every other (it follows referrals:
:mod:`agent.initiator.stages.discover`). A peer marked ``draining`` is not referred to:
GPU hosts stop finding it, and let its namespaces go. Enabling a referral makes nvmet send a
discovery-log-change AEN to every host holding a persistent discovery controller on the
port: a storage host added to the peers reaches the GPU hosts at once.

Referrals are diff-applied and owned like every other object: kvagent changes or removes
only the referrals it recorded making (``TargetRecords.referrals``); a referral someone
else made on such a port is kept as it is, and one that holds the name kvagent would
give is reported, never taken over. A peer that is down is still referred: reachability
is for the GPU hosts to find out (unknown, never empty).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nvmet.model import Port, Referral

from ..config.model import Config, PeerConfig
from ..config.types import IPAddress

#: The name of kvagent's referral to a peer is this prefix and the peer's name.
PREFIX = "kvagent-"


def referral_name(peer: PeerConfig) -> str:
    """The referral's directory name on each port for ``peer``."""
    return f"{PREFIX}{peer.name}"


def peer_referral(peer: PeerConfig) -> Referral:
    """The enabled referral to ``peer``'s discovery port."""
    return Referral(name=referral_name(peer), enable=True, addr={
        "trtype": peer.transport, "adrfam": IPAddress(peer.address).family,
        "traddr": peer.address, "trsvcid": str(peer.service)})


def referred_peers(cfg: Config) -> list[PeerConfig]:
    """The peers this host refers to: every configured one but those draining and those
    that are one of this host's own ports (one list may go to every storage host)."""
    if cfg.target is None:
        return []
    own = {(p.transport, p.address, p.service) for p in cfg.target.ports}
    return [p for p in cfg.target.peers
            if not p.draining and (p.transport, p.address, p.service) not in own]


def port_referrals(port_id: int, peers: Iterable[PeerConfig], live: Port | None,
                   owned: set[tuple[int, str]]) -> tuple[dict[str, Referral] | None, list[str]]:
    """The referrals port ``port_id`` should carry, and the names kvagent may not take.

    Returns ``(None, [])`` when kvagent has nothing to say about the port's referrals
    (no peer, none of its own there): the planner then leaves them alone. Otherwise every
    referral someone else made stays as it is live, and kvagent's are its peers'.
    """
    wanted = {r.name: r for r in map(peer_referral, peers)}
    live_refs: Mapping[str, Referral] = (live.referrals or {}) if live is not None else {}
    ours_live = {name for name in live_refs if (port_id, name) in owned}
    if not wanted and not ours_live:
        return None, []
    out = {name: ref for name, ref in live_refs.items() if name not in ours_live}
    taken = sorted(name for name in wanted if name in out)
    out |= {name: ref for name, ref in wanted.items() if name not in out}
    return out, taken

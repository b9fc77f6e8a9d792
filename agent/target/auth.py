"""DH-HMAC-CHAP on the storage host: the nvmet host attributes each pool's hosts want.

nvmet keeps one set of secrets per host NQN (``hosts/<nqn>/dhchap_*``), shared by every
subsystem that allows the host; the config check makes a host NQN's ``auth`` the same in
every pool. A new secret written there is used from the next authentication on: live
controllers keep working (a rotation), and a GPU host that re-authenticates with the old
secret is refused. The kernel cannot clear a secret once set (an empty write fails), so
turning auth off for a host is refused with the way to do it.

A GPU host re-authenticates once per secret it is given: rotating one secret at a time
keeps its controllers live; for both at once it replaces each controller with a new one
(agent.initiator.connect.refresh_controllers), which is warned about here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import nvmet
from nvmet.model import Tree

from ..config.model import Config, TargetPool
from ..dhchap import read_secret
from ..errors import KvagentError
from ..log import get_logger

log = get_logger("target.auth")

#: The host attribute files kvagent reads (and writes when a host has auth).
HOST_FILES = ("dhchap_key", "dhchap_ctrl_key", "dhchap_hash", "dhchap_dhgroup")
#: Those that hold secrets: never shown (plan output, records, logs).
SECRET_FILES = frozenset({"dhchap_key", "dhchap_ctrl_key"})


@dataclass
class HostAuthPlan:
    """Per host NQN the nvmet attributes to set; per pool the errors that fail it."""

    attrs: dict[str, dict[str, str]] = field(default_factory=dict)
    errors: dict[str, list[tuple[str, str | None]]] = field(default_factory=dict)


def wants_auth(cfg: Config) -> bool:
    """Whether any target pool's host has DH-HMAC-CHAP."""
    pools = cfg.target.pools if cfg.target else ()
    return any(h.auth is not None for p in pools for h in p.hosts)


def plan_host_auth(pools: list[TargetPool], live: Tree,
                   feats: nvmet.Features | None, *, owned_hosts: frozenset[str] | set[str] = (
                       frozenset()), subsystem_prefix: str | None = None) -> HostAuthPlan:
    """What each pool's hosts need in nvmet; a pool whose secrets cannot be read, whose
    kernel lacks target auth, or that would turn auth off for a host has errors.

    A host entry kvagent did not create (not in ``owned_hosts``) that a subsystem outside
    ``subsystem_prefix`` (someone else's) allows is not kvagent's to give a secret: its
    secrets are the admin's, and writing kvagent's would change them for their subsystem
    too; nor is one allowed by no subsystem that holds secrets other than the config's.
    That pool has an error instead."""
    out = HostAuthPlan()
    # Each host NQN's subsystems of someone else (one walk of nvmet, not one per host).
    foreign_of: dict[str, list[str]] = {}
    if subsystem_prefix:
        for s, sub in live.subsystems.items():
            if not s.startswith(subsystem_prefix + ":"):
                for h in sub.allowed_hosts:
                    foreign_of.setdefault(h, []).append(s)
    for pool in pools:
        for i, host in enumerate(pool.hosts):
            where = f"pool {pool.name}: host {host.name} ({host.nqn})"
            lhost = live.hosts.get(host.nqn)
            live_keys = [f for f in ("dhchap_key", "dhchap_ctrl_key")
                         if lhost is not None and lhost.attrs.get(f)]
            foreign = sorted(foreign_of.get(host.nqn, ()))
            if (host.auth is not None and lhost is not None and host.nqn not in owned_hosts
                    and foreign):
                out.errors.setdefault(pool.name, []).append((
                    f"{where}: nvmet's host entry {host.nqn} was not made by kvagent and "
                    f"subsystem(s) {', '.join(foreign)} of someone else allow it; writing "
                    "kvagent's DH-HMAC-CHAP secrets would change theirs",
                    "give this GPU host its own host NQN, or take the entry over by hand "
                    "(remove it from those subsystems' allowed_hosts, then remove the entry "
                    "or put its secrets in the pool's key files) and apply again"))
                continue
            if host.auth is None:
                if live_keys:
                    out.errors.setdefault(pool.name, []).append((
                        f"{where} has a DH-HMAC-CHAP secret in nvmet and the config gives it "
                        "no auth; the kernel cannot remove a secret from a host",
                        "to turn auth off: remove the host from the hosts of every pool "
                        "that lists it and apply (its controllers are cut off), then add "
                        "it back without auth and apply again"))
                continue
            if feats is not None and feats.dhchap is False:
                out.errors.setdefault(pool.name, []).append((
                    f"{where} has auth, but this kernel's nvmet has no DH-HMAC-CHAP "
                    f"(no hosts/*/dhchap_key{'; kernel ' + feats.kernel if feats.kernel else ''})",
                    "run a kernel built with CONFIG_NVME_TARGET_AUTH (Debian 13's 6.12 has "
                    "it, Debian 12's 6.1 does not), or remove auth from this host"))
                continue
            try:
                key = read_secret(host.auth.key_file)
                ctrl = (read_secret(host.auth.ctrl_key_file)
                        if host.auth.ctrl_key_file else None)
            except KvagentError as exc:
                out.errors.setdefault(pool.name, []).append(
                    (f"{where}: hosts[{i}].auth: {exc.message}", exc.hint))
                continue
            if ctrl is None and "dhchap_ctrl_key" in live_keys:
                out.errors.setdefault(pool.name, []).append((
                    f"{where} has a controller secret in nvmet and the config gives it no "
                    "ctrl_key_file; the kernel cannot remove a secret from a host",
                    "keep ctrl_key_file, or remove the host from its pools, apply, and add "
                    "it back"))
                continue
            attrs = {"dhchap_key": key.text, "dhchap_hash": f"hmac({host.auth.hash})",
                     "dhchap_dhgroup": host.auth.dhgroup}
            if ctrl is not None:
                attrs["dhchap_ctrl_key"] = ctrl.text
            changed = [f for f in live_keys if lhost is not None
                       and lhost.attrs.get(f) != attrs.get(f)]
            if host.nqn not in owned_hosts and changed:
                out.errors.setdefault(pool.name, []).append((
                    f"{where}: nvmet's host entry {host.nqn} was not made by kvagent and "
                    f"holds DH-HMAC-CHAP secrets of its own ({', '.join(changed)}); kvagent "
                    "does not write over someone else's secrets",
                    "give this GPU host its own host NQN, or put the entry's secrets in the "
                    "pool's key files (then it is taken over as it is), or remove the entry "
                    "by hand and apply again"))
                continue
            if (host.nqn not in out.attrs and lhost is not None
                    and len(live_keys) == 2 and "dhchap_ctrl_key" in attrs
                    and all(lhost.attrs[f] != attrs[f] for f in live_keys)):
                log.warning("both DH-HMAC-CHAP secrets of a host change at once: its GPU "
                            "host replaces each live controller with a new one (native "
                            "multipath moves the I/O); rotate one secret at a time to keep "
                            "them as they are",
                            pool=pool.name, host=host.name, hostnqn=host.nqn)
            out.attrs[host.nqn] = attrs
    return out

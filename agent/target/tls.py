"""NVMe/TCP TLS on the storage host: the pools on TLS ports, whether this kernel and
host can serve them, and the pre-shared keys their hosts need in the ``.nvme`` keyring.

A port with ``tls: required`` has ``addr_tsas`` tls1.3 and ``addr_treq`` required (see
:func:`~agent.target.export.desired_port`): nvmet then hands every new connection to
tlshd for a TLS 1.3 handshake with a PSK, and one that does not start TLS is dropped.
tlshd finds the PSK under the identity the host sends (``NVMe0R0x <hostnqn>
<subsysnqn>``): kvagent inserts one per host and subsystem of the pool, and one for the
discovery subsystem (discovery on such a port is TLS too).
"""

from __future__ import annotations

import nvmet

from ..config.model import Config, TargetPool
from ..system.keyring import TLSHD_HINT, tlshd_running


def tls_port_names(cfg: Config) -> set[str]:
    """Names of the configured ports with TLS."""
    return {p.name for p in cfg.target.ports if p.tls != "none"} if cfg.target else set()


def wants_tls(cfg: Config) -> bool:
    """Whether any configured port has TLS."""
    return bool(tls_port_names(cfg))


def on_tls_port(cfg: Config, pool: TargetPool) -> bool:
    """Whether ``pool`` is exported on a port with TLS."""
    return bool(tls_port_names(cfg) & set(pool.ports))


def tls_errors(cfg: Config, pools: list[TargetPool], feats: nvmet.Features | None,
               ) -> dict[str, list[tuple[str, str | None]]]:
    """Per pool on a TLS port, why it cannot be served with TLS here (empty: it can)."""
    names = tls_port_names(cfg)
    out: dict[str, list[tuple[str, str | None]]] = {}
    tlshd = None
    for pool in pools:
        ports = sorted(names & set(pool.ports))
        if not ports:
            continue
        if feats is not None and feats.tsas is False:
            kernel = f"; kernel {feats.kernel}" if feats.kernel else ""
            out.setdefault(pool.name, []).append((
                f"pool {pool.name} is on TLS port {ports[0]}, but this kernel's nvmet has "
                f"no NVMe/TCP TLS (no ports/*/addr_tsas{kernel})",
                "run a kernel built with CONFIG_NVME_TARGET_TCP_TLS (Debian 13's 6.12 has "
                "it, Debian 12's 6.1 does not), or set tls: none on the port"))
            continue
        if tlshd is None:
            tlshd = tlshd_running()
        if not tlshd:
            out.setdefault(pool.name, []).append((
                f"pool {pool.name} is on TLS port {ports[0]}, but tlshd (the TLS handshake "
                "daemon) is not running: no host could connect", TLSHD_HINT))
    return out

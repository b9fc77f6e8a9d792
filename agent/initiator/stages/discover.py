"""Stage 1, discover: which subsystems a pool has, each at the target it is reached at.

A target given with ``subsystem`` is taken as configured (no command); so are, in an
attach pass for events that cannot have brought a new subsystem (``known``: a namespace
added or resized, a controller live again), the subsystems a complete record found at
that target; any other is asked with ``nvme discover`` (over TLS for a pool with
``tls``: its PSK goes into the keyring first). The discovery log lists only what the
storage host lets this host NQN use, so a per-host subsystem there is this host's
whatever name it carries: one named for another host than ``node.name`` is attached with
a warning. A shared subsystem is refused unless the pool is ``shared`` (two hosts
mounting one xfs destroy it). Planning (dry run) a pool whose target cannot be asked yet
reports the connect as planned.
"""

from __future__ import annotations

from ...config.model import InitiatorPool
from ...errors import KvagentError
from ...fabrics import DISCOVERY_NQN, FabricsAddress
from ...log import get_logger
from ...naming import parse_subsystem_nqn
from ...records import SubsystemPath
from ..connect import pool_entries
from ..kernel_quirks import loopback_tcp_warning
from .context import StageContext
from .tlskeys import ensure_psk

log = get_logger("initiator")
#: The host-wide warnings this process has given (the agent's passes repeat them not).
_WARNED: set[str] = set()


def pool_paths(ctx: StageContext, pool: InitiatorPool, hostnqn: str,
               hostid: str | None, known: list[SubsystemPath] | None = None,
               ) -> list[SubsystemPath] | None:
    """The pool's subsystems, each at its target (None: planning, and discovery is not
    possible now; the planned connect is reported). ``known``: subsystems recorded at
    these targets that stand for a discovery (none asked where one is recorded)."""
    try:
        paths = _discover(ctx, pool, hostnqn, hostid, known or [])
    except KvagentError as exc:
        if not ctx.dry_run:
            raise
        # Planning: the target may only come up with this very apply (converged host).
        ctx.act(pool.name, "nvme.connect", pool.name,
                f"after discovery; not possible to check now: {exc.message}")
        return None
    _check_shared(ctx, pool, paths)
    thp = ctx.thp_mode()
    for a in paths:
        warning = loopback_tcp_warning(a.address.transport, a.address.traddr, thp)
        if warning and warning not in _WARNED:  # once a process, not each pool each pass
            _WARNED.add(warning)
            log.warning(warning, pool=pool.name)
    return paths


def _discover(ctx: StageContext, pool: InitiatorPool, hostnqn: str,
              hostid: str | None, known: list[SubsystemPath]) -> list[SubsystemPath]:
    """The pool's subsystems, each at the target it was configured or discovered at."""
    found: list[SubsystemPath] = []
    for t in pool.targets:
        address = FabricsAddress.from_config(t)
        if t.subsystem:
            found.append(SubsystemPath(t.subsystem, address))
            continue
        recorded = [s for s in known if s.address == address]
        if recorded:
            found += recorded
            continue
        if pool.tls is not None:
            ensure_psk(ctx, pool, hostnqn, DISCOVERY_NQN)
        entries = ctx.cli.discover(t.transport, t.address, str(t.service),
                                   hostnqn=hostnqn, hostid=hostid,
                                   tls=pool.tls is not None,
                                   device=None if pool.tls is not None else
                                   _discovery_controller(ctx, address, hostnqn))
        # The log lists only what the storage host's ACL lets this host NQN use: a
        # per-host subsystem there is this host's, whatever name it carries.
        mine = pool_entries(entries, ctx.cfg.node.nqn_prefix, pool.name)
        if not mine:
            raise KvagentError(
                f"the storage host at {address.describe()} offers no "
                f"subsystem of pool {pool.name!r} to this host ({hostnqn})",
                f"list this host (name {ctx.cfg.node.name}, NQN {hostnqn}) in the pool's "
                "hosts on the storage host and apply there; check node.nqn_prefix matches")
        for e in sorted(mine, key=lambda e: e.subnqn):
            _check_host_name(ctx, pool, e.subnqn, hostnqn)
            found.append(SubsystemPath(e.subnqn, address))
    return found


def _discovery_controller(ctx: StageContext, address: FabricsAddress,
                          hostnqn: str) -> str | None:
    """A live discovery controller of this host NQN at ``address`` (the agent keeps one:
    :mod:`agent.initiator.discovery_controllers`), to read the log through: no controller
    made and removed per pass, and the read acknowledges its discovery AEN."""
    return next((c.name for c in ctx.sysfs.controllers(DISCOVERY_NQN)
                 if c.state == "live" and c.discovers_for(hostnqn, address)), None)


def _check_host_name(ctx: StageContext, pool: InitiatorPool, subsysnqn: str,
                     hostnqn: str) -> None:
    """A per-host subsystem named for another host than ``node.name``: attached (the
    storage host admits this NQN to it), with a warning."""
    parsed = parse_subsystem_nqn(ctx.cfg.node.nqn_prefix, subsysnqn)
    if parsed is None or parsed[2] is None or parsed[2] == ctx.cfg.node.name:
        return
    message = (f"{subsysnqn} is named for host {parsed[2]!r}, but this host's node.name "
               f"is {ctx.cfg.node.name!r}: attached by this host's NQN ({hostnqn}), "
               "which the storage host admits to it; rename the pool's host entry on "
               f"storage node {parsed[0]!r} or set node.name here to match")
    log.warning(message, pool=pool.name)
    ctx.result.warn("initiator", pool.name, message)


def _check_shared(ctx: StageContext, pool: InitiatorPool, paths: list[SubsystemPath]) -> None:
    for a in paths:
        parsed = parse_subsystem_nqn(ctx.cfg.node.nqn_prefix, a.subsysnqn)
        if parsed is not None and parsed[2] is None and not pool.shared:
            raise KvagentError(
                f"{a.subsysnqn} is a shared subsystem (several hosts use it): kvagent "
                "never puts a filesystem on it, since two hosts mounting one filesystem "
                "destroy it",
                "set shared: true on this initiator pool to attach it as raw block devices")

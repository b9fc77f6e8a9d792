"""Stage 1, discover: which subsystems a pool has, each at the target it is reached at.

A target given with ``subsystem`` is taken as configured (no command; never a seed).
Any other is a seed: its discovery log is read with ``nvme discover`` (through this
host's live persistent discovery controller there when there is one, else a one-shot
``--force`` read; over TLS for a pool with ``tls``: its PSK goes into the keyring
first), and the pool's subsystems listed there are taken. With ``referrals: follow``
(the default) the referrals the log lists (another storage host's discovery port) are
read the same way and with the same connect options, breadth-first: each port once (a
referral back to a seed, to itself or to a port already read is ignored), at most
:data:`MAX_REFERRAL_DEPTH` referrals from a seed and :data:`MAX_DISCOVERY_PORTS` ports
per pool; a walk cut short by a bound says so. The ports found by referral are
recorded (``PoolAttachment.discovery``): the persistent discovery controllers follow
them, so a storage host added to the mesh later is heard of by its AEN. A storage host
reached by referral that offers this host nothing of the pool is no error; a pool none
of whose ports offers anything is.

In an attach pass for events that cannot have brought a new subsystem (``known``: a
namespace added or resized, a controller live again), the subsystems a complete record
found at a port stand for its discovery (nothing asked there), and the ports referred
to last time are walked from the record; so are they when a seed cannot be read.

A port that cannot be read is unknown, never empty. While some port answers, the pass
goes on with those that did; the subsystems the pool's record has at each port not
read (unreachable, beyond a bound of the walk, or referred to last time and not reached
now while the walk was partial) are carried forward as they are
(:attr:`Discovered.carried`: not connected, not waited for, never dropped by this
pass), with a warning naming the port. When no port answers, the pool fails and nothing
is detached; so does a striped pool with a recorded subsystem out of reach (its volume
spans every namespace).

The discovery log lists only what the storage host lets this host NQN use, so a per-host
subsystem there is this host's whatever name it carries: one named for another host
than ``node.name`` is attached with a warning. A shared subsystem is refused unless the
pool is ``shared`` (two hosts mounting one xfs destroy it). Planning (dry run) a pool
whose targets cannot be asked yet reports the connect as planned.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ...config.model import InitiatorPool
from ...errors import KvagentError
from ...fabrics import DISCOVERY_NQN, FabricsAddress
from ...log import get_logger
from ...naming import parse_subsystem_nqn
from ...records import PoolAttachment, SubsystemPath
from ..connect import pool_entries
from ..kernel_quirks import loopback_tcp_warning
from ..nvme.discovery import DiscoveryEntry
from .context import StageContext
from .tlskeys import ensure_psk

log = get_logger("initiator")
#: The host-wide warnings this process has given (the agent's passes repeat them not).
_WARNED: set[str] = set()
#: How many referrals deep a pool's walk goes from a seed (a seed's own are depth 1).
MAX_REFERRAL_DEPTH = 3
#: The most discovery ports one pool's walk reads in a pass, seeds included.
MAX_DISCOVERY_PORTS = 64
#: The transports a referral is followed over (those kvagent connects with).
_TRANSPORTS = ("tcp", "rdma")


@dataclass(frozen=True)
class Discovered:
    """What the discover stage found of a pool."""

    #: the subsystems to connect, each at its target
    paths: list[SubsystemPath]
    #: subsystems of the pool's record at ports not read this pass: kept as they are
    carried: list[SubsystemPath] = field(default_factory=list)
    #: the ports not read this pass whose recorded subsystems stand (endpoints)
    unread: frozenset[FabricsAddress] = frozenset()
    #: the discovery ports found by referral (endpoints), for the pool's record
    referred: list[FabricsAddress] = field(default_factory=list)


def pool_paths(ctx: StageContext, pool: InitiatorPool, hostnqn: str,
               hostid: str | None, known: list[SubsystemPath] | None = None,
               old: PoolAttachment | None = None) -> Discovered | None:
    """The pool's subsystems, each at its target (None: planning, and discovery is not
    possible now; the planned connect is reported). ``known``: subsystems recorded at
    these targets that stand for a discovery (none asked where one is recorded);
    ``old``: the pool's record (what is carried forward from ports not read)."""
    try:
        found = _discover(ctx, pool, hostnqn, hostid, known, old)
    except KvagentError as exc:
        if not ctx.dry_run:
            raise
        # Planning: the target may only come up with this very apply (converged host).
        ctx.act(pool.name, "nvme.connect", pool.name,
                f"after discovery; not possible to check now: {exc.message}")
        return None
    _check_shared(ctx, pool, found.paths)
    thp = ctx.thp_mode()
    for a in found.paths:
        warning = loopback_tcp_warning(a.address.transport, a.address.traddr, thp)
        if warning and warning not in _WARNED:  # once a process, not each pool each pass
            _WARNED.add(warning)
            log.warning(warning, pool=pool.name)
    return found


@dataclass
class _Walk:
    """One pool's walk over its discovery ports (seeds first, then referrals)."""

    ctx: StageContext
    pool: InitiatorPool
    hostnqn: str
    hostid: str | None
    known: list[SubsystemPath]
    found: list[SubsystemPath] = field(default_factory=list)
    #: every port met (read, to read, or cut): none is read twice
    seen: set[FabricsAddress] = field(default_factory=set)
    queue: deque[tuple[FabricsAddress, int]] = field(default_factory=deque)
    answered: list[FabricsAddress] = field(default_factory=list)
    failed: dict[FabricsAddress, KvagentError] = field(default_factory=dict)
    referred: list[FabricsAddress] = field(default_factory=list)
    #: ports referred to but not read: beyond a bound
    cut: list[FabricsAddress] = field(default_factory=list)
    offered: bool = False

    def read(self, address: FabricsAddress, depth: int) -> None:
        """The pool's subsystems at ``address`` (recorded ones standing for them in an
        attach pass that does not rediscover), and its referrals queued."""
        recorded = [s for s in self.known if s.address == address]
        if recorded:
            self.found += recorded
            self.answered.append(address)
            self.offered = True
            return
        try:
            entries = _read_log(self.ctx, self.pool, address, self.hostnqn, self.hostid)
        except KvagentError as exc:
            self.failed[address] = exc
            return
        self.answered.append(address)
        # The log lists only what the storage host's ACL lets this host NQN use: a
        # per-host subsystem there is this host's, whatever name it carries.
        mine = pool_entries(entries, self.ctx.cfg.node.nqn_prefix, self.pool.name)
        for e in sorted(mine, key=lambda e: e.subnqn):
            _check_host_name(self.ctx, self.pool, e.subnqn, self.hostnqn)
            self.found.append(SubsystemPath(e.subnqn, address))
        self.offered = self.offered or bool(mine)
        if self.pool.referrals == "follow":
            for e in entries:
                if e.is_referral:
                    self.refer(e, depth + 1)

    def refer(self, entry: DiscoveryEntry, depth: int) -> None:
        """Queue the port a referral names (once; within the walk's bounds)."""
        to = entry.address.endpoint
        if to in self.seen:
            return  # a seed, this very port, or one met already
        self.seen.add(to)
        if to.transport not in _TRANSPORTS or (
                self.pool.tls is not None and to.transport != "tcp"):
            _warn(self.ctx, self.pool,
                  f"a referral to {to.describe()} is not followed: pool {self.pool.name} "
                  f"discovers over {'NVMe/TCP TLS' if self.pool.tls else 'tcp or rdma'}")
            return
        if depth > MAX_REFERRAL_DEPTH or len(self.referred) + len(
                [t for t in self.pool.targets if not t.subsystem]) >= MAX_DISCOVERY_PORTS:
            self.cut.append(to)
            return
        self.referred.append(to)
        self.queue.append((to, depth))

    def run(self, remembered: list[FabricsAddress], always: bool) -> None:
        """Seeds in the config's order (a target with a subsystem taken as it is), then
        the referrals, breadth-first. ``remembered``: the ports the record found by
        referral, walked too where the seeds cannot tell of them: in an attach pass that
        does not rediscover (``always``), or once a seed cannot be read."""
        seeds = [FabricsAddress.from_config(t) for t in self.pool.targets if not t.subsystem]
        self.seen.update(seeds)
        for t in self.pool.targets:
            address = FabricsAddress.from_config(t)
            if t.subsystem:
                self.found.append(SubsystemPath(t.subsystem, address))
            elif address not in self.answered and address not in self.failed:
                self.read(address, 0)
        for a in remembered if always or self.failed else ():
            if a not in self.seen:
                self.seen.add(a)
                self.referred.append(a)
                self.queue.append((a, 1))
        while self.queue:
            address, depth = self.queue.popleft()
            self.read(address, depth)


def _discover(ctx: StageContext, pool: InitiatorPool, hostnqn: str, hostid: str | None,
              known: list[SubsystemPath] | None, old: PoolAttachment | None) -> Discovered:
    """The pool's subsystems, each at the target it was configured or discovered at,
    and what stands for the ports that could not be read."""
    walk = _Walk(ctx, pool, hostnqn, hostid, known or [])
    follow = pool.referrals == "follow"
    walk.run(list(old.discovery) if old is not None and follow else [],
             always=known is not None)
    if walk.failed and not walk.answered:
        raise next(iter(walk.failed.values()))  # no port answers: the pool fails
    unread = set(walk.failed) | set(walk.cut)
    referred = list(walk.referred)
    if old is not None and follow and unread:
        # The walk is partial: the ports the last one found by referral that this one
        # did not reach may still be in the mesh (referred to by a port not read now).
        for a in old.discovery:
            if a not in walk.seen:
                unread.add(a)
                referred.append(a)
    have = set(walk.found)
    carried = [s for s in (old.subsystems if old is not None else [])
               if s.address in unread and s not in have]
    carried = list(dict.fromkeys(carried))
    for address, exc in walk.failed.items():
        _warn(ctx, pool, f"the discovery log at {address.describe()} cannot be read "
              f"({exc.message}): {_kept(carried, address)}")
    if walk.cut:
        kept = [_kept(carried, a) for a in walk.cut if any(s.address == a for s in carried)]
        _warn(ctx, pool, f"discovery stopped at its bounds ({MAX_REFERRAL_DEPTH} referrals "
              f"deep, {MAX_DISCOVERY_PORTS} ports per pool): "
              f"{', '.join(a.describe() for a in walk.cut)} not read"
              + "".join(f"; {k}" for k in kept))
    for address in sorted(unread - set(walk.failed) - set(walk.cut),
                          key=lambda a: a.describe()):
        if any(s.address == address for s in carried):
            _warn(ctx, pool, f"{address.describe()}, found by referral before, is not "
                  f"reached now: {_kept(carried, address)}")
    reached = {s.subsysnqn for s in walk.found}
    if pool.layout == "striped" and any(s.subsysnqn not in reached for s in carried):
        first = next(iter(walk.failed.values()), None)
        away = sorted({s.address.describe() for s in carried if s.subsysnqn not in reached})
        raise KvagentError(
            f"pool {pool.name} is striped over every namespace and some storage hosts are "
            f"not reached ({', '.join(away)})"
            + (f": {first.message}" if first is not None else ""),
            "kvagent attaches it once every storage host answers; the striped volume "
            "stays as it is meanwhile")
    if not walk.offered and not unread and walk.answered:
        ports = ", ".join(a.describe() for a in walk.answered)
        raise KvagentError(
            f"the storage host at {ports} offers no subsystem of pool {pool.name!r} to "
            f"this host ({hostnqn})" if len(walk.answered) == 1 else
            f"none of the storage hosts at {ports} offers a subsystem of pool "
            f"{pool.name!r} to this host ({hostnqn})",
            f"list this host (name {ctx.cfg.node.name}, NQN {hostnqn}) in the pool's "
            "hosts on the storage host and apply there; check node.nqn_prefix matches")
    if not walk.found and not carried and unread:
        if walk.failed:
            raise next(iter(walk.failed.values()))  # nothing to attach: what was not read
        raise KvagentError(
            f"no subsystem of pool {pool.name!r} found before discovery stopped at its "
            f"bounds ({MAX_REFERRAL_DEPTH} referrals deep, {MAX_DISCOVERY_PORTS} ports)",
            "give the pool a seed nearer the storage hosts that offer it (targets)")
    return Discovered(list(dict.fromkeys(walk.found)), carried, frozenset(unread),
                      list(dict.fromkeys(referred)))


def _kept(carried: list[SubsystemPath], address: FabricsAddress) -> str:
    """What a warning says of the subsystems recorded at a port not read."""
    here = [s.subsysnqn for s in carried if s.address == address]
    if not here:
        return "nothing of the pool is recorded there"
    return (f"{', '.join(here)} kept as attached (nothing there is disconnected or "
            "unmounted) until it answers")


def _warn(ctx: StageContext, pool: InitiatorPool, message: str) -> None:
    log.warning(message, pool=pool.name)
    ctx.result.warn("initiator", pool.name, message)


def _read_log(ctx: StageContext, pool: InitiatorPool, address: FabricsAddress,
              hostnqn: str, hostid: str | None) -> list[DiscoveryEntry]:
    """The discovery log at ``address`` as this host: through a live discovery
    controller of this host NQN there, else a one-shot read (over TLS for a TLS pool)."""
    if pool.tls is not None:
        ensure_psk(ctx, pool, hostnqn, DISCOVERY_NQN)
    return ctx.cli.discover(address.transport, address.traddr or "", address.trsvcid or "",
                            hostnqn=hostnqn, hostid=hostid, tls=pool.tls is not None,
                            device=None if pool.tls is not None else
                            _discovery_controller(ctx, address, hostnqn))


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

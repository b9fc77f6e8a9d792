"""Idempotent NVMe-oF connect and targeted disconnect, plus the discovery helper.

A controller is "ours already" when its address is the target's
(:meth:`agent.fabrics.FabricsAddress.same_endpoint`: transport, target address and
service, normalised: ``::1`` == ``0:0::1``; the host interface and address where the
pool chooses them; never ``src_addr``, the local address the kernel picked) and subsystem
NQN and host NQN match, and its state is usable (live, connecting, resetting). Then
nothing is run. Otherwise a connect request is written to ``/dev/nvme-fabrics`` (a
command: :meth:`NvmeCli.add_controller`); transient failures are retried with tenacity
(bounded, logged), permanent ones raise at once with the kernel's reason.

A matching controller that is not as the target wants it is replaced, make before break,
as one bounded step (:func:`replace_controller`): its TLS state is part of what is
wanted (a plaintext controller for a pool that wants TLS, or the reverse), and so are its
DH-HMAC-CHAP secrets when both changed at once.

The kernel refuses a connect (EALREADY) when this host identity has a controller to the
subsystem at that address (host side included) that is not being deleted: sysfs is then
read again (it may have appeared meanwhile), else the connect is retried. Another host
identity's controller is no obstacle (nvme-cli 2.3 refused that one too, which is one
reason kvagent no longer runs ``nvme connect``).

On the 6.1 kernel, connecting with a host NQN that is already in use but a
different host ID overwrites the ID the live controllers show in sysfs
(observed in fixtures/sysfs-6.1/): always connect with this host's one hostid.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from .. import progress
from ..errors import KvagentError
from ..fabrics import FabricsAddress
from ..log import get_logger
from ..naming import parse_subsystem_nqn
from .nvme.cli import NvmeCli
from .nvme.discovery import DiscoveryEntry
from .nvme.failures import (
    AlreadyConnected,
    ConnectError,
    TransientConnectError,
)
from .nvme.options import FabricsOptions
from .sysfs import Controller, Sysfs

log = get_logger("initiator.connect")

#: The most one controller replacement may take, all of it (:func:`replace_controller`):
#: the new controller's /dev/nvme-fabrics write, its wait to be live with paths, the old
#: one's disconnect. Well below the unit's stop budget (TimeoutStopSec=45s), and SIGTERM
#: ends it sooner still: the write is a command the runner kills, the wait polls the stop
#: flag.
REPLACE_BOUND = 30.0
#: Of which the new controller's write may take (a target that does not answer: the
#: kernel's own connect goes on longer, in the killed command).
REPLACE_CONNECT = 15.0
#: Kept for the old controller's disconnect at the end.
REPLACE_DISCONNECT = 5.0


@dataclass(frozen=True)
class Target:
    """Where to connect (the address, with the host side the pool chooses), which
    subsystem, as whom (host NQN and ID) and with which options."""

    address: FabricsAddress
    subsysnqn: str
    hostnqn: str
    hostid: str | None = None
    options: FabricsOptions = field(default_factory=FabricsOptions)

    def matches(self, ctrl: Controller) -> bool:
        """Whether ``ctrl`` is a controller for this target and host (any state)."""
        return self.same_port(ctrl) and ctrl.hostnqn == self.hostnqn

    def same_port(self, ctrl: Controller) -> bool:
        """Same subsystem and endpoint (host NQN not compared)."""
        return ctrl.subsysnqn == self.subsysnqn and self.address.same_endpoint(ctrl.address)

    def tls_differs(self, ctrl: Controller) -> bool:
        """Whether ``ctrl`` (one of this target's) is known to be connected with TLS while
        this target wants none, or the reverse (a TCP controller whose state sysfs cannot
        tell is not)."""
        return (ctrl.address.transport == "tcp" and ctrl.tls is not None
                and ctrl.tls != self.options.tls)


@dataclass(frozen=True)
class ConnectResult:
    """The controllers serving a target after :func:`connect`; ``changed`` if we made one."""

    controllers: tuple[Controller, ...]
    changed: bool
    #: what was not done to controllers that stay as they were (e.g. a rotation of both
    #: DH-HMAC-CHAP secrets this host cannot do safely): the caller reports them
    refused: tuple[KvagentError, ...] = ()
    #: controllers replaced by new ones (TLS added or removed, both secrets rotated)
    replaced: tuple[Replacement, ...] = ()


@dataclass(frozen=True)
class Reason:
    """Why a controller is replaced rather than kept (:func:`replacement_reason`)."""

    #: the action kind plan/apply report (``nvme.tls``, ``nvme.auth``)
    kind: str
    #: what is wrong with the controller, as logs and errors say it
    what: str
    #: what the new controller brings, as plan/apply report it
    brings: str
    #: the hint when it cannot be replaced (no native multipath)
    no_multipath_hint: str


TLS_ADDED = Reason(
    "nvme.tls", "plaintext controller, the pool wants TLS", "a new controller with TLS",
    "set nvme_core.multipath=Y, or remove the pool from the config, apply, and add it "
    "back (it then connects with TLS)")
TLS_REMOVED = Reason(
    "nvme.tls", "TLS controller, the pool no longer wants TLS",
    "a new controller without TLS",
    "set nvme_core.multipath=Y, or remove the pool from the config, apply, and add it "
    "back (it then connects without TLS)")
BOTH_SECRETS = Reason(
    "nvme.auth", "both DH-HMAC-CHAP secrets changed at once", "a new controller with them",
    "rotate one secret at a time (giving a live controller one new secret and one old can "
    "hang its re-authentication on 6.12), or set nvme_core.multipath=Y")


@dataclass(frozen=True)
class Replacement:
    """A controller replaced by a new one (what plan/apply report)."""

    reason: Reason
    old: str
    new: str
    #: ``old`` (not live) was disconnected before ``new`` connected (break before make)
    broke_first: bool = False

    def describe(self) -> str:
        """``plaintext controller, …: nvme5 connected (a new controller with TLS), nvme2
        disconnected``."""
        if self.broke_first:
            return (f"{self.reason.what}: {self.old} (not live) disconnected, then "
                    f"{self.new} connected ({self.reason.brings})")
        return (f"{self.reason.what}: {self.new} connected ({self.reason.brings}), "
                f"{self.old} disconnected")


def find_controllers(target: Target, sysfs: Sysfs, *, usable_only: bool = True,
                     relist: bool = True) -> list[Controller]:
    """Existing controllers for ``target`` (by default only usable ones), each read live;
    when none is found among the controllers that showed its subsystem before, every
    controller's subsystem is read again (``relist``). Before a connect that is not
    needed: the kernel refuses a second controller of this host identity (EALREADY)."""
    def pick(fresh: bool) -> list[Controller]:
        return [c for c in sysfs.controllers(target.subsysnqn, fresh=fresh)
                if target.matches(c) and (c.usable or not usable_only)]

    return pick(False) or (pick(True) if relist else [])


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning("connect failed, retrying", attempt=state.attempt_number,
                error=str(exc), wait=round(state.next_action.sleep, 2) if state.next_action
                else None)


def connect(target: Target, *, cli: NvmeCli, sysfs: Sysfs, attempts: int = 5,
            wait_initial: float = 1.0, wait_max: float = 10.0,
            sleep: Callable[[float], None] = time.sleep,
            settle: float = 5.0, replace_bound: float = REPLACE_BOUND,
            clock: Callable[[], float] = time.monotonic) -> ConnectResult:
    """Connect ``target`` unless a matching usable controller exists; return its controllers.

    Transient failures are retried up to ``attempts`` times (exponential wait
    from ``wait_initial`` to ``wait_max`` seconds); permanent ones raise
    :class:`~agent.initiator.nvme.failures.PermanentConnectError` at once.
    ``settle`` bounds how long to wait for a just-connected controller to show
    up in sysfs; ``replace_bound`` how long replacing an existing controller may take, all
    of it (:func:`refresh_controllers`: TLS added or removed, both DH-HMAC-CHAP secrets
    rotated).
    """
    existing = find_controllers(target, sysfs, relist=False)
    if existing:
        log.debug("already connected", subsysnqn=target.subsysnqn,
                  controllers=[c.name for c in existing])
        return refresh_controllers(target, existing, sysfs, cli=cli, bound=replace_bound,
                                   sleep=sleep, clock=clock)

    made: list[bool] = []

    def attempt() -> tuple[Controller, ...]:
        current = find_controllers(target, sysfs, relist=False)
        if current:
            return tuple(current)
        try:
            # Through /dev/nvme-fabrics, not nvme connect (see NvmeCli.add_controller): the
            # kernel refuses (EALREADY) when this host identity has a controller there;
            # another host NQN's is no obstacle.
            addr = target.address
            name = cli.add_controller(addr.transport, addr.traddr or "", addr.trsvcid or "",
                                      target.subsysnqn, hostnqn=target.hostnqn,
                                      hostid=target.hostid, host_iface=addr.host_iface,
                                      host_traddr=addr.host_traddr, options=target.options,
                                      duplicate=False)
        except AlreadyConnected as exc:
            current = find_controllers(target, sysfs)
            if current:
                return tuple(current)  # it was there after all (or appeared meanwhile)
            # What the kernel saw is going away (deleting) or came and went: retry.
            raise TransientConnectError(str(exc), "a controller for this target is changing "
                                        "state; retrying") from None
        made.append(True)
        return _settled(target, sysfs, name, settle, sleep)

    retrying = Retrying(
        retry=retry_if_exception_type(TransientConnectError),
        stop=stop_after_attempt(max(1, attempts)),
        wait=wait_exponential(multiplier=wait_initial, max=wait_max),
        sleep=sleep, before_sleep=_log_retry, reraise=True,
    )
    controllers = retrying(attempt)
    log.info("connected" if made else "already connected", subsysnqn=target.subsysnqn,
             traddr=target.address.traddr, trsvcid=target.address.trsvcid,
             controllers=[c.name for c in controllers])
    return ConnectResult(controllers, changed=bool(made))


def refresh_controllers(target: Target, controllers: list[Controller], sysfs: Sysfs, *,
                        cli: NvmeCli, bound: float = REPLACE_BOUND,
                        sleep: Callable[[float], None] = time.sleep,
                        clock: Callable[[], float] = time.monotonic) -> ConnectResult:
    """Bring the target's live controllers to what it wants; the result holds its
    controllers afterwards.

    TLS: a controller whose TLS state is not the target's (a plaintext one for a pool that
    now wants TLS, or the reverse) is not "ours as wanted": it is replaced
    (:func:`replace_controller`), whatever else matches. The kernel cannot add or drop TLS
    on a controller, and once the storage host's port requires TLS a plaintext controller
    retries for ever.

    DH-HMAC-CHAP: one secret changed is written to the controller's attribute, and the
    kernel re-authenticates the live controller at once (no disconnect; live throughout in
    the kernel tier). Both changed: every write starts a re-authentication, and the first
    one pairs a new secret with an old one. It fails, the target drops the connection, and
    on 6.12 a drop during the host's re-authentication can hang the controller's error
    recovery, its re-authentication and any later secret write for good (seen in the
    kernel tier with either order, back to back). So a controller is never given both: it
    is replaced. (Removing a secret needs a reconnect: the kernel keeps the one it has.)

    A replacement that cannot be done safely leaves the controller as it is, with the
    refusal in ``refused``; one that is done is in ``replaced``.
    """
    result: dict[str, Controller] = {}
    refused: list[KvagentError] = []
    replaced: list[Replacement] = []
    changed = False
    for ctrl in controllers:
        if ctrl.name in result:
            continue  # a replacement of an earlier one in this list
        reason = replacement_reason(target, ctrl, sysfs)
        if reason is None:
            stale = stale_secrets(target, ctrl, sysfs)
            if stale:
                sysfs.set_controller_secrets(ctrl.name, stale)
                log.info("new DH-HMAC-CHAP secret given: re-authenticating",
                         controller=ctrl.name, subsysnqn=target.subsysnqn,
                         attributes=[stale[0][0]])
                changed = True
            result[ctrl.name] = ctrl
            continue
        try:
            new, broke = replace_controller(target, ctrl, reason, sysfs, cli=cli,
                                            bound=bound, sleep=sleep, clock=clock)
        except KvagentError as exc:
            refused.append(exc)
            if sysfs.controller(ctrl.name) is not None:  # (one that was not live may be gone)
                result[ctrl.name] = ctrl
            continue
        replaced.append(Replacement(reason, ctrl.name, new.name, broke))
        result[new.name] = new
        changed = True
    return ConnectResult(tuple(result.values()), changed=changed, refused=tuple(refused),
                         replaced=tuple(replaced))


def stale_secrets(target: Target, ctrl: Controller, sysfs: Sysfs) -> list[tuple[str, str]]:
    """The target's DH-HMAC-CHAP secrets that ``ctrl`` does not have yet, as
    ``(attribute, secret)``: the host secret first."""
    opts = target.options
    wanted = (("dhchap_secret", opts.dhchap_secret),
              ("dhchap_ctrl_secret", opts.dhchap_ctrl_secret))
    return [(attr, secret) for attr, secret in wanted
            if secret is not None and sysfs.controller_secret(ctrl.name, attr) != secret]


def replacement_reason(target: Target, ctrl: Controller, sysfs: Sysfs) -> Reason | None:
    """Why ``ctrl`` must be replaced by a new controller for ``target`` (None: it need not
    be): its TLS state is not the target's, or both of its DH-HMAC-CHAP secrets are stale."""
    if target.tls_differs(ctrl):
        return TLS_ADDED if target.options.tls else TLS_REMOVED
    if len(stale_secrets(target, ctrl, sysfs)) > 1:
        return BOTH_SECRETS
    return None


def replace_controller(target: Target, old: Controller, reason: Reason, sysfs: Sysfs, *,
                       cli: NvmeCli, bound: float = REPLACE_BOUND,
                       sleep: Callable[[float], None] = time.sleep,
                       clock: Callable[[], float] = time.monotonic
                       ) -> tuple[Controller, bool]:
    """A controller for ``target`` as it wants it (its TLS state, its secrets), live with a
    path to every namespace ``old`` has, then ``old`` disconnected: the namespaces'
    multipath heads, and what is mounted on them, stay (make before break). Returns the
    new controller, and whether ``old`` had to go first (:func:`_break_then_make`).

    One bounded step of at most ``bound`` seconds in all (:data:`REPLACE_BOUND`), which
    SIGTERM ends at once: the new controller's ``/dev/nvme-fabrics`` write is a command
    (killed on stop or past its time), the path wait polls the stop flag. A new controller
    that an earlier, interrupted replacement left (or that the kernel finished after it) is
    used instead of adding another, so the next pass finishes what a stop cut short.
    Raises (with ``old`` untouched where it was live, and a new controller that did not get
    its paths disconnected again) where the replacement cannot be done safely."""
    what = f"{old.name} ({target.subsysnqn}): {reason.what}"
    deadline = clock() + bound
    with progress.step(f"replacing controller {old.name} ({reason.kind})", bound):
        heads = sysfs.subsystem_namespaces(target.subsysnqn)
        mine = {nsid for nsid, head in heads.items()
                if any(p.controller == old.name for p in head.paths)}
        multipath = not any(heads[nsid].subsystem is None for nsid in mine)
        name = _wanted_controller(target, old, sysfs)
        if name is None and multipath:
            try:
                name = _add_controller(target, cli=cli,
                                       timeout=deadline - clock() - REPLACE_DISCONNECT)
            except _NotAdded as exc:
                if exc.errno_name != "EINVAL" or _is_live(old, sysfs):
                    raise KvagentError(f"{what}; a new controller could not connect, so "
                                       f"{old.name} stays as it is: {exc.message}",
                                       exc.hint) from None
        broke = name is None
        if broke:
            if _is_live(old, sysfs):
                raise KvagentError(
                    f"{what}; this host has no native NVMe multipath, so a second "
                    f"controller cannot take over its namespaces: {old.name} stays as it is",
                    reason.no_multipath_hint)
            name = _break_then_make(target, old, what, cli=cli,
                                    timeout=deadline - clock() - REPLACE_DISCONNECT)
        wait = max(0.0, deadline - clock() - REPLACE_DISCONNECT)
        new = _live_with_paths(target, sysfs, name, mine, wait, sleep, clock)
        if new is None:
            cli.disconnect(device=name, timeout=REPLACE_DISCONNECT)
            left = (f"{old.name} was disconnected before it (it was not live)" if broke
                    else f"{old.name} stays as it is")
            raise KvagentError(
                f"{what}; its new controller ({name}) was not live with a path to each of "
                f"its namespaces within {bound:g}s of the replacement's start, so it was "
                f"disconnected again and {left}", "the next pass tries again; see dmesg")
        if not broke:
            cli.disconnect(device=old.name, timeout=REPLACE_DISCONNECT)
    log.info("controller replaced: a new controller connected as wanted, the old one "
             "disconnected", old=old.name, new=new.name, subsysnqn=target.subsysnqn,
             reason=reason.what, order="break before make" if broke else
             "make before break (multipath moved the I/O over)")
    return new, broke


class _NotAdded(KvagentError):
    """A new controller could not connect; ``errno_name``: the kernel's errno."""

    def __init__(self, exc: ConnectError):
        super().__init__(exc.message, exc.hint)
        self.errno_name = exc.errno_name


def _is_live(ctrl: Controller, sysfs: Sysfs) -> bool:
    """Whether ``ctrl`` is live now (read again)."""
    current = sysfs.controller(ctrl.name)
    return current is not None and current.state == "live"


def _wanted_controller(target: Target, old: Controller, sysfs: Sysfs) -> str | None:
    """A usable controller for ``target`` other than ``old`` that is as the target wants
    it (TLS state and secrets): one an interrupted replacement left behind."""
    for ctrl in find_controllers(target, sysfs):
        if ctrl.name != old.name and ctrl.tls is target.options.tls \
                and not stale_secrets(target, ctrl, sysfs):
            log.info("a controller an earlier replacement made is there: using it",
                     old=old.name, new=ctrl.name, subsysnqn=target.subsysnqn)
            return ctrl.name
    return None


def _add_controller(target: Target, *, cli: NvmeCli, timeout: float) -> str:
    """A further controller for ``target`` with its options (TLS, secrets) through
    ``/dev/nvme-fabrics``, its write limited to ``timeout`` seconds (at most
    :data:`REPLACE_CONNECT`); :class:`_NotAdded` when it does not connect."""
    addr = target.address
    try:
        return cli.add_controller(addr.transport, addr.traddr or "", addr.trsvcid or "",
                                  target.subsysnqn, hostnqn=target.hostnqn,
                                  hostid=target.hostid, host_iface=addr.host_iface,
                                  host_traddr=addr.host_traddr, options=target.options,
                                  timeout=max(1.0, min(REPLACE_CONNECT, timeout)))
    except ConnectError as exc:
        raise _NotAdded(exc) from None


def _break_then_make(target: Target, old: Controller, what: str, *, cli: NvmeCli,
                     timeout: float) -> str:
    """Disconnect ``old``, then connect the new controller: for an ``old`` that is not live
    and cannot have a second controller next to it. Either the kernel refused the second
    one (EINVAL: the storage host gave it ``old``'s controller id, which it only does once
    ``old``'s session there is gone for good: its port was re-created for TLS, or refuses
    ``old``'s secrets), or the host has no native multipath. Nothing flows through ``old``
    meanwhile; what was queued on it fails, and a filesystem that shuts down for it is
    mounted again by the pass (as after an outage)."""
    log.warning("controller not live, and no second controller can join it: disconnecting "
                "it first", controller=old.name, subsysnqn=target.subsysnqn)
    cli.disconnect(device=old.name, timeout=REPLACE_DISCONNECT)
    try:
        return _add_controller(target, cli=cli, timeout=timeout)
    except _NotAdded as exc:
        raise KvagentError(f"{what}; {old.name} was not live and was disconnected, and "
                           f"the new controller could not connect: {exc.message}",
                           exc.hint or "the next pass connects again") from None


def _live_with_paths(target: Target, sysfs: Sysfs, name: str, nsids: set[int],
                     wait: float, sleep: Callable[[float], None],
                     clock: Callable[[], float]) -> Controller | None:
    """Controller ``name`` of ``target`` once it is live with a path to each of ``nsids``;
    None if it is not within ``wait`` seconds. Looks at the stop flag every round
    (:class:`~agent.progress.Stopping` once SIGTERM came)."""
    deadline = clock() + wait
    while True:
        progress.checkpoint()
        sysfs.learn(name)
        ctrl = next((c for c in find_controllers(target, sysfs) if c.name == name), None)
        if ctrl is not None and ctrl.state == "live":
            heads = sysfs.subsystem_namespaces(target.subsysnqn)
            if all(any(p.controller == name for p in heads[n].paths)
                   for n in nsids if n in heads) and nsids <= heads.keys():
                return ctrl
        if clock() >= deadline:
            return None
        sleep(0.1)


def _settled(target: Target, sysfs: Sysfs, name: str | None, settle: float,
             sleep: Callable[[float], None]) -> tuple[Controller, ...]:
    """The target's controllers once the new one is visible in sysfs."""
    deadline = time.monotonic() + settle
    while True:
        if name is not None:
            sysfs.learn(name)
        found = find_controllers(target, sysfs, usable_only=False)
        if found and (name is None or any(c.name == name for c in found)):
            return tuple(found)
        if time.monotonic() >= deadline:
            if found:
                return tuple(found)
            raise KvagentError(
                f"the connect reported {name or 'success'} but no controller for "
                f"{target.subsysnqn} at {target.address.traddr}:{target.address.trsvcid} "
                "appeared in sysfs",
                "check dmesg; the controller may have been deleted right away")
        sleep(0.1)


def disconnect_controllers(subsysnqn: str, hostnqn: str, *, cli: NvmeCli, sysfs: Sysfs,
                           wait: float = 10.0,
                           sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Disconnect only the fabrics controllers of ``subsysnqn`` held by ``hostnqn``.

    Returns the controller names disconnected (empty: nothing to do). Other host
    identities' controllers to the same subsystem are left alone (``nvme disconnect
    -n`` would take them all, so each controller is disconnected by name).
    """
    mine = [c for c in sysfs.controllers(subsysnqn, fresh=True)
            if c.is_fabrics and c.subsysnqn == subsysnqn and c.hostnqn == hostnqn]
    for ctrl in mine:
        cli.disconnect(device=ctrl.name)
    deadline = time.monotonic() + wait
    names = {c.name for c in mine}
    while names:
        still = [n for n in names if (c := sysfs.controller(n)) is not None
                 and c.subsysnqn == subsysnqn and c.hostnqn == hostnqn]
        if not still:
            break
        if time.monotonic() >= deadline:
            raise KvagentError(f"controllers {', '.join(sorted(still))} of {subsysnqn} are "
                               f"still there {wait:g}s after nvme disconnect",
                               "check dmesg; a mount or process may hold the device")
        sleep(0.1)
    if mine:
        log.info("disconnected", subsysnqn=subsysnqn, controllers=sorted(c.name for c in mine))
    return sorted(c.name for c in mine)


def pool_entries(entries: Iterable[DiscoveryEntry], nqn_prefix: str, pool: str, *,
                 host: str | None = None, node: str | None = None) -> list[DiscoveryEntry]:
    """Discovery-log entries of kvagent subsystems serving ``pool``.

    kvagent NQNs are ``<prefix>:<node>:<pool>:<host>`` (per host) or
    ``<prefix>:<node>:<pool>`` (shared). The log already shows only what this
    host may access; ``host`` (this host's short name) additionally drops
    per-host subsystems of other hosts, ``node`` keeps one storage host's.
    Duplicates (the same subsystem and port listed twice) are dropped.
    """
    out: list[DiscoveryEntry] = []
    seen: set[tuple[FabricsAddress, str]] = set()
    for entry in entries:
        if not entry.is_nvm_subsystem:
            continue
        parsed = parse_subsystem_nqn(nqn_prefix, entry.subnqn)
        if parsed is None:
            continue
        e_node, e_pool, e_host = parsed
        if e_pool != pool or (node is not None and e_node != node):
            continue
        if host is not None and e_host is not None and e_host != host:
            continue
        key = (entry.address, entry.subnqn)
        if key in seen:
            continue
        seen.add(key)
        out.append(entry)
    return out

"""Idempotent NVMe-oF connect and targeted disconnect, plus the discovery helper.

A controller is "ours already" when its address is the target's
(:meth:`agent.fabrics.FabricsAddress.same_endpoint`: transport, target address and
service, normalised: ``::1`` == ``0:0::1``; the host interface and address where the
pool chooses them; never ``src_addr``, the local address the kernel picked) and subsystem
NQN and host NQN match, and its state is usable (live, connecting, resetting). Then
nothing is run. Otherwise ``nvme connect``
runs; transient failures are retried with tenacity (bounded, logged),
permanent ones raise at once with the kernel's reason.

nvme-cli 2.3 quirks handled here (fixtures/nvme-2.3/):
- a connect to an already-connected subsystem exits 1 ("already connected"),
  so after a failure sysfs is checked again;
- its "already connected" check ignores the host NQN, and ``--duplicate-connect``
  does not get past it either: while one host identity holds a subsystem and
  port, another cannot connect there. kvagent passes ``--duplicate-connect``
  when sysfs shows only other identities there (later nvme-cli releases honour
  it) and otherwise reports a permanent error naming the holder.

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

from ..errors import KvagentError
from ..fabrics import FabricsAddress
from ..log import get_logger
from ..naming import parse_subsystem_nqn
from .nvmecli import (
    AlreadyConnected,
    ConnectError,
    DiscoveryEntry,
    FabricsOptions,
    NvmeCli,
    PermanentConnectError,
    TransientConnectError,
)
from .sysfs import Controller, Sysfs

log = get_logger("initiator.connect")


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


@dataclass(frozen=True)
class ConnectResult:
    """The controllers serving a target after :func:`connect`; ``changed`` if we made one."""

    controllers: tuple[Controller, ...]
    changed: bool
    #: what was not done to controllers that stay as they were (e.g. a rotation of both
    #: DH-HMAC-CHAP secrets this host cannot do safely): the caller reports them
    refused: tuple[KvagentError, ...] = ()


def find_controllers(target: Target, sysfs: Sysfs, *, usable_only: bool = True
                     ) -> list[Controller]:
    """Existing controllers for ``target`` (by default only usable ones), each read live;
    when none is found among the controllers that showed its subsystem before, every
    controller's subsystem is read again."""
    def pick(fresh: bool) -> list[Controller]:
        return [c for c in sysfs.controllers(target.subsysnqn, fresh=fresh)
                if target.matches(c) and (c.usable or not usable_only)]

    return pick(False) or pick(True)


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning("connect failed, retrying", attempt=state.attempt_number,
                error=str(exc), wait=round(state.next_action.sleep, 2) if state.next_action
                else None)


def connect(target: Target, *, cli: NvmeCli, sysfs: Sysfs, attempts: int = 5,
            wait_initial: float = 1.0, wait_max: float = 10.0,
            sleep: Callable[[float], None] = time.sleep,
            settle: float = 5.0, path_wait: float = 30.0) -> ConnectResult:
    """Connect ``target`` unless a matching usable controller exists; return its controllers.

    Transient failures are retried up to ``attempts`` times (exponential wait
    from ``wait_initial`` to ``wait_max`` seconds); permanent ones raise
    :class:`~agent.initiator.nvmecli.PermanentConnectError` at once.
    ``settle`` bounds how long to wait for a just-connected controller to show
    up in sysfs; ``path_wait`` how long a controller that replaces one (a rotation of
    both DH-HMAC-CHAP secrets, :func:`refresh_secrets`) may take to be live with paths.
    """
    existing = find_controllers(target, sysfs)
    if existing:
        log.debug("already connected", subsysnqn=target.subsysnqn,
                  controllers=[c.name for c in existing])
        return refresh_secrets(target, existing, sysfs, cli=cli, path_wait=path_wait,
                               sleep=sleep)

    made: list[bool] = []

    def attempt() -> tuple[Controller, ...]:
        current = find_controllers(target, sysfs)
        if current:
            return tuple(current)
        others = _other_hosts(target, sysfs)
        try:
            addr = target.address
            name = cli.connect(addr.transport, addr.traddr or "", addr.trsvcid or "",
                               target.subsysnqn, hostnqn=target.hostnqn, hostid=target.hostid,
                               host_iface=addr.host_iface, host_traddr=addr.host_traddr,
                               options=target.options, duplicate=bool(others))
        except AlreadyConnected as exc:
            current = find_controllers(target, sysfs)
            if current:
                return tuple(current)  # it was there after all (or appeared meanwhile)
            others = _other_hosts(target, sysfs)
            if others:
                raise _held_by_other_host(target, others, exc) from None
            # What nvme-cli saw is going away (deleting) or came and went: retry.
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


def refresh_secrets(target: Target, controllers: list[Controller], sysfs: Sysfs, *,
                    cli: NvmeCli, path_wait: float = 30.0,
                    sleep: Callable[[float], None] = time.sleep) -> ConnectResult:
    """Give live controllers the target's DH-HMAC-CHAP secrets where theirs differ (a
    rotation); the result holds the target's controllers afterwards.

    One secret changed: it is written to the controller's attribute, and the kernel
    re-authenticates the live controller at once (no disconnect; live throughout in the
    kernel tier). Both changed: every write starts a re-authentication, and the first one
    pairs a new secret with an old one. It fails, the target drops the connection, and on
    6.12 a drop during the host's re-authentication can hang the controller's error
    recovery, its re-authentication and any later secret write for good (seen in the
    kernel tier with either order, back to back). So a controller is never given both:
    :func:`_replace_controller` connects a second controller with the new secrets and
    then disconnects the old one (make before break; native multipath moves the I/O).
    Where that cannot be done safely the controller is left as it is and the refusal is
    in ``refused``. (Removing a secret needs a reconnect: the kernel keeps the one it has.)
    """
    result: list[Controller] = []
    refused: list[KvagentError] = []
    changed = False
    for ctrl in controllers:
        stale = stale_secrets(target, ctrl, sysfs)
        if len(stale) == 1:
            sysfs.set_controller_secrets(ctrl.name, stale)
            log.info("new DH-HMAC-CHAP secret given: re-authenticating", controller=ctrl.name,
                     subsysnqn=target.subsysnqn, attributes=[stale[0][0]])
            changed = True
        elif stale:
            try:
                result.append(_replace_controller(target, ctrl, sysfs, cli=cli,
                                                  wait=path_wait, sleep=sleep))
                changed = True
                continue
            except KvagentError as exc:
                refused.append(exc)
        result.append(ctrl)
    return ConnectResult(tuple(result), changed=changed, refused=tuple(refused))


def stale_secrets(target: Target, ctrl: Controller, sysfs: Sysfs) -> list[tuple[str, str]]:
    """The target's DH-HMAC-CHAP secrets that ``ctrl`` does not have yet, as
    ``(attribute, secret)``: the host secret first."""
    opts = target.options
    wanted = (("dhchap_secret", opts.dhchap_secret),
              ("dhchap_ctrl_secret", opts.dhchap_ctrl_secret))
    return [(attr, secret) for attr, secret in wanted
            if secret is not None and sysfs.controller_secret(ctrl.name, attr) != secret]


def _replace_controller(target: Target, old: Controller, sysfs: Sysfs, *, cli: NvmeCli,
                        wait: float, sleep: Callable[[float], None]) -> Controller:
    """A new controller for ``target`` with its (new) secrets, live with a path to every
    namespace ``old`` has, then ``old`` disconnected: the namespaces' multipath heads, and
    what is mounted on them, stay. Raises (with ``old`` untouched, and any controller made
    here disconnected again) where that cannot be done safely."""
    what = (f"both DH-HMAC-CHAP secrets of {old.name} ({target.subsysnqn}) changed at once")
    unsafe = ("giving a live controller one new secret and one old can hang its "
              "re-authentication on 6.12")
    heads = sysfs.subsystem_namespaces(target.subsysnqn)
    mine = {nsid for nsid, head in heads.items()
            if any(p.controller == old.name for p in head.paths)}
    if any(heads[nsid].subsystem is None for nsid in mine):
        raise KvagentError(
            f"{what}; this host has no native NVMe multipath, so a second controller "
            f"cannot take over its namespaces: {old.name} keeps the old secrets",
            f"rotate one secret at a time ({unsafe}), or set nvme_core.multipath=Y")
    addr = target.address
    try:
        name = cli.add_controller(addr.transport, addr.traddr or "", addr.trsvcid or "",
                                  target.subsysnqn, hostnqn=target.hostnqn,
                                  hostid=target.hostid, host_iface=addr.host_iface,
                                  host_traddr=addr.host_traddr, options=target.options)
    except ConnectError as exc:
        raise KvagentError(f"{what}; a controller with the new secrets could not connect, "
                           f"so {old.name} keeps the old ones: {exc.message}",
                           exc.hint) from None
    new = _live_with_paths(target, sysfs, name, mine, wait, sleep)
    if new is None:
        if name:
            cli.disconnect(device=name)
        raise KvagentError(
            f"{what}; the controller connected with the new secrets ({name}) was not live "
            f"with a path to each of its namespaces within {wait:g}s, so it was "
            f"disconnected again and {old.name} keeps the old secrets",
            "the next pass tries again; see dmesg")
    cli.disconnect(device=old.name)
    log.info("both DH-HMAC-CHAP secrets changed: a new controller connected with them and "
             "the old one disconnected (multipath moved the I/O over)", old=old.name,
             new=new.name, subsysnqn=target.subsysnqn)
    return new


def _live_with_paths(target: Target, sysfs: Sysfs, name: str | None, nsids: set[int],
                     wait: float, sleep: Callable[[float], None]) -> Controller | None:
    """Controller ``name`` of ``target`` once it is live with a path to each of ``nsids``;
    None if it is not within ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        ctrl = next((c for c in find_controllers(target, sysfs) if c.name == name), None)
        if ctrl is not None and ctrl.state == "live":
            heads = sysfs.subsystem_namespaces(target.subsysnqn)
            if all(any(p.controller == name for p in heads[n].paths)
                   for n in nsids if n in heads) and nsids <= heads.keys():
                return ctrl
        if time.monotonic() >= deadline:
            return None
        sleep(0.1)


def _other_hosts(target: Target, sysfs: Sysfs) -> list[Controller]:
    """Usable controllers to the same subsystem and port held by other host NQNs."""
    return [c for c in sysfs.controllers(target.subsysnqn, fresh=True)
            if target.same_port(c) and c.usable and c.hostnqn != target.hostnqn]


def _held_by_other_host(target: Target, others: list[Controller],
                        exc: AlreadyConnected) -> PermanentConnectError:
    held = ", ".join(f"{c.name} (host NQN {c.hostnqn})" for c in others)
    return PermanentConnectError(
        f"cannot connect {target.subsysnqn} at {target.address.traddr}:"
        f"{target.address.trsvcid} as "
        f"{target.hostnqn}: nvme-cli reports it already connected because {held} holds that "
        "subsystem and port",
        "nvme-cli 2.3 refuses a second host identity on one subsystem and port even with "
        "--duplicate-connect; disconnect the other identity's controller first",
        result=exc.result, kernel=exc.kernel, errno_name="EALREADY")


def _settled(target: Target, sysfs: Sysfs, name: str | None, settle: float,
             sleep: Callable[[float], None]) -> tuple[Controller, ...]:
    """The target's controllers once the new one is visible in sysfs."""
    deadline = time.monotonic() + settle
    while True:
        found = find_controllers(target, sysfs, usable_only=False)
        if found and (name is None or any(c.name == name for c in found)):
            return tuple(found)
        if time.monotonic() >= deadline:
            if found:
                return tuple(found)
            raise KvagentError(
                f"nvme connect reported {name or 'success'} but no controller for "
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

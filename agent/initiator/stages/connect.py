"""Stage 2, connect: every path of a pool connected, idempotently.

Each path is recorded before it is connected (``PoolAttachment.subsystems``: a kill
right after the connect must not leave a controller a later detach cannot find); a
controller that is already the one wanted is kept, one that is not as wanted (TLS
state, DH-HMAC-CHAP secrets) is replaced (:mod:`agent.initiator.connect`). The pool's
controllers then get its timeouts (:mod:`agent.initiator.timeouts`: fail fast) and its
subsystems its multipath I/O policy. A path that fails is the pool's error when another
path reaches its subsystem, else the attach's. Planning stops at the first path not
connected yet.
"""

from __future__ import annotations

import dataclasses

from ...config.model import InitiatorPool
from ...dhchap import read_secret
from ...errors import KvagentError
from ...log import get_logger
from ...records import PoolAttachment, SubsystemPath
from ..connect import (
    ConnectResult,
    Target,
    connect,
    find_controllers,
    replacement_reason,
    stale_secrets,
)
from ..iopolicy import ensure_iopolicy
from ..nvme.failures import ConnectError
from ..nvme.options import FabricsOptions
from ..sysfs import Controller
from ..timeouts import Timeouts, drift, fix, unsupported
from .context import StageContext
from .tlskeys import ensure_psk

log = get_logger("initiator")
#: The controllers of each subsystem reached (by subsystem NQN).
Connected = dict[str, list[Controller]]


def with_secrets(options: FabricsOptions, pool: InitiatorPool) -> FabricsOptions:
    """``options`` with the DH-HMAC-CHAP secrets of ``pool.auth`` (read from their files
    on every pass: a rotated file is given to live controllers)."""
    if pool.auth is None:
        return options
    ctrl = pool.auth.ctrl_key_file
    return dataclasses.replace(
        options, dhchap_secret=read_secret(pool.auth.key_file).text,
        dhchap_ctrl_secret=read_secret(ctrl).text if ctrl else None)


def connect_pool(ctx: StageContext, pool: InitiatorPool, paths: list[SubsystemPath],
                 hostnqn: str, hostid: str | None, record: PoolAttachment) -> Connected | None:
    """Connect every path of the pool (each recorded first) and keep the controllers'
    timeouts and the pool's I/O policy: the controllers of each subsystem reached.
    A path that fails is the pool's error when another reaches its subsystem, else the
    attach's. Planning returns None at the first path not connected yet."""
    options = dataclasses.replace(
        with_secrets(FabricsOptions.from_config(pool.connect), pool),
        tls=pool.tls is not None)
    timeouts = Timeouts.from_options(options)
    connected: Connected = {}
    path_errors: list[tuple[str, ConnectError]] = []
    for a in paths:
        target = Target(a.address.with_host(pool.connect.host_iface,
                                            pool.connect.host_traddr),
                        a.subsysnqn, hostnqn, hostid, options)
        if ctx.dry_run and not find_controllers(target, ctx.sysfs):
            ctx.act(pool.name, "nvme.connect", a.subsysnqn, a.address.describe())
            ctx.act(pool.name, "attach", pool.mount,
                    "find namespaces, make xfs if blank, mount, probe, engines")
            return None
        if pool.tls is not None:
            ensure_psk(ctx, pool, hostnqn, a.subsysnqn)
        # Recorded before connecting: a kill right after the connect must not leave a
        # controller that a later detach cannot find.
        record.subsystems.append(a)
        ctx.checkpoint()
        try:
            res = (_planned_refresh(ctx, pool.name, target) if ctx.dry_run else
                   connect(target, cli=ctx.cli, sysfs=ctx.sysfs, sleep=ctx.seams.sleep,
                           clock=ctx.seams.clock))
        except ConnectError as exc:
            # Nothing connected on this path; another path to the same subsystem (target
            # address) may still work.
            record.subsystems.remove(a)
            path_errors.append((a.subsysnqn, exc))
            continue
        connected.setdefault(a.subsysnqn, []).extend(res.controllers)
        for refusal in res.refused:
            ctx.result.error("initiator", pool.name, refusal.message, refusal.hint)
        for r in res.replaced:
            ctx.act(pool.name, r.reason.kind, r.old, r.describe())
        if res.changed:
            ctx.act(pool.name, "nvme.connect", a.subsysnqn, a.address.describe())
        _keep_timeouts(ctx, pool, res.controllers, timeouts)
    for nqn, exc in path_errors:
        if nqn not in connected:
            raise exc
    for _, exc in path_errors:  # degraded: the subsystem is reached by another path
        ctx.result.error("initiator", pool.name, exc.message, exc.hint)
    if pool.iopolicy is not None:
        _iopolicy(ctx, pool, pool.iopolicy, list(connected))
    return connected


def _planned_refresh(ctx: StageContext, pool: str, target: Target) -> ConnectResult:
    """Planning: the target's controllers; each one to replace (TLS state, both
    DH-HMAC-CHAP secrets) and each new secret an action."""
    existing = find_controllers(target, ctx.sysfs)
    for ctrl in existing:
        reason = replacement_reason(target, ctrl, ctx.sysfs)
        if reason is not None:
            ctx.act(pool, reason.kind, ctrl.name, f"{reason.what}: {reason.brings}, "
                    "then this one disconnected")
        elif stale_secrets(target, ctrl, ctx.sysfs):
            ctx.act(pool, "nvme.auth", ctrl.name,
                    "new DH-HMAC-CHAP secret: re-authenticate")
    return ConnectResult(tuple(existing), changed=False)


def _iopolicy(ctx: StageContext, pool: InitiatorPool, policy: str, nqns: list[str]) -> None:
    """The pool's multipath I/O policy on each of its subsystems (sysfs: read, compare,
    write only when different); a refusal is the pool's error, and the attach goes on
    with the kernel's policy."""
    for nqn in nqns:
        try:
            changes = ensure_iopolicy(ctx.sysfs, pool.name, nqn, policy,
                                      dry_run=ctx.dry_run)
        except KvagentError as exc:
            ctx.result.error("initiator", pool.name, exc.message, exc.hint)
            continue
        for c in changes:
            ctx.act(pool.name, "iopolicy", c.subsystem, f"{c.old} -> {c.new}")


def _keep_timeouts(ctx: StageContext, pool: InitiatorPool,
                   controllers: tuple[Controller, ...], want: Timeouts) -> None:
    """Give the pool's controllers its timeouts where theirs differ (a new controller:
    fast_io_fail_tmo, which the connect request does not set; drift on an existing one)."""
    for ctrl in dict.fromkeys(controllers):
        drifts = drift(ctrl, want)
        missing = unsupported(drifts)
        for d in missing:
            ctx.result.warn("initiator", pool.name,
                            f"controller {ctrl.name} has no {d.attr} attribute (a kernel "
                            f"without it): {d.attr} {d.expected} is not in effect")
        drifts = [d for d in drifts if d not in missing]
        if not drifts:
            continue
        if not ctx.dry_run:
            fix(ctx.sysfs, drifts)
        for d in drifts:
            log.info("controller timeout set", pool=pool.name, controller=ctrl.name,
                     attribute=d.attr, old=d.current, new=d.expected)
        ctx.act(pool.name, "nvme.timeout", ctrl.name,
                ", ".join(d.describe() for d in drifts))

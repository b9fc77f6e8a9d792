"""One reconcile pass over every role of this host: what ``plan`` shows and ``apply`` does."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING

from . import progress
from .config import Config
from .errors import KvagentError
from .lock import LockHolder, apply_lock
from .log import get_logger
from .records import write_last_apply
from .result import RunResult
from .system.run import Runner, default_runner

if TYPE_CHECKING:
    from .initiator.stages.handoff import MountedPool

log = get_logger("reconcile")


def run_pass(cfg: Config, *, dry_run: bool, runner: Runner | None = None,
             wait_for_lock: bool = False, rebind: Iterable[str] = (),
             on_lock_wait: Callable[[LockHolder | None], None] | None = None,
             attach_only: Collection[str] | None = None,
             target_only: bool = False, rediscover: bool = True,
             wait_reconnects: bool = True) -> RunResult:
    """Plan (``dry_run``) or apply the config on this host; never raises for a failed action.

    ``rebind`` names target pools whose namespaces may move to other storage (with a
    new identity); see :class:`agent.target.reconcile.TargetPass`. An apply holds the
    apply lock (:func:`agent.lock.apply_lock`; ``on_lock_wait`` is called while
    ``wait_for_lock`` waits for it). ``attach_only``: an attach pass over those
    initiator pools (connect, find, format blank devices, mount, hand off), what
    ``kvagent run`` does on device events: nothing is detached or forgotten and the
    storage side is not touched; without ``rediscover``, a pool attached in full before
    is not asked again which subsystems it has (events that cannot bring a new one).
    ``target_only``: the storage side's pass alone, what
    ``kvagent run`` does when a collect sees its nvmet objects changed behind its back
    (the GPU side is not touched). Without ``wait_reconnects`` a pool whose controllers
    are all reconnecting fails at once instead of waiting ``initiator.device_wait`` for
    one (the agent: the kernel reconnects by itself, and a pass waiting on it held up
    every other pool, collect and heal).
    """
    from .engines.handoff import forget, leftover_pools
    from .initiator.reconcile import InitiatorPass
    from .target.reconcile import TargetPass

    runner = runner or default_runner()
    result = RunResult(dry_run=dry_run)

    def passes() -> None:
        if target_only:
            TargetPass(cfg, runner, result, dry_run=dry_run, rebind=rebind).run()
            return
        if attach_only is not None:
            initiator = InitiatorPass(cfg, runner, result, dry_run=dry_run,
                                      rediscover=rediscover, wait_reconnects=wait_reconnects)
            pools = [p for p in (cfg.initiator.pools if cfg.initiator else ())
                     if p.name in attach_only]
            hand_off_pools(cfg, initiator.attach(pools), result)
            return
        # Detach before unexporting: on a host with both roles, a pool dropped from both
        # must be unmounted while its target still answers.
        initiator = InitiatorPass(cfg, runner, result, dry_run=dry_run,
                                  wait_reconnects=wait_reconnects)
        for pool in initiator.detach_removed():
            forget(cfg, pool, result, dry_run=dry_run)
        # What a pass killed between recording a detach and forgetting the pool left.
        for pool in leftover_pools(cfg, initiator.records()):
            forget(cfg, pool, result, dry_run=dry_run)
        try:
            TargetPass(cfg, runner, result, dry_run=dry_run, rebind=rebind).run()
        except Exception as exc:  # a bug must not stop the GPU side from attaching
            log.error("unexpected error in the storage side's pass", exc_info=exc)
            result.unexpected("target", None, exc)
        hand_off_pools(cfg, initiator.attach_configured(), result)

    if dry_run:
        passes()
    else:
        with apply_lock(cfg.node.run_dir, wait=wait_for_lock, on_wait=on_lock_wait):
            passes()
    result.finished_at = time.time()
    if not dry_run:
        write_last_apply(cfg.node.state_dir, result.to_json())
    return result


def hand_off_pools(cfg: Config, mounted: Iterable[MountedPool], result: RunResult) -> None:
    """The engines' hand-off of each pool the initiator pass mounted (its last stage,
    after every pool of the pass is attached); a pool's failure is its own."""
    from .engines.handoff import hand_off

    for m in mounted:
        try:
            with progress.working_on(m.pool.name):
                hand_off(cfg, m.pool, m.mounts, m.transport, m.remounted, result,
                         fresh=m.fresh)
        except (KvagentError, OSError) as exc:
            result.error("initiator", m.pool.name, getattr(exc, "message", None) or str(exc),
                         getattr(exc, "hint", None))
        except Exception as exc:  # a bug: this pool's engines fail alone
            log.error("unexpected error handing a pool to its engines",
                      pool=m.pool.name, exc_info=exc)
            result.unexpected("initiator", m.pool.name, exc)

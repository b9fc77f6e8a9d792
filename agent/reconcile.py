"""One reconcile pass over every role of this host: what ``plan`` shows and ``apply`` does."""

from __future__ import annotations

import time
from pathlib import Path

from .config import Config
from .lock import apply_lock
from .result import RunResult
from .state import write_json
from .system.run import Runner, default_runner

LAST_APPLY = "last-apply.json"


def run_pass(cfg: Config, *, dry_run: bool, runner: Runner | None = None,
             wait_for_lock: bool = False) -> RunResult:
    """Plan (``dry_run``) or apply the config on this host; never raises for a failed action."""
    from .initiator.reconcile import InitiatorPass
    from .target.reconcile import TargetPass

    runner = runner or default_runner()
    result = RunResult(dry_run=dry_run)

    def passes() -> None:
        # Detach before unexporting: on a host with both roles, a pool dropped from both
        # must be unmounted while its target still answers.
        initiator = InitiatorPass(cfg, runner, result, dry_run=dry_run)
        initiator.detach_removed()
        TargetPass(cfg, runner, result, dry_run=dry_run).run()
        initiator.attach_configured()

    if dry_run:
        passes()
    else:
        with apply_lock(cfg.node.run_dir, wait=wait_for_lock):
            passes()
    result.finished_at = time.time()
    if not dry_run:
        write_json(Path(cfg.node.state_dir) / LAST_APPLY, result.to_json())
    return result

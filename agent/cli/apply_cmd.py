"""``kvagent plan`` and ``kvagent apply``."""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

from ..config import config_path
from ..errors import UsageError
from ..lock import LockHolder
from ..reconcile import run_pass
from ..result import RunResult
from .context import load_cli_config
from .delegate import delegate_apply
from .output import emit, output_format
from .progress_line import progress_line


def _text(result: RunResult) -> str:
    lines = []
    for a in result.actions:
        mark = {"planned": "+", "done": "✓", "failed": "✗", "skipped": "-"}[a.status]
        pool = f"[{a.role}/{a.pool}] " if a.pool else f"[{a.role}] "
        detail = f" = {a.detail}" if a.detail and a.kind.endswith("write") else (
            f" ({a.detail})" if a.detail and not a.kind.startswith("nvmet.") else "")
        line = f"{mark} {pool}{a.kind} {a.subject}{detail}"
        if a.error:
            line += f": {a.error}"
        lines.append(line)
    for w in result.warnings:
        where = f"[{w.role}/{w.pool}] " if w.pool else f"[{w.role}] "
        lines.append(f"warning: {where}{w.message}")
    for e in result.errors:
        where = f"[{e.role}/{e.pool}] " if e.pool else f"[{e.role}] "
        lines.append(f"error: {where}{e.message}" + (f"\n  hint: {e.hint}" if e.hint else ""))
    return "\n".join([*lines, summary(result)])


def summary(result: RunResult) -> str:
    """The last line of plan and apply: what changed, and "converged" only when nothing
    did and nothing failed (an error means the pass did not finish its work)."""
    n = sum(1 for a in result.actions if a.status in ("planned", "done"))
    if n:
        line = f"{n} change(s) would be made" if result.dry_run else f"{n} change(s) made"
    elif not result.ok:
        line = "no change planned" if result.dry_run else "nothing changed"
    else:
        line = "nothing to change: converged" if result.dry_run else "nothing changed: converged"
    if not result.dry_run:
        line += f"; {result.configfs_writes} configfs write(s)"
    if not result.ok:
        failed = sum(1 for a in result.actions if a.status == "failed")
        line += f"; {failed} failed action(s), {len(result.errors)} error(s)"
    return line


@click.command("plan")
def plan() -> None:
    """Show what apply would change (nothing is changed). Exit 0 ok, 1 problems found.

    On a terminal, a line on stderr shows the step in flight while it reads the host.
    """
    cfg = load_cli_config()
    with progress_line(output_format()):
        result = run_pass(cfg, dry_run=True)
    emit(result.to_json(), lambda _: _text(result))
    sys.exit(0 if result.ok else 1)


def lock_wait_message(what: str) -> Callable[[LockHolder | None], None]:
    """An ``on_wait`` callback that says once, on stderr, whom ``what`` waits for."""
    said = []

    def on_wait(holder: LockHolder | None) -> None:
        if not said:
            who = f" (held by {holder.describe()})" if holder else ""
            click.echo(f"kvagent: {what} waits for the apply lock{who}", err=True)
            said.append(True)

    return on_wait


@click.command("apply")
@click.option("--dry-run", is_flag=True, help="Only show what would change (same as plan).")
@click.option("--wait", "wait_lock", is_flag=True,
              help="Wait (up to 10 minutes) for another running apply instead of failing "
                   "as busy; through the agent too.")
@click.option("--rebind", "rebind", multiple=True, metavar="POOL",
              help="Let namespaces of target pool POOL move to the storage the config now "
                   "names (refused otherwise); they get a new identity, so GPU hosts see new "
                   "namespaces. Repeatable.")
@click.pass_context
def apply(ctx: click.Context, dry_run: bool, wait_lock: bool, rebind: tuple[str, ...]) -> None:
    """Make this host match the config: export, connect, mount; idempotent.

    A namespace whose storage the config would change (a device list, volume group
    or directory edited) is refused and left as it is, unless --rebind names its pool.

    While the agent (kvagent run) runs on this host with the same config file,
    apply does not apply beside it (the agent would undo it at its next pass):
    it checks the config, asks the agent to reload it and run a pass (an apply
    request and SIGHUP, like systemctl reload kvagent), waits for that pass and
    prints its result and exit code. With another config file it refuses (exit
    2). --dry-run never involves the agent.

    Applied here, on a terminal, a line on stderr shows the pass's step in flight
    (pool, step, count), erased at the end; nothing is added to -o json or to a
    stderr that is not a terminal.

    Exit 0 when everything applied, 1 when any action failed, 2 on a bad config.
    """
    cfg = load_cli_config()
    pools = {p.name for p in cfg.target.pools} if cfg.target else set()
    unknown = sorted(set(rebind) - pools)
    if unknown:
        raise UsageError(f"--rebind {unknown[0]}: not a target pool in the config "
                         f"(target pools: {', '.join(sorted(pools)) or 'none'})")
    result = None
    if not dry_run:
        path = config_path(ctx.find_root().obj.get("config_file"))
        result = delegate_apply(cfg, path, wait=wait_lock, rebind=rebind)
    if result is None:
        with progress_line(output_format()):
            result = run_pass(cfg, dry_run=dry_run, wait_for_lock=wait_lock, rebind=rebind,
                              on_lock_wait=lock_wait_message("apply"))
    emit(result.to_json(), lambda _: _text(result))
    sys.exit(0 if result.ok else 1)

"""``kvagent plan`` and ``kvagent apply``."""

from __future__ import annotations

import sys

import click

from ..errors import UsageError
from ..reconcile import run_pass
from ..result import RunResult
from .context import load_cli_config
from .output import emit


def _text(result: RunResult) -> str:
    lines = []
    verb = "would" if result.dry_run else ""
    for a in result.actions:
        mark = {"planned": "+", "done": "✓", "failed": "✗", "skipped": "-"}[a.status]
        pool = f"[{a.role}/{a.pool}] " if a.pool else f"[{a.role}] "
        detail = f" = {a.detail}" if a.detail and a.kind.endswith("write") else (
            f" ({a.detail})" if a.detail and not a.kind.startswith("nvmet.") else "")
        line = f"{mark} {pool}{a.kind} {a.subject}{detail}"
        if a.error:
            line += f": {a.error}"
        lines.append(line)
    for e in result.errors:
        where = f"[{e.role}/{e.pool}] " if e.pool else f"[{e.role}] "
        lines.append(f"error: {where}{e.message}" + (f"\n  hint: {e.hint}" if e.hint else ""))
    n = sum(1 for a in result.actions if a.status in ("planned", "done"))
    if result.dry_run:
        summary = f"{n} change(s) {verb} be made" if n else "nothing to change: converged"
    else:
        summary = (f"{n} change(s) made" if n else "nothing changed: converged") + \
            f"; {result.configfs_writes} configfs write(s)"
    failed = sum(1 for a in result.actions if a.status == "failed")
    if failed or result.errors:
        summary += f"; {failed} failed action(s), {len(result.errors)} error(s)"
    return "\n".join([*lines, summary])


@click.command("plan")
def plan() -> None:
    """Show what apply would change (nothing is changed). Exit 0 ok, 1 problems found."""
    result = run_pass(load_cli_config(), dry_run=True)
    emit(result.to_json(), lambda _: _text(result))
    sys.exit(0 if result.ok else 1)


@click.command("apply")
@click.option("--dry-run", is_flag=True, help="Only show what would change (same as plan).")
@click.option("--wait", "wait_lock", is_flag=True,
              help="Wait for another running apply instead of failing as busy.")
@click.option("--rebind", "rebind", multiple=True, metavar="POOL",
              help="Let namespaces of target pool POOL move to the storage the config now "
                   "names (refused otherwise); they get a new identity, so GPU hosts see new "
                   "namespaces. Repeatable.")
def apply(dry_run: bool, wait_lock: bool, rebind: tuple[str, ...]) -> None:
    """Make this host match the config: export, connect, mount; idempotent.

    A namespace whose storage the config would change (a device list, volume group
    or directory edited) is refused and left as it is, unless --rebind names its pool.

    Exit 0 when everything applied, 1 when any action failed, 2 on a bad config.
    """
    cfg = load_cli_config()
    pools = {p.name for p in cfg.target.pools} if cfg.target else set()
    unknown = sorted(set(rebind) - pools)
    if unknown:
        raise UsageError(f"--rebind {unknown[0]}: not a target pool in the config "
                         f"(target pools: {', '.join(sorted(pools)) or 'none'})")
    result = run_pass(cfg, dry_run=dry_run, wait_for_lock=wait_lock, rebind=rebind)
    emit(result.to_json(), lambda _: _text(result))
    sys.exit(0 if result.ok else 1)

"""``kvagent config``: check config files."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..config import ConfigError, config_path, load_config
from ..errors import EXIT_USAGE
from .output import emit


@click.group("config")
def config_group() -> None:
    """Check the configuration file."""


def _summary(path: str) -> dict[str, Any]:
    cfg = load_config(path)
    return {
        "valid": True,
        "file": path,
        "node": cfg.node.name,
        "roles": [r for r in ("target", "initiator") if getattr(cfg, r) is not None],
        "target_pools": [p.name for p in cfg.target.pools] if cfg.target else [],
        "initiator_pools": [p.name for p in cfg.initiator.pools] if cfg.initiator else [],
    }


def _text(s: dict[str, Any]) -> str:
    parts = [f"{s['file']}: valid (node {s['node']}"]
    if s["target_pools"]:
        parts.append(f"; target pools: {', '.join(s['target_pools'])}")
    if s["initiator_pools"]:
        parts.append(f"; initiator pools: {', '.join(s['initiator_pools'])}")
    return "".join(parts) + ")"


@config_group.command("validate")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False))
@click.pass_context
def validate(ctx: click.Context, files: tuple[str, ...]) -> None:
    """Validate FILES (default: the -c/--config file). Exit 0 all valid, 2 otherwise.

    Every problem is listed with the file, line, field path and what is wrong.
    """
    if len(files) <= 1:
        path = config_path(files[0] if files else ctx.find_root().obj.get("config_file"))
        summary = _summary(str(path))
        emit(summary, _text)
        return
    results: list[dict[str, Any]] = []
    for f in files:
        try:
            results.append(_summary(f))
        except ConfigError as exc:
            for problem in exc.problems:
                click.echo(f"kvagent: config error: {problem}", err=True)
            results.append({"valid": False, "file": f,
                            "problems": [str(p) for p in exc.problems]})
    ok = all(r["valid"] for r in results)
    emit({"valid": ok, "files": results},
         lambda d: "\n".join(_text(r) for r in d["files"] if r["valid"]))
    if not ok:
        sys.exit(EXIT_USAGE)

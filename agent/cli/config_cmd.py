"""``kvagent config``: check a config file."""

from __future__ import annotations

import click

from ..config import config_path, load_config
from .output import emit


@click.group("config")
def config_group() -> None:
    """Check the configuration file."""


@config_group.command("validate")
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.pass_context
def validate(ctx: click.Context, file: str | None) -> None:
    """Validate FILE (default: the -c/--config file). Exit 0 valid, 2 invalid.

    Every problem is listed with the file, line, field path and what is wrong.
    """
    path = config_path(file or ctx.find_root().obj.get("config_file"))
    cfg = load_config(path)
    roles = [r for r in ("target", "initiator") if getattr(cfg, r) is not None]
    summary = {
        "valid": True,
        "file": str(path),
        "node": cfg.node.name,
        "roles": roles,
        "target_pools": [p.name for p in cfg.target.pools] if cfg.target else [],
        "initiator_pools": [p.name for p in cfg.initiator.pools] if cfg.initiator else [],
    }

    def text(s: dict) -> str:
        parts = [f"{s['file']}: valid (node {s['node']}"]
        if s["target_pools"]:
            parts.append(f"; target pools: {', '.join(s['target_pools'])}")
        if s["initiator_pools"]:
            parts.append(f"; initiator pools: {', '.join(s['initiator_pools'])}")
        return "".join(parts) + ")"

    emit(summary, text)

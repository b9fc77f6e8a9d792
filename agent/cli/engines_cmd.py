"""``kvagent engines render``: one engine's config for an attached pool."""

from __future__ import annotations

import click

from ..engines import KINDS
from ..engines.handoff import AttachedRender, render_attached
from .context import load_cli_config
from .output import emit, output_format


@click.group("engines")
def engines_group() -> None:
    """Inference engines on this GPU host's pools."""


def _text(result: AttachedRender) -> str:
    files = result.rendered.files
    if len(files) == 1:
        return next(iter(files.values()))
    return "\n".join(f"==> {name} <==\n{text}" for name, text in files.items())


@engines_group.command("render")
@click.argument("pool")
@click.option("--engine", "kind", required=True, type=click.Choice(KINDS),
              help="Engine whose config to print.")
@click.option("--probe", "probe_now", is_flag=True,
              help="Probe the mounts now instead of using the probes recorded by apply.")
def engines_render(pool: str, kind: str, probe_now: bool) -> None:
    """Print engine KIND's config for the attached initiator pool POOL.

    The pool must be attached and mounted (kvagent apply). Text output is the
    file itself (several files are headed by ``==> NAME <==``); notes about
    fallbacks and settings left to you go to stderr. ``-o json`` gives the
    files, notes, directories and capacity. Exit 2 for a pool or engine not in
    the config, 1 when the pool is not attached or not mounted.
    """
    result = render_attached(load_cli_config(), pool, kind, probe_now=probe_now)
    data = {
        "pool": result.pool,
        "engine": result.engine,
        "format": result.rendered.format,
        "files": dict(result.rendered.files),
        "notes": list(result.rendered.notes),
        "mounts": list(result.mounts),
        "directories": list(result.directories),
        "capacity_bytes": result.capacity_bytes,
        "probes_from": result.probes_from,
    }
    if output_format() != "json":
        for note in result.rendered.notes:
            click.echo(f"kvagent: note: {note}", err=True)
    emit(data, lambda _: _text(result))

"""``kvagent engines render`` / ``check``: one engine's config for an attached pool, and the
engine's own verdict on it."""

from __future__ import annotations

import click

from ..engines import KINDS
from ..engines.handoff import AttachedRender, render_attached
from ..engines.verdict import EngineVerdict, judge
from .context import load_cli_config
from .failure import CommandFailed
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
        "directory_caps": list(result.context.caps()),
        "subdirectories": list(result.rendered.subdirectories),
    }
    if output_format() != "json":
        for note in result.rendered.notes:
            click.echo(f"kvagent: note: {note}", err=True)
    emit(data, lambda _: _text(result))


def _verdict_text(v: EngineVerdict) -> str:
    version = f" {v.engine_version}" if v.engine_version else ""
    lines = [f"{v.engine}{version}: {v.verdict} ({v.method or 'no method given'}; {v.python})"]
    lines += [f"  problem: {p}" for p in v.problems]
    lines += [f"  {v.engine} said: {m}" for m in v.messages]
    return "\n".join(lines)


@engines_group.command("check")
@click.argument("pool")
@click.option("--engine", "kind", required=True, type=click.Choice(KINDS),
              help="Engine whose own config validation to run.")
@click.option("--python", "python", default="python3", show_default=True, metavar="PATH",
              help="The Python the engine is installed in (e.g. its venv's bin/python).")
def engines_check(pool: str, kind: str, python: str) -> None:
    """Run engine KIND's own config code on what kvagent rendered for POOL.

    On a GPU host where the engine is installed, its own modules (LMCache's config
    loader, vLLM's KVTransferConfig and offloading spec, SGLang's argument parser and
    environment declarations, Mooncake's config loader, KVBM's variable names) read the
    rendered config under --python, time-boxed, and give their verdict: accepted, or
    refused with the engine's message, before the engine is started. Exit 0 accepted; 1
    refused, the engine cannot be loaded under that Python, or kvagent refuses the render
    (a size the engine reads as off, Dynamo without GPUDirect Storage); 2 for a pool or
    engine not in the config.
    """
    result = render_attached(load_cli_config(), pool, kind)
    verdict = judge(result.context, result.rendered, python)
    data = {
        "pool": result.pool, "engine": verdict.engine, "verdict": verdict.verdict,
        "engine_version": verdict.engine_version, "method": verdict.method,
        "problems": list(verdict.problems), "messages": list(verdict.messages),
        "python": verdict.python, "files": sorted(result.rendered.files),
    }
    if verdict.accepted or output_format() != "json":
        emit(data, lambda _: _verdict_text(verdict))
    if not verdict.accepted:  # with -o json, the verdict goes into the error object
        raise CommandFailed(
            f"{kind} {verdict.verdict} the config kvagent rendered for pool {pool!r}"
            if verdict.verdict == "refused" else
            f"{kind}'s code could not be loaded under {python}",
            "the engine's own words are above; kvagent engines render shows the files"
            if verdict.verdict == "refused" else
            "give the Python the engine is installed in with --python", details=data)

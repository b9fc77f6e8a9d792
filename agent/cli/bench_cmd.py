"""``kvagent bench``: does a pool's read bandwidth beat recomputing the KV cache?"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from ..bench.fio import (
    ALIGNMENT,
    DEFAULT_BLOCK_SIZES,
    PROFILES,
    JobResult,
    check_space,
    detect_ioengine,
    fio_version,
    format_latency,
    plan_jobs,
    run_jobs,
    scratch_dir,
    size_label,
    tty_progress,
)
from ..bench.kvmath import GPU_PRESETS, PREFIX_TOKENS, Throughput, throughput
from ..bench.models import (
    ModelSpec,
    builtin_model,
    builtin_names,
    format_params,
    load_model_config,
)
from ..bench.report import ENGINE_CHUNK_TOKENS, ModelAssessment, assess_model
from ..config import InitiatorPool
from ..config.units import format_size, parse_size
from ..errors import KvagentError, UsageError
from ..system.run import Runner, default_runner
from .output import emit, table

#: Seams the tests replace: how commands are run and how a mount point is recognised.
make_runner: Callable[[], Runner] = default_runner
is_mount: Callable[[str], bool] = os.path.ismount


@dataclass(frozen=True)
class DirectoryResult:
    """The jobs run in one directory and the model verdicts from its reads."""

    directory: str
    jobs: tuple[JobResult, ...]
    models: tuple[ModelAssessment, ...]


@dataclass(frozen=True)
class BenchResult:
    """Everything ``kvagent bench`` reports."""

    pool: str | None
    profile: str
    fio_version: str
    ioengine: str
    direct: bool
    runtime_s_per_job: int
    file_size: int
    throughput: Throughput
    engine_chunk_tokens: int
    prefix_tokens: tuple[int, ...]
    directories: tuple[DirectoryResult, ...]
    changed: bool = False


def _parse_sizes(_ctx: click.Context, _param: click.Parameter,
                 values: Sequence[str]) -> tuple[int, ...]:
    sizes: list[int] = []
    for value in values:
        for part in value.split(","):
            if not part.strip():
                continue
            try:
                n = parse_size(part.strip())
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None
            if n <= 0 or n % ALIGNMENT:
                raise click.BadParameter(
                    f"{part.strip()} is not a positive multiple of 4KiB (O_DIRECT alignment)")
            if n not in sizes:
                sizes.append(n)
    return tuple(sizes) or DEFAULT_BLOCK_SIZES


def _parse_io_size(_ctx: click.Context, _param: click.Parameter,
                   value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _namespace_dirs(mount: Path) -> list[Path]:
    """A per-namespace pool's directories: ``<storage node>-ns<nsid>`` (and ``ns<N>``
    of pools attached by older versions), by storage node, then namespace id."""
    found = []
    if mount.is_dir():
        for entry in mount.iterdir():
            m = re.fullmatch(r"(?:(.+)-)?ns(\d+)", entry.name)
            if m and entry.is_dir():
                found.append((m.group(1) or "", int(m.group(2)), entry))
    return [p for _, _, p in sorted(found)]


def _pool_directories(pool: InitiatorPool, all_namespaces: bool) -> list[Path]:
    mount = Path(pool.mount)
    if pool.shared:
        raise UsageError(f"pool {pool.name!r} is shared (raw block): it has no filesystem to "
                         "bench", "bench a directory with --path DIR")
    if pool.layout == "striped":
        dirs = [mount] if mount.is_dir() else []
    else:
        dirs = _namespace_dirs(mount)
        if dirs and not all_namespaces:
            dirs = dirs[:1]
    if not dirs:
        what = mount if pool.layout == "striped" else f"{mount}/<storage node>-ns<nsid>"
        raise KvagentError(f"pool {pool.name!r} has no directory to bench ({what} missing)",
                           "attach the pool first (kvagent apply on this GPU host)")
    for d in dirs:
        if not is_mount(str(d)):
            raise KvagentError(
                f"{d} is not a mount point: pool {pool.name!r} is not mounted, and benching "
                "it would measure the filesystem underneath",
                "attach the pool first (kvagent apply), or bench any directory with --path")
    return dirs


def _targets(pool_name: str | None, path: Path | None,
             all_namespaces: bool) -> tuple[str | None, list[Path]]:
    if pool_name and path is not None:
        raise UsageError("give either POOL or --path DIR, not both")
    if path is not None:
        if all_namespaces:
            raise UsageError("--all-namespaces applies to a POOL, not to --path")
        return None, [path]
    if not pool_name:
        raise UsageError("name an initiator pool from the config, or give --path DIR",
                         "kvagent bench POOL  or  kvagent bench --path /mnt/somewhere")
    from .context import load_cli_config

    cfg = load_cli_config()
    pools = cfg.initiator.pools if cfg.initiator else ()
    for pool in pools:
        if pool.name == pool_name:
            return pool.name, _pool_directories(pool, all_namespaces)
    known = ", ".join(p.name for p in pools) or "none (the config has no initiator pools)"
    raise UsageError(f"no initiator pool named {pool_name!r}; initiator pools: {known}",
                     "bench any directory with --path DIR")


def _models(names: Sequence[str], configs: Sequence[Path]) -> list[ModelSpec]:
    models = [builtin_model(n) for n in names]
    models += [load_model_config(p) for p in configs]
    if not names and not configs:
        models = [builtin_model(n) for n in builtin_names()]
    return models


def _prefix_label(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def _seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def render_text(result: BenchResult) -> str:
    """The human-readable report: a job table, a model table and a verdict table per directory."""
    out: list[str] = []
    for d in result.directories:
        out.append(f"{d.directory}: {result.fio_version}, ioengine {result.ioengine}, O_DIRECT, "
                   f"profile {result.profile} ({result.runtime_s_per_job}s per job, "
                   f"{format_size(result.file_size)} file per parallel job)")
        out.append(table(
            [[j.name, f"{j.gbps:.2f}", f"{j.iops:.0f}", format_latency(j.lat_p50_us),
              format_latency(j.lat_p99_us), format_latency(j.lat_p999_us)] for j in d.jobs],
            ["job", "GB/s", "IOPS", "p50", "p99", "p99.9"]))
        out.append("")
        out.append(f"Recompute at {result.throughput.label}.")
        out.append(f"Reads at the measured I/O size nearest to one "
                   f"{result.engine_chunk_tokens}-token chunk of the model's KV (LMCache's "
                   "default chunk): load time = KV bytes / the best read bandwidth there")
        out.append("+ the p50 latency of one I/O there (its least concurrent read job).")
        out.append(table(
            [[m.model, format_size(m.kv_bytes_per_token),
              f"{format_params(m.params_active)}" + ("~" if m.params_estimated else ""),
              f"{m.flops_per_token / 1e9:.1f} G", f"{m.break_even_gbps:.2f} GB/s",
              size_label(m.io_size), f"{m.read_gbps:.2f} GB/s", m.io_job,
              format_latency(m.io_latency_us)] for m in d.models],
            ["model", "KV/token", "active", "FLOPs/token", "break-even", "I/O size", "read",
             "job", "1 I/O"]))
        out.append("")
        rows = []
        for m in d.models:
            for p in m.prefixes:
                rows.append([m.model, _prefix_label(p.tokens), format_size(p.bytes),
                             _seconds(p.load_s), _seconds(p.recompute_s),
                             f"{p.break_even_bytes_per_s / 1e9:.2f} GB/s", p.verdict])
        out.append(table(rows, ["model", "prefix", "KV", "load", "recompute", "break-even",
                                "verdict"]))
        notes = [f"note: {m.model}: {n}" for m in d.models for n in m.notes]
        if notes:
            out.append("")
            out.extend(notes)
        out.append("")
    return "\n".join(out).rstrip() + "\n"


@click.command("bench")
@click.argument("pool", required=False)
@click.option("--path", "path", metavar="DIR",
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Bench this directory instead of a configured pool (no config needed).")
@click.option("--all-namespaces", is_flag=True,
              help="Per-namespace pools: bench every namespace's directory "
                   "(<mount>/<storage node>-ns<nsid>), not only the first.")
@click.option("--profile", type=click.Choice(sorted(PROFILES)), default="quick",
              show_default=True,
              help="tiny: 16 MiB files, 1 s per job (emulated VMs, smoke tests). quick: "
                   "64 MiB files, 1 s per job, 2 queue depths (seconds). full: 5 s per job "
                   "after a 1 s ramp, queue depths 1/8/32 × 1 and 4 jobs (minutes).")
@click.option("--gpu", type=click.Choice(sorted(GPU_PRESETS), case_sensitive=False),
              default=None, help="GPU preset for the recompute throughput [default: h100].")
@click.option("--mfu", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="Model FLOP utilisation of prefill, typically 0.4-0.6 [default: 0.5].")
@click.option("--tflops", type=click.FloatRange(0, min_open=True), default=None,
              help="Effective recompute throughput in TFLOP/s (instead of --gpu/--mfu).")
@click.option("--model", "model_names", multiple=True, metavar="NAME",
              help=f"Built-in model (repeatable): {', '.join(builtin_names())} [default: all].")
@click.option("--model-config", "model_configs", multiple=True, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A HuggingFace config.json to assess (repeatable).")
@click.option("--sizes", "sizes", multiple=True, callback=_parse_sizes, metavar="SIZES",
              help="I/O sizes, comma-separated or repeated [default: 256KiB,2MiB,8MiB,32MiB].")
@click.option("--io-size", callback=_parse_io_size, metavar="SIZE",
              help="Use the reads at this size for the verdicts (default: nearest to one "
                   f"{ENGINE_CHUNK_TOKENS}-token chunk of each model's KV).")
def bench(pool: str | None, path: Path | None, all_namespaces: bool, profile: str,
          gpu: str | None, mfu: float | None, tflops: float | None,
          model_names: tuple[str, ...], model_configs: tuple[Path, ...],
          sizes: tuple[int, ...], io_size: int | None) -> None:
    """Bench POOL's mount with fio and say whether loading KV beats recomputing it.

    Runs O_DIRECT reads and writes at the engines' I/O sizes and queue depths,
    reports GB/s, IOPS and p50/p99/p99.9 latency, then for each model: KV bytes
    per token, recompute FLOPs per token, the break-even read bandwidth at the
    given GPU throughput, and load vs recompute for 1K/32K/128K-token prefixes.
    fio's files live in a hidden scratch directory that is removed afterwards.
    """
    if tflops is not None and (gpu is not None or mfu is not None):
        raise UsageError("give either --tflops or --gpu/--mfu, not both")
    thr = throughput(gpu or "h100", 0.5 if mfu is None else mfu, tflops)
    if io_size is not None and io_size not in sizes:
        raise UsageError(f"--io-size {size_label(io_size)} is not one of the sizes benched "
                         f"({', '.join(size_label(s) for s in sizes)})")
    models = _models(model_names, model_configs)
    pool_name, directories = _targets(pool, path, all_namespaces)
    prof = PROFILES[profile]

    runner = make_runner()
    version = fio_version(runner)
    engine = detect_ioengine(runner)
    specs = plan_jobs(prof, sizes, engine)
    progress = tty_progress(sys.stderr)
    for directory in directories:
        check_space(directory, prof, max(spec.block_size for spec in specs))
    results = []
    for directory in directories:
        with scratch_dir(directory) as scratch:
            jobs = run_jobs(runner, specs, scratch, prof, engine, progress)
        assessed = tuple(assess_model(m, jobs, thr, PREFIX_TOKENS, io_size) for m in models)
        results.append(DirectoryResult(str(directory), tuple(jobs), assessed))

    emit(BenchResult(pool_name, prof.name, version, engine, True, prof.runtime_s,
                     prof.file_size, thr, ENGINE_CHUNK_TOKENS, PREFIX_TOKENS, tuple(results)),
         render_text)

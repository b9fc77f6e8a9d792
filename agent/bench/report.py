"""From measured fio jobs and model shapes to per-model verdicts. Pure: no I/O."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import UsageError
from .fio import JobResult, size_label
from .kvmath import (
    PREFIX_TOKENS,
    PrefixAssessment,
    Throughput,
    assess_prefix,
    break_even_bandwidth,
    linear_flops_per_token,
)
from .models import ModelSpec

#: LMCache's default chunk is 256 tokens; engines read KV in chunks of about that many tokens.
ENGINE_CHUNK_TOKENS = 256


@dataclass(frozen=True)
class ReadChoice:
    """The measured reads that stand for the engine's: bandwidth from the best job at the
    engine-relevant size, the fixed cost from the least concurrent one (one unqueued I/O)."""

    job: JobResult
    latency_job: JobResult
    reason: str


def choose_read_job(jobs: Sequence[JobResult], kv_bytes_per_token: int,
                    io_size: int | None = None) -> ReadChoice:
    """The read jobs at the engine-relevant I/O size.

    Engine-relevant: ``io_size`` if given, else the measured size nearest (on a log
    scale; ties go to the larger) to one engine chunk of KV
    (``ENGINE_CHUNK_TOKENS`` × bytes/token). Bandwidth: the best read job there.
    Latency of one I/O: the p50 of the read job there with the fewest I/Os in flight
    (iodepth × numjobs, normally 1), since a deep queue's latency is mostly queueing
    that its bandwidth already accounts for.
    """
    reads = [j for j in jobs if j.rw == "read" and j.bw_bytes > 0]
    if not reads:
        raise UsageError("no read job measured any bandwidth; nothing to compare with "
                         "recompute")
    sizes = sorted({j.block_size for j in reads})
    if io_size is not None:
        if io_size not in sizes:
            raise UsageError(f"--io-size {size_label(io_size)} was not measured; measured "
                             f"read sizes: {', '.join(size_label(s) for s in sizes)}")
        size = io_size
        why = f"{size_label(size)} as given with --io-size"
    else:
        chunk = ENGINE_CHUNK_TOKENS * kv_bytes_per_token
        size = min(sizes, key=lambda s: (abs(math.log(s / chunk)), -s))
        why = (f"{size_label(size)}: the measured size nearest to one {ENGINE_CHUNK_TOKENS}-token "
               f"chunk of KV ({chunk / 2**20:.1f} MiB)")
    at_size = [j for j in reads if j.block_size == size]
    best = max(at_size, key=lambda j: j.bw_bytes)
    single = min(at_size, key=lambda j: (j.iodepth * j.numjobs, -j.bw_bytes))
    return ReadChoice(best, single, f"{why}; bandwidth of {best.name}, latency of "
                                    f"{single.name}")


@dataclass(frozen=True)
class ModelAssessment:
    """One model against one directory's measured reads."""

    model: str
    source: str
    mla: bool
    moe: bool
    dtype: str
    kv_bytes_per_token: int
    params_total: int
    params_active: int
    params_estimated: bool
    flops_per_token: float
    break_even_gbps: float
    io_job: str
    latency_job: str
    io_size: int
    io_reason: str
    read_gbps: float
    io_latency_us: float
    prefixes: tuple[PrefixAssessment, ...]
    notes: tuple[str, ...]


def assess_model(model: ModelSpec, jobs: Sequence[JobResult], thr: Throughput,
                 prefixes: Sequence[int] = PREFIX_TOKENS,
                 io_size: int | None = None) -> ModelAssessment:
    """KV bytes/token, FLOPs/token, break-even bandwidth and a verdict per prefix length."""
    choice = choose_read_job(jobs, model.kv_bytes_per_token, io_size)
    job, lat = choice.job, choice.latency_job
    latency_us = lat.lat_p50_us if lat.lat_p50_us is not None else (lat.lat_mean_us or 0.0)
    notes = list(model.notes)
    if lat.lat_p50_us is None:
        notes.append("fio reported no p50 latency; the mean (or 0) is used as the fixed cost")
    flops = linear_flops_per_token(model.params_active)
    return ModelAssessment(
        model=model.name, source=model.source, mla=model.mla, moe=model.moe, dtype=model.dtype,
        kv_bytes_per_token=model.kv_bytes_per_token, params_total=model.params_total,
        params_active=model.params_active, params_estimated=model.params_estimated,
        flops_per_token=flops,
        break_even_gbps=break_even_bandwidth(model.kv_bytes_per_token, thr.effective_flops,
                                             flops) / 1e9,
        io_job=job.name, latency_job=lat.name, io_size=job.block_size, io_reason=choice.reason,
        read_gbps=job.gbps, io_latency_us=latency_us,
        prefixes=tuple(assess_prefix(model, n, job.bw_bytes, latency_us / 1e6,
                                     thr.effective_flops) for n in prefixes),
        notes=tuple(notes),
    )

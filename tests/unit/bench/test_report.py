"""Which measured read stands for the engine, and the per-model assessment built from it."""

from __future__ import annotations

import pytest

from agent.bench.fio import KIB, MIB, JobResult
from agent.bench.kvmath import throughput
from agent.bench.models import builtin_model
from agent.bench.report import assess_model, choose_read_job
from agent.errors import UsageError


def job(rw: str, bs: int, qd: int, gbps: float, p50_us: float | None = 100.0) -> JobResult:
    return JobResult(name=f"{rw}-{bs}-qd{qd}", rw=rw,  # type: ignore[arg-type]
                     block_size=bs, iodepth=qd, numjobs=1, ioengine="libaio", gbps=gbps,
                     bw_bytes=gbps * 1e9, iops=1.0, lat_mean_us=150.0, lat_p50_us=p50_us,
                     lat_p99_us=None, lat_p999_us=None, io_bytes=1)


JOBS = [
    job("write", 256 * KIB, 8, 9.0), job("read", 256 * KIB, 8, 1.0),
    job("read", 2 * MIB, 1, 1.5), job("read", 2 * MIB, 8, 2.5),
    job("read", 8 * MIB, 8, 3.0),
    job("read", 32 * MIB, 1, 2.0, p50_us=100.0), job("read", 32 * MIB, 8, 4.0, p50_us=800.0),
]


def test_chunk_of_llama_8b_picks_32mib_and_its_best_read() -> None:
    # 256 tokens · 128 KiB = 32 MiB: measured exactly; best read there is qd8 at 4 GB/s
    # (the 9 GB/s write is never used for loading)
    c = choose_read_job(JOBS, 128 * KIB)
    assert (c.job.block_size, c.job.gbps) == (32 * MIB, 4.0)
    # the fixed cost is one unqueued I/O: the qd1 job's latency, not qd8's queueing
    assert (c.latency_job.block_size, c.latency_job.iodepth) == (32 * MIB, 1)
    assert "32.0 MiB" in c.reason and c.job.name in c.reason
    assert c.latency_job.name in c.reason


def test_nearest_size_on_a_log_scale() -> None:
    # Qwen2.5-7B: 256 · 56 KiB = 14 MiB; ln(14/8) = 0.56 < ln(32/14) = 0.83 → 8 MiB
    assert choose_read_job(JOBS, 56 * KIB).job.block_size == 8 * MIB
    # DeepSeek-V3: 256 · 70272 B = 17.16 MiB; ln(17.16/8) = 0.76 > ln(32/17.16) = 0.62 → 32 MiB
    assert choose_read_job(JOBS, 70272).job.block_size == 32 * MIB
    # 256 · 4 KiB = 1 MiB: ln(1/0.25) = 1.39 > ln(2/1) = 0.69 → 2 MiB
    assert choose_read_job(JOBS, 4 * KIB).job.block_size == 2 * MIB
    # a tie (4 MiB between 2 and 8 MiB: ln 2 each way) goes to the larger size
    assert choose_read_job(JOBS, 16 * KIB).job.block_size == 8 * MIB


def test_io_size_override_and_its_errors() -> None:
    assert choose_read_job(JOBS, 128 * KIB, io_size=2 * MIB).job.gbps == 2.5
    with pytest.raises(UsageError, match="--io-size 1MiB was not measured"):
        choose_read_job(JOBS, 128 * KIB, io_size=1 * MIB)
    with pytest.raises(UsageError, match="no read job measured any bandwidth"):
        choose_read_job([job("write", MIB, 1, 1.0)], 128 * KIB)


def test_assessment_uses_the_chosen_reads_bandwidth_and_latency() -> None:
    m = builtin_model("Llama-3.1-8B")
    thr = throughput("h100", 0.5)
    a = assess_model(m, JOBS, thr, prefixes=(1024,))
    assert a.io_size == 32 * MIB and a.read_gbps == 4.0 and a.io_latency_us == 100.0
    assert a.latency_job.endswith("qd1") and a.io_job.endswith("qd8")
    # 1024 · 131072 B / 4e9 B/s + 100 us = 0.033554432 + 0.0001
    assert a.prefixes[0].load_s == pytest.approx(0.033654432)
    # weights-only break-even: 131072 · 4.945e14 / (2 · 8.03e9) = 4.0358e9 B/s
    assert a.break_even_gbps == pytest.approx(4.0358, rel=1e-4)


def test_mean_latency_stands_in_when_fio_gave_no_p50() -> None:
    jobs = [job("read", 32 * MIB, 8, 4.0, p50_us=None)]
    a = assess_model(builtin_model("Llama-3.1-8B"), jobs, throughput(tflops=500),
                     prefixes=(1024,))
    assert a.io_latency_us == 150.0
    assert any("no p50 latency" in n for n in a.notes)

"""fio job building, parsing of real fio JSON (and older/partial variants), running, cleanup."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from agent.bench import fio
from agent.bench.fio import (
    KIB,
    MIB,
    PROFILES,
    FioError,
    FioNotFound,
    JobSpec,
    Profile,
    check_space,
    detect_ioengine,
    fio_argv,
    fio_version,
    job_result,
    parse_fio_json,
    plan_jobs,
    run_job,
    run_jobs,
    scratch_dir,
    tty_progress,
)
from agent.errors import EXIT_FAILED, KvagentError
from agent.system.run import CommandNotFound, CommandResult
from tests.unit.fakerunner import FakeRunner

from .conftest import READ_2M, READ_8M_J2, WRITE_256K, fake_fio, fio_jobs, fixture_text

QUICK = PROFILES["quick"]
FULL = PROFILES["full"]


def test_argv_is_a_kv_shaped_odirect_json_job() -> None:
    argv = fio_argv(JobSpec("read", 2 * MIB, 8, 4), Path("/mnt/kv/ns1/.kvagent-bench-x"), QUICK)
    assert argv[0] == "fio"
    assert all(isinstance(a, str) for a in argv)
    for opt in ("--output-format=json", "--direct=1", "--rw=read", "--bs=2097152",
                "--ioengine=libaio", "--iodepth=8", "--numjobs=4", "--group_reporting",
                "--time_based", "--runtime=1", "--size=67108864",
                "--directory=/mnt/kv/ns1/.kvagent-bench-x", "--name=read-2MiB-qd8-j4",
                "--filename_format=kvbench.$jobnum", "--percentile_list=50:99:99.9"):
        assert opt in argv
    assert not any(a.startswith("--ramp_time") for a in argv)
    full = fio_argv(JobSpec("write", 32 * MIB, 1, 1), Path("/d"), FULL, "psync")
    assert "--ramp_time=1" in full and "--runtime=5" in full and "--ioengine=psync" in full
    assert f"--size={1024 * MIB}" in full


def test_argv_escapes_colons_in_the_directory() -> None:
    argv = fio_argv(JobSpec("read", 256 * KIB, 1, 1), Path("/mnt/a:b"), QUICK)
    assert "--directory=/mnt/a\\:b" in argv


def test_plan_covers_every_size_direction_and_combo() -> None:
    specs = plan_jobs(QUICK)
    # 4 sizes × (write, read) × 2 (iodepth, numjobs) combos
    assert len(specs) == 16
    assert [s.block_size for s in specs[:4]] == [256 * KIB] * 4
    assert [s.rw for s in specs[:4]] == ["write", "write", "read", "read"]
    assert {(s.iodepth, s.numjobs) for s in specs} == {(1, 1), (8, 1)}
    assert {s.block_size for s in specs} == {256 * KIB, 2 * MIB, 8 * MIB, 32 * MIB}
    full = plan_jobs(FULL)
    assert len(full) == 4 * 2 * 6
    assert {s.iodepth for s in full} == {1, 8, 32} and {s.numjobs for s in full} == {1, 4}


def test_plan_without_libaio_has_queue_depth_one() -> None:
    specs = plan_jobs(QUICK, (2 * MIB,), ioengine="psync")
    # (1,1) and (8,1) collapse to (1,1): one write and one read
    assert [(s.rw, s.iodepth, s.numjobs) for s in specs] == [("write", 1, 1), ("read", 1, 1)]


def test_plan_rejects_unaligned_sizes() -> None:
    with pytest.raises(ValueError, match="multiple of 4096"):
        plan_jobs(QUICK, (1000,))


def test_parse_real_read_fixture() -> None:
    out = parse_fio_json(fixture_text(READ_2M))
    assert out.version == "fio-3.33"
    (job,) = out.jobs
    assert job.name == "read-2MiB-qd8-j1" and job.error == 0
    # values copied from the recorded file
    assert job.read.bw_bytes == 1609200792
    assert job.read.iops == pytest.approx(767.326733)
    assert job.read.io_bytes == 1625292800 and job.read.total_ios == 775
    assert job.read.clat.p50_ns == 10027008
    assert job.read.clat.p99_ns == 14614528
    assert job.read.clat.p999_ns == 17694720
    assert job.write.bw_bytes == 0 and job.write.clat.p50_ns is None


def test_parse_real_write_fixture_and_result_units() -> None:
    spec = JobSpec("write", 256 * KIB, 1, 1)
    r = job_result(spec, parse_fio_json(fixture_text(WRITE_256K)), "libaio")
    assert r.gbps == pytest.approx(1.984280807)
    assert r.iops == pytest.approx(7569.430569)
    # clat_ns percentiles 55552 / 2244608 / 4620288 ns in microseconds
    assert (r.lat_p50_us, r.lat_p99_us, r.lat_p999_us) == (55.552, 2244.608, 4620.288)


def test_parse_group_reported_parallel_jobs() -> None:
    out = parse_fio_json(fixture_text(READ_8M_J2))
    assert len(out.jobs) == 1
    r = job_result(JobSpec("read", 8 * MIB, 4, 2), out, "libaio")
    assert r.bw_bytes == 1380708685 and r.lat_p50_us == pytest.approx(30277.632)


def test_missing_percentiles_give_none_not_zero() -> None:
    data = json.loads(fixture_text(READ_2M))
    del data["jobs"][0]["read"]["clat_ns"]["percentile"]
    r = job_result(JobSpec("read", 2 * MIB, 8, 1), parse_fio_json(json.dumps(data)), "libaio")
    assert r.bw_bytes == 1609200792
    assert r.lat_p50_us is None and r.lat_p99_us is None and r.lat_p999_us is None
    assert r.lat_mean_us == pytest.approx(10292.306736774)
    assert "p50 -" in fio.describe(r)


def test_missing_single_percentile() -> None:
    data = json.loads(fixture_text(READ_2M))
    del data["jobs"][0]["read"]["clat_ns"]["percentile"]["99.900000"]
    out = parse_fio_json(json.dumps(data))
    assert out.jobs[0].read.clat.p99_ns == 14614528
    assert out.jobs[0].read.clat.p999_ns is None


def test_older_fio_layout_clat_in_microseconds_and_bw_in_kib() -> None:
    # fio 2.x: "clat" in usec, "bw" in KiB/s, no bw_bytes / io_bytes.
    data = json.loads(fixture_text(READ_2M))
    read = data["jobs"][0]["read"]
    clat = read.pop("clat_ns")
    read["clat"] = {"min": 1, "max": 2, "mean": clat["mean"] / 1000,
                    "percentile": {"50.000000": 10027, "99.000000": 14614,
                                   "99.900000": 17694}}
    del read["bw_bytes"], read["io_bytes"], read["lat_ns"]
    read["bw"] = 1000000
    read["io_kbytes"] = 2048
    (job,) = parse_fio_json(json.dumps(data)).jobs
    assert job.read.bw_bytes == 1000000 * 1024
    assert job.read.io_bytes == 2048 * 1024
    assert job.read.clat.p50_ns == 10027000 and job.read.clat.p999_ns == 17694000


def test_notices_before_the_json_are_skipped() -> None:
    text = "fio: this platform does not support process shared mutexes {x}\n" \
        + fixture_text(READ_2M)
    assert parse_fio_json(text).jobs[0].read.bw_bytes == 1609200792


@pytest.mark.parametrize(("text", "message"), [
    ("", "printed no JSON"),
    ("{\n  broken", "not valid"),
    ('{"fio version": "fio-3.33"}', "no 'jobs' list"),
])
def test_unusable_output_is_a_fio_error(text: str, message: str) -> None:
    with pytest.raises(FioError, match=message):
        parse_fio_json(text)


def test_version_and_engine_detection() -> None:
    runner = fake_fio()
    assert fio_version(runner) == "fio-3.33"
    assert detect_ioengine(runner) == "libaio"
    no_aio = fake_fio(engines="Available IO engines:\n\tsync\n\tpsync\n\tlibaio_like\n")
    assert detect_ioengine(no_aio) == "psync"


def test_missing_fio_says_how_to_install() -> None:
    runner = FakeRunner()

    def missing(argv: tuple[str, ...], _stdin: str | None) -> CommandResult:
        raise CommandNotFound(argv[0])

    runner.on_call(["fio"], missing)
    with pytest.raises(FioNotFound) as exc:
        fio_version(runner)
    assert exc.value.exit_code == EXIT_FAILED
    assert "apt-get install fio" in (exc.value.hint or "")


def test_failed_job_reports_fios_complaint_with_a_hint(tmp_path: Path) -> None:
    runner = FakeRunner().on(
        ["fio", "--output-format=json"], returncode=1,
        stderr="fio: looks like your file system does not support direct=1/buffered=0\n"
               "fio: destination does not support O_DIRECT\n")
    with pytest.raises(FioError) as exc:
        run_job(runner, JobSpec("read", 2 * MIB, 1, 1), tmp_path, QUICK, "libaio")
    assert "read-2MiB-qd1-j1" in exc.value.message
    assert "does not support O_DIRECT" in exc.value.message
    assert "O_DIRECT" in (exc.value.hint or "")


def test_job_error_in_json_is_a_failure(tmp_path: Path) -> None:
    data = json.loads(fixture_text(READ_2M))
    data["jobs"][0]["error"] = 28
    runner = FakeRunner().on(["fio", "--output-format=json"], json.dumps(data))
    with pytest.raises(FioError, match=r"error 28 \(No space left on device\)"):
        run_job(runner, JobSpec("read", 2 * MIB, 8, 1), tmp_path, QUICK, "libaio")


def test_run_jobs_runs_in_order_and_reports_progress(tmp_path: Path) -> None:
    runner = fake_fio()
    stream = io.StringIO()
    stream.isatty = lambda: True  # type: ignore[method-assign]
    progress = tty_progress(stream)
    assert progress is not None
    specs = plan_jobs(QUICK, (256 * KIB,))
    results = run_jobs(runner, specs, tmp_path, QUICK, "libaio", progress)
    assert [r.name for r in results] == [s.name for s in specs]
    assert [j["name"] for j in fio_jobs(runner)] == [s.name for s in specs]
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("kvagent bench: [1/4] write 256KiB qd1 x1: 1.98 GB/s")
    assert lines[3].startswith("kvagent bench: [4/4] read 256KiB qd8 x1: 1.61 GB/s")


def test_no_progress_when_not_a_terminal() -> None:
    assert tty_progress(io.StringIO()) is None


def test_scratch_dir_is_hidden_and_removed_with_fios_files(tmp_path: Path) -> None:
    (tmp_path / "engine-data").write_text("keep me")
    with scratch_dir(tmp_path) as scratch:
        assert scratch.parent == tmp_path and scratch.name.startswith(".kvagent-bench-")
        (scratch / "kvbench.0").write_bytes(b"x")
        (scratch / "kvbench.1").write_bytes(b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine-data"]


def test_scratch_dir_never_deletes_what_fio_did_not_write(tmp_path: Path) -> None:
    with scratch_dir(tmp_path) as scratch:
        (scratch / "kvbench.0").write_bytes(b"x")
        (scratch / "someone-elses").write_text("data")
    assert (scratch / "someone-elses").read_text() == "data"
    assert not (scratch / "kvbench.0").exists()


def test_scratch_dir_is_removed_when_a_job_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), scratch_dir(tmp_path) as scratch:
        (scratch / "kvbench.0").write_bytes(b"x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_unwritable_directory_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    with pytest.raises(KvagentError, match=f"cannot create a scratch directory in {missing}"), \
            scratch_dir(missing):
        pass


def test_space_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Usage:
        free = 2 * 1024 * MIB

    monkeypatch.setattr(fio.shutil, "disk_usage", lambda _p: Usage)
    check_space(tmp_path, QUICK)  # needs 64 MiB
    with pytest.raises(KvagentError, match=r"has 2\.0 GiB free; the full profile needs 4\.0 GiB"):
        check_space(tmp_path, FULL)  # 1 GiB × 4 parallel jobs


def test_profiles_are_short_and_long() -> None:
    assert QUICK.runtime_s + QUICK.ramp_s < FULL.runtime_s + FULL.ramp_s
    assert isinstance(QUICK, Profile) and QUICK.max_numjobs == 1 and FULL.max_numjobs == 4


def test_files_hold_at_least_two_ios() -> None:
    """fio refuses a file smaller than one block: tiny (16 MiB files) at 32 MiB I/Os."""
    tiny = PROFILES["tiny"]
    argv = fio_argv(JobSpec("write", 32 * MIB, 1, 1), Path("/d"), tiny)
    assert f"--size={64 * MIB}" in argv
    assert f"--size={16 * MIB}" in fio_argv(JobSpec("read", 2 * MIB, 8, 1), Path("/d"), tiny)


def test_space_check_counts_the_largest_io(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    class Usage:
        free = 100 * MIB

    monkeypatch.setattr(fio.shutil, "disk_usage", lambda _p: Usage)
    check_space(tmp_path, PROFILES["tiny"], 2 * MIB)  # 16 MiB files fit
    with pytest.raises(KvagentError, match=r"needs 0\.1 GiB"):
        check_space(tmp_path, PROFILES["tiny"], 32 * MIB)  # 64 MiB files do not

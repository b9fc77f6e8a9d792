"""fio jobs shaped like KV-cache traffic: build the argv, run through a Runner, parse the JSON.

Each job is one fio invocation (so progress can be shown per job): O_DIRECT
(``--direct=1``), sequential reads or writes of whole KV chunks (256 KiB, 2 MiB,
8 MiB, 32 MiB by default) at a queue depth and a number of parallel jobs, each job
on its own file in a scratch directory that kvagent creates and removes.
``--group_reporting`` folds the parallel jobs into one result. libaio is used
where fio has it; otherwise psync (queue depth is then always 1).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from ..errors import KvagentError
from ..log import get_logger
from ..system.run import CommandNotFound, Runner

log = get_logger("bench.fio")

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
#: The I/O sizes engines move KV in: vLLM blocks (16 tokens) to LMCache chunks (256 tokens).
DEFAULT_BLOCK_SIZES: tuple[int, ...] = (256 * KIB, 2 * MIB, 8 * MIB, 32 * MIB)
#: O_DIRECT needs sizes aligned to the logical block size; 4096 covers every device.
ALIGNMENT = 4096
FILE_PREFIX = "kvbench"
DIR_PREFIX = ".kvagent-bench-"
INSTALL_HINT = "install fio: apt-get install fio (Debian/Ubuntu) or dnf install fio (Fedora/RHEL)"

RW = Literal["read", "write"]


@dataclass(frozen=True)
class Profile:
    """How long and how wide the job set is."""

    name: str
    runtime_s: int
    ramp_s: int
    #: bytes of each parallel job's file
    file_size: int
    #: (iodepth, numjobs) pairs run at every block size, for reads and for writes
    combos: tuple[tuple[int, int], ...]

    @property
    def max_numjobs(self) -> int:
        return max(nj for _, nj in self.combos)

    def job_file_size(self, block_size: int) -> int:
        """Each job's file: the profile's size, but at least two I/Os of ``block_size``
        (fio refuses a file smaller than one block: tiny's 16 MiB at 32 MiB I/Os)."""
        return max(self.file_size, 2 * block_size)


PROFILES: dict[str, Profile] = {
    # 4 sizes × 2 directions × 2 combos × 1 s: about 20 s.
    # For emulated VMs and smoke tests: small files, 1 s per job.
    "tiny": Profile("tiny", runtime_s=1, ramp_s=0, file_size=16 * MIB,
                    combos=((1, 1), (8, 1))),
    "quick": Profile("quick", runtime_s=1, ramp_s=0, file_size=64 * MIB,
                     combos=((1, 1), (8, 1))),
    # 4 sizes × 2 directions × 6 combos × (1 s ramp + 5 s): about 5 minutes.
    "full": Profile("full", runtime_s=5, ramp_s=1, file_size=1 * GIB,
                    combos=((1, 1), (8, 1), (32, 1), (1, 4), (8, 4), (32, 4))),
}


def size_label(n: int) -> str:
    """``256KiB``, ``2MiB``, ``1GiB``: exact binary units where they divide, else bytes."""
    for unit, factor in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n}B"


@dataclass(frozen=True)
class JobSpec:
    """One fio run: direction, I/O size, queue depth, parallel jobs."""

    rw: RW
    block_size: int
    iodepth: int
    numjobs: int

    @property
    def name(self) -> str:
        return f"{self.rw}-{size_label(self.block_size)}-qd{self.iodepth}-j{self.numjobs}"


def plan_jobs(profile: Profile, block_sizes: Sequence[int] = DEFAULT_BLOCK_SIZES,
              ioengine: str = "libaio") -> tuple[JobSpec, ...]:
    """The job list: for each size, writes (which also lay the files out) then reads."""
    specs: list[JobSpec] = []
    for bs in block_sizes:
        if bs <= 0 or bs % ALIGNMENT:
            raise ValueError(f"block size {bs} is not a positive multiple of {ALIGNMENT}")
        for rw in ("write", "read"):
            for iodepth, numjobs in profile.combos:
                depth = iodepth if ioengine == "libaio" else 1
                spec = JobSpec(rw, bs, depth, numjobs)  # type: ignore[arg-type]
                if spec not in specs:
                    specs.append(spec)
    return tuple(specs)


def _fio_path(path: Path) -> str:
    # fio splits filename/directory lists on ':'; a literal colon is written '\:'.
    return str(path).replace(":", "\\:")


def fio_argv(spec: JobSpec, directory: Path, profile: Profile, ioengine: str = "libaio",
             fio: str = "fio") -> list[str]:
    """The fio command line of one job (JSON on stdout, O_DIRECT, per-job files)."""
    argv = [
        fio,
        "--output-format=json",
        "--eta=never",
        f"--name={spec.name}",
        f"--directory={_fio_path(directory)}",
        f"--filename_format={FILE_PREFIX}.$jobnum",
        f"--rw={spec.rw}",
        f"--bs={spec.block_size}",
        f"--size={profile.job_file_size(spec.block_size)}",
        f"--ioengine={ioengine}",
        f"--iodepth={spec.iodepth}",
        f"--numjobs={spec.numjobs}",
        "--direct=1",
        "--group_reporting",
        "--time_based",
        f"--runtime={profile.runtime_s}",
        "--percentile_list=50:99:99.9",
    ]
    if profile.ramp_s:
        argv.append(f"--ramp_time={profile.ramp_s}")
    return argv


def job_timeout(spec: JobSpec, profile: Profile) -> float:
    """Generous wall-clock limit: run time plus laying out the files at a slow 1 MB/s
    (an emulated VM's NVMe/TCP path can be that slow)."""
    layout = profile.job_file_size(spec.block_size) * spec.numjobs / 1e6
    return profile.runtime_s + profile.ramp_s + layout + 60.0


# ---------------------------------------------------------------- parsing


class FioError(KvagentError):
    """fio failed, or its output could not be understood."""


class FioNotFound(FioError):
    """fio is not installed."""

    def __init__(self) -> None:
        super().__init__("fio is not installed or not on PATH (kvagent bench drives fio)",
                         INSTALL_HINT)


@dataclass(frozen=True)
class Latency:
    """Completion latency of one I/O in nanoseconds (None where fio reported none)."""

    mean_ns: float | None
    p50_ns: float | None
    p99_ns: float | None
    p999_ns: float | None


@dataclass(frozen=True)
class IoStats:
    """One direction (read or write) of a fio job."""

    bw_bytes: float
    iops: float
    io_bytes: int
    total_ios: int
    runtime_ms: int
    clat: Latency


@dataclass(frozen=True)
class FioJob:
    """One job entry of fio's JSON."""

    name: str
    error: int
    read: IoStats
    write: IoStats

    def stats(self, rw: RW) -> IoStats:
        return self.read if rw == "read" else self.write


@dataclass(frozen=True)
class FioOutput:
    """fio's JSON output."""

    version: str
    jobs: tuple[FioJob, ...]


def _num(d: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value)


def _percentile(pct: Mapping[str, Any] | None, want: float) -> float | None:
    if not isinstance(pct, Mapping):
        return None
    for key, value in pct.items():
        try:
            if math.isclose(float(key), want, abs_tol=1e-6):
                return float(value) if isinstance(value, (int, float)) else None
        except ValueError:
            continue
    return None


def _latency(section: Mapping[str, Any], total_ios: int) -> Latency:
    # fio >= 3.0 reports nanoseconds in clat_ns; fio 2.x reported microseconds in clat.
    if isinstance(section.get("clat_ns"), Mapping):
        clat, scale = section["clat_ns"], 1.0
        lat = section.get("lat_ns") if isinstance(section.get("lat_ns"), Mapping) else {}
    elif isinstance(section.get("clat"), Mapping):
        clat, scale = section["clat"], 1000.0
        lat = section.get("lat") if isinstance(section.get("lat"), Mapping) else {}
    else:
        return Latency(None, None, None, None)
    if total_ios == 0:
        return Latency(None, None, None, None)
    pct = clat.get("percentile") or lat.get("percentile")

    def scaled(v: float | None) -> float | None:
        return None if v is None else v * scale

    mean = clat.get("mean")
    return Latency(
        scaled(float(mean)) if isinstance(mean, (int, float)) else None,
        scaled(_percentile(pct, 50.0)),
        scaled(_percentile(pct, 99.0)),
        scaled(_percentile(pct, 99.9)),
    )


def _stats(section: Any) -> IoStats:
    if not isinstance(section, Mapping):
        return IoStats(0.0, 0.0, 0, 0, 0, Latency(None, None, None, None))
    # bw_bytes (B/s) since fio 3.x; older versions only have bw in KiB/s.
    bw = _num(section, "bw_bytes", -1.0)
    if bw < 0:
        bw = _num(section, "bw") * 1024
    io_bytes = int(_num(section, "io_bytes", -1.0))
    if io_bytes < 0:
        io_bytes = int(_num(section, "io_kbytes")) * 1024
    total = int(_num(section, "total_ios"))
    return IoStats(bw, _num(section, "iops"), io_bytes, total, int(_num(section, "runtime")),
                   _latency(section, total))


def parse_fio_json(text: str) -> FioOutput:
    """Parse fio's ``--output-format=json`` (tolerating notices printed before the JSON)."""
    start = text.find("{")
    while start > 0 and text[start - 1] not in "\n":
        start = text.find("{", start + 1)
    if start < 0:
        raise FioError("fio printed no JSON", "run the fio command by hand to see why")
    try:
        data = json.loads(text[start:])
    except json.JSONDecodeError as exc:
        raise FioError(f"fio's JSON output is not valid: {exc.msg}") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("jobs"), list):
        raise FioError("fio's JSON output has no 'jobs' list")
    jobs = []
    for job in data["jobs"]:
        if not isinstance(job, Mapping):
            continue
        jobs.append(FioJob(str(job.get("jobname", "")), int(_num(job, "error")),
                           _stats(job.get("read")), _stats(job.get("write"))))
    return FioOutput(str(data.get("fio version", "unknown")), tuple(jobs))


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class JobResult:
    """What one job measured, in the units the report uses."""

    name: str
    rw: RW
    block_size: int
    iodepth: int
    numjobs: int
    ioengine: str
    gbps: float
    bw_bytes: float
    iops: float
    lat_mean_us: float | None
    lat_p50_us: float | None
    lat_p99_us: float | None
    lat_p999_us: float | None
    io_bytes: int


def _us(ns: float | None) -> float | None:
    return None if ns is None else ns / 1000.0


def job_result(spec: JobSpec, output: FioOutput, ioengine: str) -> JobResult:
    """Fold fio's job entries (one, with group_reporting) into a :class:`JobResult`.

    Several entries (no group reporting) are summed for bandwidth and IOPS; their
    latency percentiles are the worst of the entries.
    """
    if not output.jobs:
        raise FioError(f"fio reported no jobs for {spec.name}")
    stats = [j.stats(spec.rw) for j in output.jobs]
    bw = sum(s.bw_bytes for s in stats)

    def worst(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    return JobResult(
        name=spec.name, rw=spec.rw, block_size=spec.block_size, iodepth=spec.iodepth,
        numjobs=spec.numjobs, ioengine=ioengine, gbps=bw / 1e9, bw_bytes=bw,
        iops=sum(s.iops for s in stats),
        lat_mean_us=_us(worst([s.clat.mean_ns for s in stats])),
        lat_p50_us=_us(worst([s.clat.p50_ns for s in stats])),
        lat_p99_us=_us(worst([s.clat.p99_ns for s in stats])),
        lat_p999_us=_us(worst([s.clat.p999_ns for s in stats])),
        io_bytes=sum(s.io_bytes for s in stats),
    )


def format_latency(us: float | None) -> str:
    """``85 us``, ``6.39 ms``, ``-`` when unknown."""
    if us is None:
        return "-"
    return f"{us:.0f} us" if us < 1000 else f"{us / 1000:.2f} ms"


def describe(result: JobResult) -> str:
    """One line about a finished job, for progress."""
    return (f"{result.rw} {size_label(result.block_size)} qd{result.iodepth} "
            f"x{result.numjobs}: {result.gbps:.2f} GB/s, {result.iops:.0f} IOPS, "
            f"p50 {format_latency(result.lat_p50_us)}, p99 {format_latency(result.lat_p99_us)}")


# ---------------------------------------------------------------- running

Progress = Callable[[int, int, JobResult], None]


def tty_progress(stream: IO[str]) -> Progress | None:
    """A progress printer on ``stream`` when it is a terminal, else None (no progress)."""
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return None

    def show(done: int, total: int, result: JobResult) -> None:
        stream.write(f"kvagent bench: [{done}/{total}] {describe(result)}\n")
        stream.flush()

    return show


def fio_version(runner: Runner, fio: str = "fio") -> str:
    """``fio-3.33``; :class:`FioNotFound` when fio is missing."""
    try:
        result = runner([fio, "--version"], timeout=30, check=False)
    except CommandNotFound:
        raise FioNotFound() from None
    if result.returncode != 0:
        raise FioError(f"fio --version failed (exit {result.returncode})", INSTALL_HINT)
    return result.stdout.strip() or "unknown"


def detect_ioengine(runner: Runner, fio: str = "fio") -> str:
    """``libaio`` when this fio has it, else ``psync``."""
    try:
        result = runner([fio, "--enghelp"], timeout=30, check=False)
    except CommandNotFound:
        raise FioNotFound() from None
    engines = {line.strip() for line in result.stdout.splitlines()}
    return "libaio" if "libaio" in engines else "psync"


def _failure_hint(message: str) -> str:
    low = message.lower()
    if "direct" in low or "invalid argument" in low:
        return ("the filesystem may not support O_DIRECT (tmpfs, overlay); bench a directory "
                "on the pool's own filesystem")
    if "no space" in low:
        return "free space on the filesystem or use --profile quick"
    if "permission" in low or "read-only" in low:
        return "run as a user that can write to the directory"
    return "run the fio command shown with -v to see its full output"


def run_job(runner: Runner, spec: JobSpec, directory: Path, profile: Profile,
            ioengine: str, fio: str = "fio") -> JobResult:
    """Run one job; :class:`FioError` with fio's own complaint if it fails."""
    argv = fio_argv(spec, directory, profile, ioengine, fio)
    try:
        result = runner(argv, timeout=job_timeout(spec, profile), check=False)
    except CommandNotFound:
        raise FioNotFound() from None
    lines = [ln for ln in (result.stderr + "\n" + result.stdout).splitlines()
             if ln.strip().startswith("fio:") or "error" in ln.lower()]
    if result.returncode != 0:
        last = lines[-1].strip() if lines else (result.stderr.strip().splitlines() or
                                                ["no output"])[-1]
        log.debug("fio failed", argv=argv, stderr=result.stderr)
        raise FioError(f"fio job {spec.name} in {directory} failed (exit "
                       f"{result.returncode}): {last}", _failure_hint(last))
    output = parse_fio_json(result.stdout)
    failed = [j for j in output.jobs if j.error]
    if failed:
        raise FioError(f"fio job {spec.name} in {directory} reported error {failed[0].error} "
                       f"({os.strerror(failed[0].error)})",
                       _failure_hint(os.strerror(failed[0].error)))
    return job_result(spec, output, ioengine)


def run_jobs(runner: Runner, specs: Sequence[JobSpec], directory: Path, profile: Profile,
             ioengine: str, progress: Progress | None = None,
             fio: str = "fio") -> list[JobResult]:
    """Run the jobs in order in ``directory``, reporting each as it finishes."""
    results = []
    for i, spec in enumerate(specs, 1):
        result = run_job(runner, spec, directory, profile, ioengine, fio)
        results.append(result)
        if progress is not None:
            progress(i, len(specs), result)
    return results


def check_space(directory: Path, profile: Profile, largest_block: int = 0) -> None:
    """Fail before starting when the files would not fit (each parallel job has one)."""
    need = profile.job_file_size(largest_block) * profile.max_numjobs
    free = shutil.disk_usage(directory).free
    if free < need + 64 * MIB:
        raise KvagentError(
            f"{directory} has {free / GIB:.1f} GiB free; the {profile.name} profile needs "
            f"{need / GIB:.1f} GiB for its files",
            "free space, or use --profile quick" if profile.name != "quick" else
            "free space on the filesystem")


@contextmanager
def scratch_dir(parent: Path) -> Iterator[Path]:
    """A fresh hidden directory for fio's files under ``parent``, removed afterwards.

    Only what fio wrote there (``kvbench.*``) is deleted, then the directory itself.
    """
    try:
        path = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=parent))
    except OSError as exc:
        raise KvagentError(f"cannot create a scratch directory in {parent}: "
                           f"{exc.strerror or exc}",
                           _failure_hint(str(exc.strerror or exc))) from None
    try:
        yield path
    finally:
        remove_scratch(path)


def remove_scratch(path: Path) -> None:
    """Delete fio's files in a scratch directory and the directory (warn, never raise)."""
    try:
        for entry in path.iterdir():
            if entry.name.startswith(FILE_PREFIX + ".") and entry.is_file():
                entry.unlink()
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove the benchmark's scratch directory", path=str(path),
                    reason=str(exc))

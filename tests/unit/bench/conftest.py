"""Shared helpers for the bench tests: the recorded fio fixtures and a fio-answering FakeRunner."""

from __future__ import annotations

import re
from pathlib import Path

from agent.system.run import CommandResult
from tests.unit.fakerunner import FakeRunner

FIXTURES = Path(__file__).parent / "fixtures"
# Recorded on this machine with fio 3.33 (ext4 on virtio, O_DIRECT, libaio) by running
# agent.bench.fio.fio_argv(...) for these jobs with a 64 MiB file and 1 s runtime.
READ_2M = "fio-3.33-read-2MiB-qd8-j1.json"
WRITE_256K = "fio-3.33-write-256KiB-qd1-j1.json"
READ_8M_J2 = "fio-3.33-read-8MiB-qd4-j2.json"
ENGHELP = "Available IO engines:\n\tcpuio\n\tmmap\n\tsync\n\tpsync\n\tlibaio\n\tio_uring\n"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def fake_fio(engines: str = ENGHELP, create_files: bool = True) -> FakeRunner:
    """A FakeRunner that answers like fio 3.33: reads get the 2 MiB read fixture, writes the
    256 KiB write fixture; like fio, each job creates its files in --directory."""
    runner = FakeRunner()
    runner.on(["fio", "--version"], "fio-3.33\n")
    runner.on(["fio", "--enghelp"], engines)

    def job(argv: tuple[str, ...], _stdin: str | None) -> CommandResult:
        opts = dict(a[2:].split("=", 1) for a in argv[1:] if a.startswith("--") and "=" in a)
        if create_files:
            for n in range(int(opts["numjobs"])):
                (Path(opts["directory"]) / f"kvbench.{n}").write_bytes(b"x" * 4096)
        name = READ_2M if opts["rw"] == "read" else WRITE_256K
        return CommandResult(argv, 0, fixture_text(name), "")

    runner.on_call(["fio", "--output-format=json"], job)
    return runner


def fio_jobs(runner: FakeRunner) -> list[dict[str, str]]:
    """The options of every fio job the runner was asked to run."""
    return [dict(a[2:].split("=", 1) for a in c[1:] if re.match(r"--\w+=", a))
            for c in runner.ran("fio", "--output-format=json")]

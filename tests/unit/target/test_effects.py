"""Every side effect of a storage-side pass is a failpoint step; a converged pass takes none.

A cold apply of a file pool (its directories, the files allocated and renamed into
place, records, configfs) logs a step of each kind; the next apply logs none. Unexport
and ``kvagent pool destroy`` remove through the seam too, and the pass after them takes
no step. (The configfs is wrapped as the real pass wraps its own.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent import failpoints
from agent.target.inventory import destroy_pool
from tests.unit.fakerunner import FakeRunner

from .helpers import H1, Target, config, file_pool

Steps = Callable[[], list[tuple[str, str]]]


@pytest.fixture
def steps(tmp_path: Path, target: Target) -> Iterator[Steps]:
    """The steps logged since the last call, as (kind, subject)."""
    log = tmp_path / "steps.log"
    failpoints.configure(f"log={log}")
    target.fs = failpoints.wrap_configfs(target.fs)

    def read() -> list[tuple[str, str]]:
        rows = [line.split("\t") for line in log.read_text().splitlines()] \
            if log.exists() else []
        log.unlink(missing_ok=True)
        return [(kind, subject) for _, kind, subject in rows]

    yield read
    failpoints.configure(None)


def changing_commands(target: Target, since: int) -> list[tuple[str, ...]]:
    """Commands that change something (modprobe aside: these configs read the host's
    /sys/module, where nvmet is not loaded; on a target it is after the first pass)."""
    return [c for c in target.runner.calls[since:]
            if failpoints.changes_something(c) and c[0] != "modprobe"]


def test_a_cold_apply_is_steps_and_the_next_takes_none(target: Target, tmp_path: Path,
                                                      steps: Steps) -> None:
    cfg = config(tmp_path, [file_pool(tmp_path, hosts=(("gpu-1", H1),))])
    assert target.run(cfg).ok
    cold = steps()
    kinds = {k for k, _ in cold}
    assert {"dir.make", "file.allocate", "file.rename", "record", "configfs.mkdir",
            "configfs.write", "configfs.symlink"} <= kinds, kinds
    pool_dir = tmp_path / "files/kv"
    assert ("dir.make", str(pool_dir)) in cold and ("dir.make", str(pool_dir / "gpu-1")) in cold
    calls = len(target.runner.calls)
    again = target.run(cfg)
    assert again.ok and not again.changed
    assert steps() == []
    assert changing_commands(target, calls) == []


def test_unexport_and_destroy_are_steps_then_nothing(target: Target, tmp_path: Path,
                                                     steps: Steps) -> None:
    assert target.run(config(tmp_path, [file_pool(tmp_path, hosts=(("gpu-1", H1),))])).ok
    steps()
    assert target.run(config(tmp_path, [])).ok
    assert {k for k, _ in steps()} >= {"configfs.rmdir", "record"}
    assert target.run(config(tmp_path, [])).ok
    assert steps() == []
    pool_dir = tmp_path / "files/kv"
    done = destroy_pool(config(tmp_path, []), "kv", FakeRunner(), yes=True, fs=target.fs)
    assert done["destroyed"]
    gone = steps()
    assert ("file.remove", str(pool_dir / "gpu-1/ns1.img")) in gone
    assert ("record.remove", str(pool_dir / ".kvagent-pool.json")) in gone
    assert ("dir.remove", str(pool_dir / "gpu-1")) in gone
    assert ("dir.remove", str(pool_dir)) in gone
    assert target.run(config(tmp_path, [])).ok
    assert steps() == []

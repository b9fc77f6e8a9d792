"""agent/effects.py: each write keeps its safety properties and is one failpoint step."""

from __future__ import annotations

import ast
import os
import re
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent import effects, failpoints
from agent.initiator.identity import ensure_host_identity
from agent.initiator.nvme.options import FABRICS_DEV, FABRICS_WRITER

REPO = Path(__file__).resolve().parents[2]
Steps = Callable[[], list[tuple[str, str]]]


@pytest.fixture
def steps(tmp_path: Path) -> Iterator[Steps]:
    log = tmp_path / "steps.log"
    failpoints.configure(f"log={log}")

    def read() -> list[tuple[str, str]]:
        rows = [line.split("\t") for line in log.read_text().splitlines()] \
            if log.exists() else []
        log.unlink(missing_ok=True)
        return [(kind, subject) for _, kind, subject in rows]

    yield read
    failpoints.configure(None)


def test_write_file_is_atomic_with_its_mode_and_one_step(tmp_path: Path, steps: Steps) -> None:
    path = tmp_path / "d/engine.yaml"
    path.parent.mkdir()
    effects.write_file(path, "a: 1\n")
    assert path.read_text() == "a: 1\n" and stat.S_IMODE(path.stat().st_mode) == 0o644
    effects.write_file(path, "secret\n", 0o600, kind="secret.write")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert steps() == [("file.write", str(path)), ("secret.write", str(path))]
    assert os.listdir(path.parent) == ["engine.yaml"]  # no temp file left


def test_write_file_replaces_a_link_and_never_writes_through_it(tmp_path: Path,
                                                                steps: Steps) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "cfg").symlink_to(victim)
    effects.write_file(tmp_path / "cfg", "new\n")
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "cfg").is_symlink()
    planted = tmp_path / f".cfg2.{os.getpid()}.tmp"
    planted.symlink_to(victim)  # a link at the temp name: O_EXCL | O_NOFOLLOW refuses it
    with pytest.raises(FileExistsError):
        effects.write_file(tmp_path / "cfg2", "new\n")
    assert victim.read_text() == "precious\n"


def test_create_file_only_when_absent(tmp_path: Path, steps: Steps) -> None:
    path = tmp_path / "hostid"
    assert effects.create_file(path, "one\n", 0o644)
    assert not effects.create_file(path, "two\n", 0o644)
    assert path.read_text() == "one\n" and stat.S_IMODE(path.stat().st_mode) == 0o644
    assert steps() == [("file.create", str(path))]
    assert os.listdir(tmp_path) == ["hostid"]


def test_sysfs_writes_open_every_file_first(tmp_path: Path, steps: Steps) -> None:
    a, b = tmp_path / "dhchap_secret", tmp_path / "dhchap_ctrl_secret"
    a.write_text("old-a\n")
    with pytest.raises(FileNotFoundError):  # (O_TRUNC would empty a regular file; sysfs
        effects.sysfs_write_all([(a, "DHHC-1:00:new:\n"), (b, "x\n")])  # ignores it)
    assert a.read_text() == "old-a\n" and steps() == []
    b.write_text("old-b\n")
    effects.sysfs_write_all([(a, "DHHC-1:00:new:\n"), (b, "x\n")], truncate=True)
    assert a.read_text() == "DHHC-1:00:new:\n" and b.read_text() == "x\n"
    assert steps() == [("sysfs.write", str(a)), ("sysfs.write", str(b))]  # no secret


def test_directories_and_removals_are_steps_only_when_they_change(tmp_path: Path,
                                                                  steps: Steps) -> None:
    top = tmp_path / "a"
    made = effects.make_dirs(top / "b/c", 0o700)
    assert made == [str(top), str(top / "b"), str(top / "b/c")]
    assert stat.S_IMODE((top / "b/c").stat().st_mode) == 0o700
    assert effects.make_dirs(top / "b/c", 0o700) == []
    assert not effects.mkdir(top, exist_ok=True)
    fd = os.open(top / "b/c", os.O_RDONLY | os.O_DIRECTORY)
    try:
        effects.fchmod(fd, 0o750, subject=str(top / "b/c"))
        effects.fchown(fd, os.getuid(), os.getgid(), subject=str(top / "b/c"))
    finally:
        os.close(fd)
    assert stat.S_IMODE((top / "b/c").stat().st_mode) == 0o750
    assert not effects.unlink(top / "nothing", missing_ok=True)
    (top / "b/c/f").write_text("")
    assert effects.unlink(top / "b/c/f")
    effects.rmdir(top / "b/c")
    effects.remove_tree(top)
    assert steps() == [("dir.make", str(top)), ("dir.make", str(top / "b")),
                       ("dir.make", str(top / "b/c")), ("dir.mode", str(top / "b/c")),
                       ("dir.owner", str(top / "b/c")), ("file.remove", str(top / "b/c/f")),
                       ("dir.remove", str(top / "b/c")), ("tree.remove", str(top))]


def test_make_dirs_refuses_a_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(FileExistsError):
        effects.make_dirs(tmp_path / "f/d")


def step_kinds() -> set[str]:
    """Every constant step kind in agent/: ``failpoints.step("k", ...)``, an effects
    call's ``kind="k"`` and the kinds agent/effects.py steps itself."""
    kinds = set()
    for path in (REPO / "agent").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and path.name == "effects.py":
                kinds |= {d.value for a, d in zip(node.args.kwonlyargs,
                                                  node.args.kw_defaults, strict=True)
                          if a.arg == "kind" and isinstance(d, ast.Constant)}
            if not isinstance(node, ast.Call):
                continue
            func = ast.unparse(node.func)
            if func == "failpoints.step" and node.args \
                    and isinstance(node.args[0], ast.Constant):
                kinds.add(node.args[0].value)
            if func.startswith("effects.") or path.name == "effects.py":
                kinds |= {k.value.value for k in node.keywords if k.arg == "kind"
                          and isinstance(k.value, ast.Constant)}
    return kinds


def test_every_step_kind_is_documented_in_failpoints() -> None:
    doc = failpoints.__doc__ or ""
    documented = set(re.findall(r"``([a-z]+(?:\.[a-z]+)?)``", doc))
    kinds = step_kinds() | {f"configfs.{op}" for op in ("write", "mkdir", "rmdir", "symlink",
                                                         "unlink")}
    assert {"record", "command", "record.remove", "secret.write", "file.allocate",
            "sysfs.write", "dir.make", "dir.owner", "dir.mode", "dir.remove", "tree.remove",
            "file.create", "quota.limit"} <= kinds, kinds
    assert kinds <= documented, sorted(kinds - documented)


def test_the_fabrics_write_is_a_command_step() -> None:
    """/dev/nvme-fabrics is written by a child command run through the runner (never in
    process): the runner counts it as a ``command`` step."""
    assert failpoints.changes_something([sys.executable, "-I", "-S", FABRICS_WRITER,
                                         FABRICS_DEV])


def test_the_host_identity_is_made_once(tmp_path: Path, steps: Steps) -> None:
    nvme = tmp_path / "etc/nvme"
    first = ensure_host_identity(nvme)
    assert steps() == [("dir.make", str(tmp_path / "etc")), ("dir.make", str(nvme)),
                       ("file.create", str(nvme / "hostid")),
                       ("file.create", str(nvme / "hostnqn"))]
    assert stat.S_IMODE(nvme.stat().st_mode) == 0o755 & ~_umask()
    assert ensure_host_identity(nvme).hostnqn == first.hostnqn
    assert steps() == []


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

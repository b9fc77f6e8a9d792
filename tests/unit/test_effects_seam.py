"""The effects seam (agent/effects.py) stays the only way a pass writes to the system.

Every side effect of a pass must be a failpoint step (agent/failpoints.py), or the crash
tests never kill a pass right after it and a pass that makes it every time still looks
converged. Steps come from a few seams: configfs (the driver, counted by
``failpoints.wrap_configfs``), commands (the runner), records (``agent.state``) and
agent.effects for everything else. This test reads every module of agent/ and nvmet/
(its syntax tree, not its text) and fails on a call that writes to the system anywhere
else: a raw ``os.mkdir``, ``Path.write_text``, ``open(..., "w")`` or ``os.open`` with
write flags added to, say, agent/initiator/ needs to go through agent.effects instead.

What the pass never runs, or what is a step by other means, is listed in
:data:`ALLOWED` with the reason. (A call is judged by what the code says: ``os.open``
with its flags in a variable, or a write through an object passed in, is not seen.)
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SEAM = "agent/effects.py"

#: ``os.<name>(...)`` calls that change the filesystem.
OS_WRITES = frozenset({
    "write", "pwrite", "writev", "mkdir", "makedirs", "chown", "lchown", "fchown", "chmod",
    "lchmod", "fchmod", "rename", "renames", "replace", "unlink", "remove", "removedirs",
    "rmdir", "symlink", "link", "truncate", "ftruncate", "posix_fallocate", "mknod",
    "mkfifo", "utime",
})
#: ``shutil.<name>(...)`` calls that change the filesystem.
SHUTIL_WRITES = frozenset({"rmtree", "move", "copy", "copy2", "copyfile", "copytree",
                           "chown"})
#: ``tempfile.<name>(...)`` calls that create files or directories.
TEMPFILE_WRITES = frozenset({"mkstemp", "mkdtemp", "NamedTemporaryFile",
                             "TemporaryDirectory", "TemporaryFile", "SpooledTemporaryFile"})
MODULE_WRITES = {"os": OS_WRITES, "shutil": SHUTIL_WRITES, "tempfile": TEMPFILE_WRITES}
#: ``<path>.<name>(...)`` methods of pathlib.Path that change the filesystem.
PATH_WRITES = frozenset({"write_text", "write_bytes", "mkdir", "unlink", "rmdir", "rename",
                         "symlink_to", "hardlink_to", "touch", "chmod", "lchmod"})
#: Receivers whose ``mkdir``/``unlink``/``rmdir`` are the configfs driver's (counted by
#: failpoints.wrap_configfs), not pathlib's.
CONFIGFS_RECEIVERS = frozenset({"fs", "self.fs", "self._fs", "configfs", "self.configfs"})
#: ``os.open`` flags that open for writing or create.
WRITE_FLAGS = frozenset({"O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND"})

#: module -> the write calls it may make, and why (not a pass's, or a step already).
ALLOWED: dict[str, tuple[frozenset[str], str]] = {
    # -- the seams themselves ------------------------------------------------------
    SEAM: (frozenset({"*"}), "the seam: each effect, then its step"),
    "agent/state.py": (frozenset({"Path.mkdir", "os.fdopen(w)", "os.replace", "Path.unlink",
                                  "tempfile.mkstemp"}),
                       "records: write_json is the 'record' step"),
    "agent/target/backings/lvm_intent.py": (
        frozenset({"Path.mkdir", "os.mkdir", "os.open(w)", "os.fdopen(w)", "os.rename",
                   "os.unlink"}),
        "LVM intent records: each write and removal is a 'record' step; its directory "
        "is made with the first, as write_json makes a record's"),
    "nvmet/configfs.py": (frozenset({"os.open(w)", "os.write", "os.mkdir", "os.rmdir",
                                     "os.symlink", "os.unlink"}),
                          "the configfs driver: failpoints.wrap_configfs counts each change"),
    "agent/failpoints.py": (frozenset({"os.open(w)", "os.fdopen(a)", "open(w)"}),
                            "the step log itself, and the test VM's power cut (sysrq)"),
    # -- steps by other means ------------------------------------------------------
    "agent/target/backings/file.py": (
        frozenset({"os.open(w)", "os.posix_fallocate", "os.ftruncate", "os.pwrite",
                   "Path.unlink"}),
        "a pool file's allocation is the 'file.allocate' step; the O_DIRECT probe is a "
        "scratch file made and removed in one call (nothing of it stays)"),
    "agent/engines/cleaner.py": (frozenset({"os.unlink"}),
                                 "the cache files a cleaner run deletes: the run is one "
                                 "'engine.clean' step"),
    "agent/initiator/nvme/fabrics_writer.py": (
        frozenset({"os.open(w)", "os.write"}),
        "a child command (python fabrics_writer.py /dev/nvme-fabrics) run through the "
        "runner: a 'command' step"),
    # -- scratch files a pass makes and removes at once ----------------------------
    "agent/system/probes.py": (frozenset({"os.open(w)", "os.unlink", "os.posix_fallocate"}),
                               "mount probes: scratch files written and removed in one call"),
    "agent/engines/checks/check_lmcache.py": (
        frozenset({"tempfile.TemporaryDirectory", "open(w)"}),
        "the engine's own config parser reads the render from a private temp directory"),
    # -- not part of a pass: CLI output, generators, bench, daemon, health ----------
    "agent/cli/target_cmd.py": (frozenset({"os.open(w)", "os.fdopen(w)", "os.fchmod"}),
                                "CLI output (a saved configfs tree, 0600)"),
    "agent/cli/manpage.py": (frozenset({"Path.write_text"}), "the man page generator"),
    "agent/cli/completion.py": (frozenset({"Path.mkdir", "Path.write_text"}),
                                "shell completion install (a CLI command)"),
    "agent/config/reference.py": (frozenset({"Path.write_text"}),
                                  "the config reference generator"),
    "agent/bench/fio.py": (frozenset({"Path.unlink", "Path.rmdir", "tempfile.mkdtemp"}),
                           "bench scratch files (kvagent bench)"),
    "agent/health/metrics.py": (frozenset({"open(wb)", "os.rename", "os.remove"}),
                                "the health textfile (the daemon's metrics, each tick)"),
    "agent/rundir.py": (frozenset({"Path.mkdir", "os.fchmod"}),
                        "the run directory: the apply lock and daemon files on /run"),
    "agent/daemonfiles.py": (frozenset({"os.unlink"}), "the daemon's files in the run dir"),
    "agent/health/statussock.py": (frozenset({"os.fchmod", "os.chmod", "os.unlink"}),
                                   "the daemon's status socket in the run dir (0600; a "
                                   "stale one of its own replaced, its own removed)"),
    "agent/health/wakeup.py": (frozenset({"os.write"}),
                               "a byte into the daemon's own wake pipe (a stop)"),
    "agent/system/boxed.py": (frozenset({"os.write"}),
                              "the input of a boxed program (kvagent engines check), into "
                              "its stdin pipe"),
}


def dotted(node: ast.AST) -> str:
    """``a.b.c`` of a Name/Attribute chain ('' for anything else)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def _mode(call: ast.Call, index: int) -> str | None:
    """The constant mode string of ``open``/``fdopen`` (None: not a constant)."""
    args = call.args[index:index + 1] or [k.value for k in call.keywords if k.arg == "mode"]
    if not args:
        return "r"
    return args[0].value if isinstance(args[0], ast.Constant) and isinstance(
        args[0].value, str) else None


def _writes(mode: str | None) -> bool:
    return mode is None or any(c in mode for c in "wax+")


def _flags(call: ast.Call) -> set[str]:
    node = call.args[1] if len(call.args) > 1 else next(
        (k.value for k in call.keywords if k.arg == "flags"), None)
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)} | {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name)} if node else set()


def writes_in(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, call) of every call in ``tree`` that writes to the system."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func)
        head, _, attr = name.rpartition(".")
        if attr in MODULE_WRITES.get(head, ()):
            yield node.lineno, name
        elif head == "os" and attr == "open" and _flags(node) & WRITE_FLAGS:
            yield node.lineno, "os.open(w)"
        elif head == "os" and attr == "fdopen" and _writes(_mode(node, 1)):
            yield node.lineno, f"os.fdopen({_mode(node, 1) or '?'})"
        elif name == "open" and _writes(_mode(node, 1)):
            yield node.lineno, f"open({_mode(node, 1) or '?'})"
        elif (isinstance(node.func, ast.Attribute) and attr == "open" and head != "os"
              and _writes(_mode(node, 0))):
            yield node.lineno, f"Path.open({_mode(node, 0) or '?'})"
        elif (isinstance(node.func, ast.Attribute) and node.func.attr in PATH_WRITES
              and head not in ("os", "effects") and head not in CONFIGFS_RECEIVERS):
            yield node.lineno, f"Path.{node.func.attr}"


def modules() -> list[Path]:
    return sorted(p for top in ("agent", "nvmet") for p in (REPO / top).rglob("*.py"))


def violations(path: Path, rel: str) -> list[str]:
    allowed = ALLOWED.get(rel, (frozenset(), ""))[0]
    return [f"{rel}:{line}: {call}" for line, call in writes_in(ast.parse(path.read_text()))
            if "*" not in allowed and call not in allowed]


def test_every_write_goes_through_the_seam() -> None:
    found = [v for p in modules() for v in violations(p, p.relative_to(REPO).as_posix())]
    assert not found, ("writes outside agent/effects.py (route them through it, so each "
                       "is a failpoint step):\n" + "\n".join(found))


def test_the_allow_list_names_only_writes_that_are_there() -> None:
    for rel, (calls, why) in ALLOWED.items():
        path = REPO / rel
        assert path.is_file(), rel
        assert why, rel
        made = {call for _, call in writes_in(ast.parse(path.read_text()))}
        gone = set() if "*" in calls else calls - made
        assert not gone, f"{rel} no longer makes {sorted(gone)}: drop it from ALLOWED"


@pytest.mark.parametrize("line", [
    "os.write(fd, b'x')",
    "Path(p).write_text('x')",
    "open(p, 'w').write('x')",
    "open(p, mode='a')",
    "os.open(p, os.O_WRONLY | os.O_TRUNC)",
    "os.makedirs(d, exist_ok=True)",
    "path.open('a')",
    "path.mkdir(parents=True)",
    "os.chmod(p, 0o600)",
    "os.chown(p, 0, 0)",
    "shutil.rmtree(d)",
    "stale.unlink()",
    "os.rmdir(d)",
])
def test_a_raw_write_in_the_initiator_is_caught(tmp_path: Path, line: str) -> None:
    module = tmp_path / "sysfs.py"
    module.write_text(textwrap.dedent(f"""
        import os, shutil
        from pathlib import Path
        def f(fd, p, d, path, stale):
            {line}
        """))
    assert violations(module, "agent/initiator/sysfs.py"), line


@pytest.mark.parametrize("line", [
    "open(p).read()",
    "os.open(p, os.O_RDONLY | os.O_DIRECTORY)",
    "effects.write_file(p, 'x')",
    "effects.mkdir(p, 0o700)",
    "self.fs.mkdir('hosts/x')",
    "text.replace('a', 'b')",
])
def test_reads_seam_calls_and_configfs_are_not_writes(tmp_path: Path, line: str) -> None:
    module = tmp_path / "m.py"
    module.write_text(f"def f(p, text, self):\n    {line}\n")
    assert not violations(module, "agent/initiator/sysfs.py"), line

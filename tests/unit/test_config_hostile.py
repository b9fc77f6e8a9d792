"""Hostile config files (issue 35, finding 4): errors stay small whatever the file holds."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.main import main
from agent.config import (
    MAX_FIELD_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_PROBLEMS,
    ConfigError,
    parse_config,
)

#: 333 bytes: six levels of ten aliases, a million strings under each node field (F6: the
#: errors echoed each list whole, 43 MB on stderr).
ALIAS_BOMB = """\
version: 1
a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol,lol]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]
node: {name: *f, state_dir: *f, run_dir: *f, configfs: *f, sysfs: *f, nvme_dir: *f}
"""


def test_an_alias_bomb_gives_an_error_of_a_few_lines(tmp_path: Path) -> None:
    file = tmp_path / "kvagent.yaml"
    file.write_text(ALIAS_BOMB)
    result = CliRunner().invoke(main, ["-c", str(file), "config", "validate"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(result.stderr) < 4096, f"{len(result.stderr)} bytes of error"
    for field in ("name", "state_dir", "run_dir", "configfs", "sysfs", "nvme_dir"):
        assert any(f": node.{field}: must be " in ln and ln.endswith(", got a list")
                   for ln in lines), field


def test_a_long_value_is_echoed_cut(tmp_path: Path) -> None:
    """A value is named by its first and last characters, and the hint after it stays."""
    with pytest.raises(ConfigError) as err:
        parse_config(f"version: 1\nnode: {{name: {'x' * 100_000}}}\n")
    (problem,) = err.value.problems
    assert problem.field == "node.name" and len(problem.message) < 200
    assert problem.message.startswith("'xxx") and "is not a valid name: use 1-32" in problem.message


def test_a_long_unknown_key_and_message_are_cut_in_the_error() -> None:
    """What no echo cuts (a key in the field path, a value a model check repeats) is cut
    where every problem is made."""
    with pytest.raises(ConfigError) as err:
        parse_config(f"""\
version: 1
? {'k' * 50_000}
: 1
initiator: {{pools: [{{name: p, target: {{transport: tcp, address: 10.0.0.1}},
                      mount: /var/lib/kv, connect: {{host_iface: {'i' * 50_000}}}}}]}}
""")
    problems = err.value.problems
    assert [p.field[:3] for p in problems] == ["kkk", "ini"]
    assert all(len(p.field) <= MAX_FIELD_CHARS and len(p.message) <= MAX_MESSAGE_CHARS
               for p in problems), [(len(p.field), len(p.message)) for p in problems]
    assert "characters left out" in problems[0].field
    assert "characters left out" in problems[1].message
    assert problems[1].message.endswith("as the kernel names them)"), "the hint stays"


def test_an_error_lists_at_most_max_problems_and_counts_the_rest() -> None:
    text = "version: 1\n" + "".join(f"unknown{i}: 1\n" for i in range(MAX_PROBLEMS + 30))
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    problems = err.value.problems
    assert len(problems) == MAX_PROBLEMS + 1
    assert problems[-1].message.startswith("30 more problem(s) not shown")


def test_an_integer_python_cannot_convert_is_a_yaml_error(tmp_path: Path) -> None:
    file = tmp_path / "kvagent.yaml"
    file.write_text("version: " + "1" * 5000 + "\n")
    result = CliRunner().invoke(main, ["-c", str(file), "config", "validate"])
    assert result.exit_code == 2, result.output
    assert f"kvagent: config error: {file}: (yaml): not valid YAML: " in result.stderr
    assert "internal error" not in result.output and "set_int_max_str_digits" not in \
        result.output


# ------------------------------------------- the directories above the config (F7)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the rule is root's; the test "
                                "needs root to chown")
VALID = "version: 1\nnode: {name: unit}\n"


def validate(file: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["-c", str(file), "config", "validate"])
    assert "Traceback" not in result.output
    return result.exit_code, result.stderr


@needs_root
def test_a_config_whose_directory_another_user_owns_is_refused(tmp_path: Path) -> None:
    """F7: the directory's owner swaps in a link to any root-owned YAML (or a file of its
    own making, root's because root made it earlier): only the file itself was checked."""
    elsewhere = tmp_path / "root-only"
    elsewhere.mkdir()
    (elsewhere / "other.yaml").write_text(VALID)
    users = tmp_path / "users"
    users.mkdir(mode=0o755)
    os.chown(users, 1000, 1000)
    (users / "kvagent.yaml").write_text(VALID)  # root's, mode 0644: the file passes
    code, err = validate(users / "kvagent.yaml")
    assert code == 2 and f"(file): the directory {users} above it is owned by uid 1000" in err
    (users / "kvagent.yaml").unlink()
    (users / "kvagent.yaml").symlink_to(elsewhere / "other.yaml")
    code, err = validate(users / "kvagent.yaml")
    assert code == 2 and f"the directory {users} above it is owned by uid 1000" in err


@needs_root
@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775], ids=oct)
def test_a_config_below_a_directory_others_may_write_is_refused(tmp_path: Path,
                                                                  mode: int) -> None:
    """Sticky or not: a config below a world-writable directory is not root's alone."""
    shared = tmp_path / "shared"
    inner = shared / "kvagent"
    inner.mkdir(parents=True)
    (inner / "kvagent.yaml").write_text(VALID)
    os.chmod(shared, mode)
    if mode == 0o775:
        os.chown(shared, 0, 100)  # a group other than root's
    code, err = validate(inner / "kvagent.yaml")
    assert code == 2, err
    assert f"the directory {shared} above it is writable by its group or by everyone " \
           f"(mode {mode:04o}" in err


@needs_root
def test_a_config_that_is_a_link_or_reached_through_one_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "kvagent.yaml").write_text(VALID)
    assert validate(real / "kvagent.yaml") == (0, "")
    (tmp_path / "link.yaml").symlink_to(real / "kvagent.yaml")
    code, err = validate(tmp_path / "link.yaml")
    assert code == 2 and "is a symbolic link (to " in err and "give the real path" in err
    (tmp_path / "dirlink").symlink_to(real)
    code, err = validate(tmp_path / "dirlink" / "kvagent.yaml")
    assert code == 2 and f"is reached through {tmp_path}/dirlink, a symbolic link" in err


@needs_root
def test_a_relative_config_path_is_checked_from_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kvagent.yaml").write_text(VALID)
    monkeypatch.chdir(tmp_path)
    assert validate(Path("kvagent.yaml")) == (0, "")
    os.chmod(tmp_path, 0o777)
    code, err = validate(Path("kvagent.yaml"))
    assert code == 2 and f"the directory {tmp_path} above it is writable" in err


@needs_root
def test_a_fifo_as_the_config_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "kvagent.yaml"
    os.mkfifo(fifo, 0o644)
    proc = subprocess.run([sys.executable, "-m", "agent", "-c", str(fifo), "config",
                           "validate"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 2 and "is not a regular file" in proc.stderr, proc.stderr


def test_directories_are_judged_like_the_file_and_only_for_root() -> None:
    from agent.config import directory_trust_problem

    def status(mode: int, uid: int, gid: int = 0) -> os.stat_result:
        return os.stat_result((stat.S_IFDIR | mode, 0, 0, 1, uid, gid, 10, 0, 0, 0))

    assert directory_trust_problem(status(0o755, 0), 0) is None
    assert directory_trust_problem(status(0o775, 0), 0) is None  # root's group
    assert "mode 0775, group 100" in directory_trust_problem(status(0o775, 0, 100), 0)
    assert "mode 1777" in directory_trust_problem(status(0o1777, 0), 0)
    assert "uid 1000" in directory_trust_problem(status(0o755, 1000), 0)
    assert directory_trust_problem(status(0o1777, 1000), 1000) is None  # not root


def test_a_reload_to_an_alias_bomb_keeps_a_small_error(tmp_path: Path) -> None:
    """The error a refused reload keeps (kvagent status, /metrics' problems, the log)."""
    from structlog.testing import capture_logs

    from agent.config import load_config
    from agent.daemon import Agent
    from agent.health.notify import Notifier
    from tests.unit.fakerunner import FakeRunner
    from tests.unit.test_daemon import free_port, write_config

    config = tmp_path / "kvagent.yaml"
    write_config(config, tmp_path, free_port())
    agent = Agent(str(config), load_config(config), runner=FakeRunner(),
                  notifier=Notifier(env={}))
    config.write_text(ALIAS_BOMB)
    with capture_logs() as logs:
        assert agent.reload() is None
    assert agent.config_error is not None and len(agent.config_error) < 4096
    assert "node.nvme_dir: must be an absolute path, got a list" in agent.config_error
    (entry,) = [e for e in logs if e["event"].startswith("config reload refused")]
    assert len(entry["error"]) < 4096

"""Hostile config files (issue 35, finding 4): errors stay small whatever the file holds."""

from __future__ import annotations

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

"""With ``-o json``, every command's failure is one JSON object on stdout (issue 35).

Before, stdout was empty on every error (``config validate -o json`` on a bad file printed
no JSON): a script had to scrape stderr. The object (agent/cli/failure.py, documented in
docs/operations.md): ``error``, ``kind``, ``file``, ``line``, ``field``, ``hint``,
``exit_code`` (the process's), ``problems`` for a config kvagent refuses.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from agent.cli import config_cmd
from agent.cli.main import main

KEY = "DHHC-1:00:9lAaxDtx/7OzVJ4DSK8GVjJzTXhkX6H33s0NrjSbC6fG7BZ+:"


@dataclass
class Host:
    """Files the cases point at."""

    root: Path
    good: Path = field(init=False)
    bad: Path = field(init=False)
    missing: Path = field(init=False)
    key: Path = field(init=False)

    def __post_init__(self) -> None:
        self.good = self.root / "good.yaml"
        self.good.write_text(f"""version: 1
node: {{name: gpu-01, state_dir: {self.root}/state, run_dir: {self.root}/run}}
initiator:
  pools:
    - name: kv
      target: {{transport: tcp, address: 10.0.0.1}}
      mount: {self.root}/mnt/kv
      engines: [{{kind: lmcache, capacity: 50%}}]
""")
        self.bad = self.root / "bad.yaml"
        self.bad.write_text("version: 1\nnode:\n  name: gpu-01\n  colour: blue\n")
        self.missing = self.root / "missing.yaml"
        self.key = self.root / "key"
        self.key.write_text(KEY + "\n")
        self.key.chmod(0o600)
        for f in (self.good, self.bad):
            f.chmod(0o600)


@dataclass(frozen=True)
class Case:
    """A command line that fails, and what its error object must say."""

    argv: Callable[[Host], list[str]]
    exit_code: int
    kind: str
    #: fields of the error object, as a function of the host (None: not checked)
    where: Callable[[Host], dict[str, object]] | None = None


def bad_config(h: Host) -> dict[str, object]:
    return {"file": str(h.bad), "line": 4, "field": "node.colour"}


def missing_config(h: Host) -> dict[str, object]:
    return {"file": str(h.missing)}


#: Every leaf command, with a failure of its own where it has one (a refused argument,
#: an operation that fails here), else the config it cannot load.
CASES: dict[str, Case] = {
    "apply": Case(lambda h: ["-c", str(h.good), "apply", "--rebind", "nope"], 2, "usage",
                  lambda h: {"field": "--rebind"}),
    "bench": Case(lambda h: ["-c", str(h.good), "bench", "nope"], 2, "usage"),
    "config validate": Case(lambda h: ["config", "validate", str(h.bad)], 2, "config",
                            bad_config),
    "engines check": Case(lambda h: ["-c", str(h.good), "engines", "check", "kv",
                                     "--engine", "lmcache"], 1, "failed"),
    "engines render": Case(lambda h: ["-c", str(h.good), "engines", "render", "nope",
                                      "--engine", "lmcache"], 2, "usage"),
    "keys generate": Case(lambda h: ["keys", "generate", str(h.key)], 2, "usage",
                          lambda h: {"field": "FILE"}),
    "keys show": Case(lambda h: ["keys", "show", str(h.good)], 2, "usage",
                      lambda h: {"field": "FILE"}),
    "plan": Case(lambda h: ["-c", str(h.bad), "plan"], 2, "config", bad_config),
    "pool destroy": Case(lambda h: ["-c", str(h.missing), "pool", "destroy", "kv"], 2,
                         "config", missing_config),
    "pool list": Case(lambda h: ["-c", str(h.missing), "pool", "list"], 2, "config",
                      missing_config),
    "run": Case(lambda h: ["-c", str(h.bad), "run"], 2, "config", bad_config),
    "status": Case(lambda h: ["-c", str(h.bad), "status"], 2, "config", bad_config),
    "target export": Case(lambda h: ["target", "export", "--configfs", str(h.root / "no")],
                          1, "failed"),
    "target show": Case(lambda h: ["target", "show", "--configfs", str(h.root / "no")], 1,
                        "failed"),
    "wait": Case(lambda h: ["-c", str(h.good), "wait", "nope"], 2, "usage",
                 lambda h: {"field": "POOLS"}),
}

#: click's refusals of a command line, -o json given before or after the command.
USAGE: dict[str, tuple[list[str], str | None]] = {
    "unknown option": (["-o", "json", "status", "--bogus"], "--bogus"),
    "unknown option, -o after": (["status", "--bogus", "-o", "json"], "--bogus"),
    "missing option": (["--output-format", "json", "engines", "render", "kv"], "--engine"),
    "bad choice": (["engines", "render", "kv", "--engine", "bogus", "--output=json"],
                   "--engine"),
    "unknown command": (["-o", "json", "nope"], None),
    "missing command": (["-ojson"], None),
    "top-level option": (["-o", "json", "--bogus", "status"], "--bogus"),
}


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def invoke(argv: list[str]) -> Result:
    return CliRunner().invoke(main, argv)


def one_json_object(result: Result) -> dict[str, object]:
    """stdout is exactly one JSON object (json.loads refuses anything after it)."""
    doc = json.loads(result.stdout)
    assert isinstance(doc, dict), result.stdout
    return doc


def leaf_commands(group: click.Group, ctx: click.Context, path: str = "") -> Iterator[str]:
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None
        sub = click.Context(cmd, info_name=name, parent=ctx)
        if isinstance(cmd, click.Group):
            yield from leaf_commands(cmd, sub, f"{path}{name} ")
        else:
            yield f"{path}{name}"


def test_the_table_has_every_command() -> None:
    root = click.Context(main, info_name="kvagent")
    assert sorted(leaf_commands(main, root)) == sorted(CASES)


@pytest.mark.parametrize("placement", ["before", "after", "output-format"])
@pytest.mark.parametrize("command", sorted(CASES))
def test_every_command_s_error_is_a_json_object(host: Host, command: str,
                                                placement: str) -> None:
    case = CASES[command]
    argv = case.argv(host)
    if placement == "before":
        argv = ["-o", "json", *argv]
    elif placement == "after":
        argv = [*argv, "-o", "json"]
    else:
        argv = ["--output-format", "json", *argv]
    result = invoke(argv)
    assert result.exit_code == case.exit_code, result.output
    doc = one_json_object(result)
    assert doc["exit_code"] == case.exit_code and doc["kind"] == case.kind, doc
    assert isinstance(doc["error"], str) and doc["error"], doc
    assert {"file", "line", "field", "hint"} <= set(doc), doc
    for key, value in (case.where(host) if case.where else {}).items():
        assert doc[key] == value, (key, doc)
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", sorted(CASES))
def test_without_json_stdout_stays_empty(host: Host, command: str) -> None:
    """The message goes to stderr as before; stdout gets no object nobody asked for."""
    case = CASES[command]
    result = invoke(case.argv(host))
    assert result.exit_code == case.exit_code, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("kvagent: ")


def test_a_config_error_names_every_problem(host: Host) -> None:
    host.bad.write_text("version: 1\nnode:\n  name: gpu-01\n  colour: blue\n  size: 3\n")
    doc = one_json_object(invoke(["-o", "json", "config", "validate", str(host.bad)]))
    assert [(p["line"], p["field"]) for p in doc["problems"]] == [  # type: ignore[union-attr]
        (4, "node.colour"), (5, "node.size")]
    assert (doc["line"], doc["field"]) == (4, "node.colour")


@pytest.mark.parametrize("name", sorted(USAGE))
def test_click_s_own_refusals_are_json_objects_too(name: str) -> None:
    argv, field_name = USAGE[name]
    result = invoke(argv)
    assert result.exit_code == 2, result.output
    doc = one_json_object(result)
    assert (doc["kind"], doc["exit_code"], doc["field"]) == ("usage", 2, field_name), doc
    assert "--help" in str(doc["hint"])
    assert "Usage:" in result.stderr  # click's own message, as without -o json


def test_click_refusals_without_json_leave_stdout_empty() -> None:
    for argv, _ in USAGE.values():
        plain = [a for a in argv if a not in ("-o", "json", "--output-format", "-ojson",
                                              "--output=json")]
        result = invoke(plain)
        assert result.exit_code == 2 and result.stdout == "", (plain, result.output)


def test_an_internal_error_is_a_json_object(host: Host,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(path: str) -> dict:
        raise ZeroDivisionError("injected")

    monkeypatch.setattr(config_cmd, "_summary", bug)
    result = invoke(["-o", "json", "config", "validate", str(host.good)])
    assert result.exit_code == 1
    doc = one_json_object(result)
    assert (doc["kind"], doc["exit_code"]) == ("internal", 1)
    assert doc["error"] == "internal error: ZeroDivisionError: injected"
    assert "kvagent: internal error" in result.stderr


def test_an_operation_error_keeps_its_hint(host: Host) -> None:
    doc = one_json_object(invoke(["-o", "json", "target", "show", "--configfs",
                                  str(host.root / "no")]))
    assert "not available" in str(doc["error"]) and "modprobe nvmet" in str(doc["hint"])


def test_engines_check_puts_the_verdict_into_the_error_object(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The verdict was printed, then the error: two documents. Now one: the verdict's
    fields with the error object's."""
    import sys

    from tests.unit.initiator.test_attach_engines_cmd import Lab

    lab = Lab(tmp_path, monkeypatch)
    lab.attach()
    result = lab.run("-o", "json", "engines", "check", "kv", "--engine", "lmcache",
                     "--python", sys.executable)  # kvagent's venv: no LMCache there
    assert result.exit_code == 1, result.output
    doc = one_json_object(result)
    assert (doc["verdict"], doc["engine"], doc["kind"], doc["exit_code"]) == (
        "unavailable", "lmcache", "failed", 1)
    assert "could not be loaded" in str(doc["error"])


def test_the_agent_refusing_a_delegated_apply_s_config(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """The config changed again between the check here and the agent's reload."""
    from tests.unit.test_apply_delegation import config_text, in_process

    config = tmp_path / "kvagent.yaml"
    in_process(tmp_path, monkeypatch, before_reload=lambda: config.write_text(
        config_text(tmp_path, 9, name="BROKEN NAME")))
    result = CliRunner().invoke(main, ["-c", str(config), "-o", "json", "apply"])
    assert result.exit_code == 2
    doc = one_json_object(result)
    assert (doc["kind"], doc["file"]) == ("config", str(config))
    assert "node.name" in str(doc["problems"]) and "previous config" in str(doc["hint"])

"""The CLI starts light: nothing a command does not use is imported (issue 26).

``kvagent --version`` and a command's start import click, the standard library and
kvagent's own small modules (errors, logging set-up, the config file's path); structlog,
YAML, the config model, nvmet and the health stack come with the commands that use them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

#: Imported by no command's start; each costs more than the interpreter's own start
#: (structlog with rich: about 2x a bare ``python -c pass``).
HEAVY = ("structlog", "rich", "yaml", "agent.config.model", "agent.config.load", "nvmet",
         "prometheus_client", "pyudev", "tenacity", "agent.health", "agent.reconcile")

PROBE = """
import json, sys
from click.testing import CliRunner
from agent.cli.main import main
result = CliRunner().invoke(main, sys.argv[1:])
assert result.exit_code == 0, result.output
print(json.dumps(sorted(m for m in sys.modules)))
"""


def modules_after(*argv: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True,
                         text=True, check=True).stdout
    return set(json.loads(out))


def heavy_in(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_version_imports_nothing_heavy() -> None:
    assert heavy_in(modules_after("--version")) == []


def test_a_command_still_gets_what_it_uses() -> None:
    """The probe sees heavy imports where they happen: validating a config loads the model."""
    example = Path(__file__).resolve().parents[2] / "examples" / "storage-host.yaml"
    modules = modules_after("config", "validate", str(example))
    assert {"agent.config.model", "yaml"} <= modules


def test_what_status_and_a_config_load_import_up_front() -> None:
    """`kvagent status` asking the agent, and a config load, leave out the apply lock (and
    its progress tracker), decimal (sizes are exact integer fractions) and difflib (only
    for a mistyped key): each was a millisecond or two of every status start."""
    late = {"agent.lock", "agent.progress", "decimal", "difflib", "agent.health.collect"}
    out = subprocess.run([sys.executable, "-c", "import json, sys, agent.cli.status_cmd, "
                          "agent.config.load; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True).stdout
    assert late & set(json.loads(out)) == set()
    example = Path(__file__).resolve().parents[2] / "examples" / "storage-host.yaml"
    assert late & modules_after("config", "validate", str(example)) == set()


#: Runs the kvagent process's entry with sys.argv[1:], after registering an exit function,
#: an object that speaks when the interpreter frees it (the teardown) and, with --thread,
#: a thread that outlives the command.
ENTRY_PROBE = """
import atexit, sys, threading, time
class Speaks:
    def __del__(self):
        sys.stderr.write("teardown\\n")
freed_at_teardown = Speaks()
atexit.register(lambda: sys.stderr.write("exit function\\n"))
if sys.argv[1] == "--thread":
    del sys.argv[1]
    threading.Thread(target=lambda: (time.sleep(0.5), sys.stderr.write("thread\\n"))).start()
from agent.cli.main import entry
sys.argv[0] = "kvagent"
entry()
"""


def entry(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", ENTRY_PROBE, *argv], capture_output=True,
                          text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])


def test_the_process_ends_without_the_teardown_once_its_output_is_out() -> None:
    """The exit functions run and every byte of stdout arrives (a pipe: block-buffered),
    the same as with the interpreter's own exit; the exit code is the command's; the
    teardown (freeing every object) is skipped."""
    proc = entry("--help")
    normal = subprocess.run(
        [sys.executable, "-c", "import sys; sys.argv[0] = 'kvagent'; "
         "from agent.cli.main import main; main()", "--help"],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == normal.returncode == 0
    assert proc.stdout == normal.stdout and "Usage: kvagent" in proc.stdout
    assert proc.stderr == "exit function\n"
    proc = entry("-c", "/nonexistent/kvagent.yaml", "status")
    assert proc.returncode == 2, proc.stderr
    assert "kvagent: " in proc.stderr and proc.stderr.endswith("exit function\n")
    assert "teardown" not in proc.stderr


def test_a_thread_still_running_gets_the_normal_exit() -> None:
    """The interpreter waits for a live thread at exit; so does kvagent's process."""
    proc = entry("--thread", "--version")
    assert proc.returncode == 0 and "kvagent" in proc.stdout
    assert proc.stderr.splitlines() == ["thread", "exit function", "teardown"]

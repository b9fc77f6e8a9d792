"""``kvagent wait POOL``: the gate an engine's unit waits behind (kvagent-pool@.service).

The agent's answers are stood in for (``from_agent``); the status socket itself is
tested with ``kvagent status`` (test_cli_status.py) and the gate under systemd on the
fleet's machines (tests/vmhost/test_fleet_unit.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agent.cli import wait_cmd
from agent.cli.main import main


def write_config(tmp: Path) -> Path:
    path = tmp / "kvagent.yaml"
    path.write_text(f"""
version: 1
node: {{name: unit, state_dir: {tmp}/state, run_dir: {tmp}/run, sysfs: {tmp}/sys,
        configfs: {tmp}/configfs}}
initiator:
  pools:
    - {{name: kv, target: {{transport: tcp, address: 10.0.0.1}}, mount: {tmp}/mnt/kv}}
    - {{name: kv2, target: {{transport: tcp, address: 10.0.0.1}}, mount: {tmp}/mnt/kv2}}
""")
    return path


def pool(name: str, ready: bool, problems: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"role": "initiator", "name": name, "ready": ready,
            "state": "ok" if ready else "failed", "problems": list(problems)}


def answers(monkeypatch: pytest.MonkeyPatch, *docs: dict | None) -> list[int]:
    """The agent answers ``docs`` in turn (the last one from then on); no real sleeps."""
    asked: list[int] = []

    def from_agent(_cfg, _config_file):  # type: ignore[no-untyped-def]
        asked.append(1)
        return docs[min(len(asked), len(docs)) - 1]

    monkeypatch.setattr(wait_cmd, "from_agent", from_agent)
    monkeypatch.setattr(wait_cmd.time, "sleep", lambda _s: None)
    return asked


def wait(config: Path, *args: str, fmt: str = "json") -> Result:
    return CliRunner().invoke(main, ["-c", str(config), "-o", fmt, "wait", *args])


def test_returns_once_every_pool_is_ready(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    asked = answers(monkeypatch, None,
                    {"pools": [pool("kv", True), pool("kv2", False, ("not mounted: x",))]},
                    {"pools": [pool("kv", True), pool("kv2", True)]})
    done = wait(write_config(tmp_path), "kv", "kv2")
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    assert doc["ready"] is True and set(doc["pools"]) == {"kv", "kv2"}
    assert len(asked) == 3, "no agent, one pool not ready, then both ready"


def test_a_timeout_says_what_each_pool_lacks(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    answers(monkeypatch, {"pools": [pool("kv", False, ("controller nvme2 is connecting",))]})
    done = wait(write_config(tmp_path), "kv", "kv2", "--timeout", "0s", fmt="text")
    assert done.exit_code == 1
    assert "pool kv: not ready after" in done.stdout
    assert "controller nvme2 is connecting" in done.stdout
    assert "pool kv2: not ready" in done.stdout and "first pass" in done.stdout


def test_no_agent_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answers(monkeypatch, None)
    done = wait(write_config(tmp_path), "kv", "--timeout", "0")
    assert done.exit_code == 1
    assert "no agent answers" in json.loads(done.stdout)["pools"]["kv"]["problems"][0]


@pytest.mark.parametrize(("args", "named"), [
    (("nope",), "POOLS nope: not a GPU pool of this config (initiator.pools: kv, kv2)"),
    (("kv", "--timeout", "soon"), "--timeout soon: "),
])
def test_bad_arguments_exit_2_naming_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          args: tuple[str, ...], named: str) -> None:
    asked = answers(monkeypatch, {"pools": []})
    done = wait(write_config(tmp_path), *args, fmt="text")
    assert done.exit_code == 2 and named in done.stderr, done.output
    assert asked == [], "nothing asked of the agent"

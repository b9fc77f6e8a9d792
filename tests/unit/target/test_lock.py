"""One apply at a time: a second gets a clear "busy" error, or queues with --wait."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.main import main
from agent.lock import Busy, apply_lock


def test_second_holder_is_busy_and_names_the_first(tmp_path: Path) -> None:
    with (apply_lock(tmp_path / "run"), pytest.raises(Busy) as busy,
          apply_lock(tmp_path / "run")):
        pytest.fail("two holders of the apply lock")
    assert "another kvagent apply is running" in busy.value.message
    assert f"(lock {tmp_path / 'run' / 'apply.lock'})" in busy.value.message
    assert "--wait" in (busy.value.hint or "")
    # Released: the next one gets it.
    with apply_lock(tmp_path / "run"):
        pass


def test_wait_queues_behind_the_holder(tmp_path: Path) -> None:
    order: list[str] = []
    held = threading.Event()
    release = threading.Event()

    def first() -> None:
        with apply_lock(tmp_path):
            order.append("first in")
            held.set()
            release.wait(10)
            order.append("first out")

    t = threading.Thread(target=first)
    t.start()
    assert held.wait(10)
    threading.Timer(0.3, release.set).start()
    with apply_lock(tmp_path, wait=True, timeout=30):
        order.append("second in")
    t.join(30)
    assert not t.is_alive(), "the lock holder's thread did not end"
    assert order == ["first in", "first out", "second in"]


def test_wait_gives_up_after_its_timeout(tmp_path: Path) -> None:
    with (apply_lock(tmp_path), pytest.raises(Busy, match=r"gave up after 0\.3s waiting"),
          apply_lock(tmp_path, wait=True, timeout=0.3)):
        pytest.fail("lock taken twice")


def test_cli_apply_is_busy_then_waits(tmp_path: Path) -> None:
    """The CLI turns Busy into exit 1 with the message; --wait applies after the holder."""
    cfg = tmp_path / "kvagent.yaml"
    cfg.write_text(f"version: 1\nnode: {{name: n1, state_dir: {tmp_path}/state, "
                   f"run_dir: {tmp_path}/run}}\n")
    with apply_lock(tmp_path / "run"):
        busy = CliRunner().invoke(main, ["-c", str(cfg), "apply"])
    assert busy.exit_code == 1
    assert "another kvagent apply is running" in busy.output and "--wait" in busy.output

    release = threading.Event()
    held = threading.Event()

    def holder() -> None:
        with apply_lock(tmp_path / "run"):
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    threading.Timer(0.3, release.set).start()
    waited = CliRunner().invoke(main, ["-c", str(cfg), "-o", "json", "apply", "--wait"])
    t.join(30)
    assert not t.is_alive(), "the lock holder's thread did not end"
    assert waited.exit_code == 0, waited.output
    assert '"changed": false' in waited.output

"""``plan`` and ``apply`` say "converged" only when nothing changed and nothing failed.

Issue 35: with structlog 20.1.0 ``plan`` failed (``no attribute 'contextvars'``) and still
printed "nothing to change: converged; 0 failed action(s), 1 error(s)". A failure is
injected into each role here, where the pass's own handlers record it (the storage side's
pass, a GPU-host pool's attach or detach, the engines' hand-off), and the CLI's output must
not say converged.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent import log as kvlog
from agent.cli.apply_cmd import summary
from agent.cli.main import main
from agent.config import InitiatorPool
from agent.engines import handoff
from agent.errors import KvagentError
from agent.initiator import reconcile as initiator_reconcile
from agent.initiator.stages.handoff import MountedPool
from agent.result import ActionRecord, RunResult
from agent.target import reconcile as target_reconcile

HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-4908-8706-050403020100"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A GPU host with one pool whose identity exists already (nothing to create)."""
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    (nvme / "hostnqn").write_text(HOSTNQN + "\n")
    (nvme / "hostid").write_text(HOSTNQN.rsplit(":", 1)[1] + "\n")
    path = tmp_path / "kvagent.yaml"
    path.write_text(f"""
version: 1
node: {{name: gpu-01, state_dir: {tmp_path}/state, run_dir: {tmp_path}/run,
        nvme_dir: {nvme}, sysfs: {tmp_path}/sys, configfs: {tmp_path}/configfs}}
initiator:
  pools:
    - name: llama
      target: {{transport: tcp, address: 127.0.0.1, service: 4420}}
      mount: {tmp_path}/mnt/llama
      engines: [{{kind: lmcache, capacity: 50%}}]
""")
    path.chmod(0o600)
    return path


def attached(self: initiator_reconcile.InitiatorPass, pool: InitiatorPool, *_: object
             ) -> MountedPool:
    return MountedPool(pool, (str(pool.mount),), "tcp", remounted=False)


def raises(exc: BaseException) -> Callable[..., None]:
    def fail(*_: object, **__: object) -> None:
        raise exc
    return fail


#: (role, what is patched, its replacement): each failure is recorded by the pass itself.
FAILURES = {
    "target pass raises": ("target.TargetPass.run", raises(RuntimeError("injected"))),
    "pool attach fails": ("initiator.InitiatorPass._attach",
                          raises(KvagentError("injected: target unreachable"))),
    "pool attach raises": ("initiator.InitiatorPass._attach",
                           raises(ZeroDivisionError("injected"))),
    "pool detach fails": ("initiator.detach_pool", raises(OSError(5, "injected"))),
    "engines hand-off raises": ("handoff.hand_off", raises(RuntimeError("injected"))),
}
MODULES = {"target": target_reconcile, "initiator": initiator_reconcile, "handoff": handoff}


def patch(monkeypatch: pytest.MonkeyPatch, where: str, value: object) -> None:
    module, _, attr = where.partition(".")
    owner: object = MODULES[module]
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    monkeypatch.setattr(owner, name, value)


@pytest.fixture
def quiet_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The passes run, but touch nothing of this machine: no modules loaded, discovery
    answered by a pool that is attached already, no engines to hand off to, a former pool
    recorded only where a test asks."""
    monkeypatch.setattr(initiator_reconcile.InitiatorPass, "_load_modules",
                        lambda self, pools: None)
    monkeypatch.setattr(initiator_reconcile.InitiatorPass, "_attach", attached)
    monkeypatch.setattr(handoff, "hand_off", lambda *a, **k: None)


def run(config: Path, *argv: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["-c", str(config), *argv])
    return result.exit_code, result.stdout


@pytest.mark.parametrize("command", [["plan"], ["apply"]])
def test_a_clean_pass_says_converged(config: Path, quiet_host: None,
                                     command: list[str]) -> None:
    """The control: this host has nothing to change, and says so."""
    code, out = run(config, *command)
    assert code == 0, out
    assert out.splitlines()[-1].startswith(("nothing to change: converged",
                                            "nothing changed: converged"))


@pytest.mark.parametrize("command", [["plan"], ["apply"]])
@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_an_error_in_any_role_is_never_converged(config: Path, quiet_host: None,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 failure: str, command: list[str]) -> None:
    where, replacement = FAILURES[failure]
    patch(monkeypatch, where, replacement)
    if failure == "pool detach fails":  # an earlier apply attached a pool now dropped
        records = {"gone": object()}
        monkeypatch.setattr(initiator_reconcile.InitiatorPass, "records",
                            lambda self: records)
    code, out = run(config, *command)
    assert code == 1, out
    assert "injected" in out  # the error is reported ...
    assert "converged" not in out  # ... and the pass does not claim to be done
    assert "error(s)" in out.splitlines()[-1]


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_failed_action_alone_is_not_converged(dry_run: bool) -> None:
    result = RunResult(dry_run=dry_run, actions=[ActionRecord(
        "target", "p", "lvm.lvcreate", "vg/lv", status="failed", error="boom")])
    assert "converged" not in summary(result)
    assert "converged" in summary(RunResult(dry_run=dry_run))


def test_logging_that_cannot_be_configured_never_logs_to_stdout(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """structlog 20.1 lacks what the configuration names: the first log call failed, and
    every later one logged with structlog's defaults, on stdout among the results."""
    import structlog

    def too_old(**_: object) -> None:
        raise AttributeError("module 'structlog' has no attribute 'contextvars'")

    monkeypatch.setattr(structlog, "configure", too_old)
    kvlog._pending[0] = (0, io.StringIO(), True)  # configured at the next log call
    logger = kvlog.get_logger("test")
    for _ in range(2):
        with pytest.raises(AttributeError, match="contextvars"):
            logger.error("unexpected error")
    assert capsys.readouterr().out == ""
    monkeypatch.undo()
    kvlog.configure_logging(0)

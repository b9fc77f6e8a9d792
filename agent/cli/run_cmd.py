"""``kvagent run``."""

from __future__ import annotations

import contextlib
import faulthandler
import sys

import click

from ..config import config_path
from ..daemon import Agent
from .context import load_cli_config


@click.command("run")
@click.pass_context
def run(ctx: click.Context) -> None:
    """Run the agent: apply at start, on device events and on an interval; serve /metrics,
    /healthz, /readyz.

    SIGHUP re-reads the config (a broken one is refused, the old one keeps
    running) and runs a pass; kvagent apply uses it too. SIGTERM kills the
    command in flight, stops the pass at that step and the agent (exit 0), and
    leaves exports, connections and mounts in place; the next start finishes the
    pass. Speaks systemd's notify protocol when $NOTIFY_SOCKET is set (WATCHDOG=1
    while every step stays within its bound). Records its pid and config file in
    node.run_dir while it runs (one agent per run directory), and serves its last
    snapshot to kvagent status on node.run_dir/status.sock (root only).
    """
    enable_stack_dumps()
    cfg = load_cli_config()
    path = str(config_path(ctx.find_root().obj.get("config_file")))
    agent = Agent(path, cfg)
    agent.install_signals()
    sys.exit(agent.run())


def enable_stack_dumps() -> None:
    """Every thread's Python stack on stderr (the journal) when the agent dies of a fatal
    signal: systemd's watchdog kills with SIGABRT, so a wedged agent says where it was.
    (Not where stderr is no file, e.g. under click's test runner.)"""
    # (io.UnsupportedOperation is an OSError and a ValueError)
    with contextlib.suppress(AttributeError, OSError, ValueError, RuntimeError):
        faulthandler.enable(all_threads=True)

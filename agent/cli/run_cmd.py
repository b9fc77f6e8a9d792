"""``kvagent run`` and ``kvagent status``."""

from __future__ import annotations

import dataclasses
import sys

import click

from ..config import config_path
from ..daemon import Agent
from ..health.collect import collect
from ..health.lockstate import observed_busy
from ..health.snapshot import exit_code
from ..health.status import render_status_text, to_status_json
from ..system.run import default_runner
from .context import load_cli_config
from .output import emit


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
    node.run_dir while it runs (one agent per run directory).
    """
    cfg = load_cli_config()
    path = str(config_path(ctx.find_root().obj.get("config_file")))
    agent = Agent(path, cfg)
    agent.install_signals()
    sys.exit(agent.run())


@click.command("status")
@click.option("--no-drives", is_flag=True, help="Skip the local drives' smart-log.")
def status(no_drives: bool) -> None:
    """Health of every pool on this host, its controllers and drives.

    Also the apply lock: the agent's passes skipped because another process
    holds it, or a holder that is not kvagent's user, make the host degraded.
    Exit 0 healthy, 1 degraded or failed, 2 bad config.
    """
    cfg = load_cli_config()
    snap = collect(cfg, default_runner(), drives=not no_drives)
    snap = dataclasses.replace(snap, apply_busy=observed_busy(cfg.node.run_dir))
    emit(to_status_json(snap), lambda _: render_status_text(snap))
    sys.exit(exit_code(snap))

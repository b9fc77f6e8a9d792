"""``kvagent status``: the running agent's last snapshot, or the host read here.

Only what asking the agent needs is imported up front: a live read (``--live``, or no
agent answering) imports the collector when it runs.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import click

from ..config import Config, config_path
from ..health import statusclient
from ..health.status import render_status_doc, to_status_json
from ..log import get_logger
from .context import load_cli_config
from .delegate import running_agent, same_file
from .output import emit

log = get_logger("cli.status")


@click.command("status")
@click.option("--live", is_flag=True,
              help="Read the host here and now instead of showing the running agent's "
                   "last snapshot.")
@click.option("--no-drives", is_flag=True,
              help="Skip the local drives' smart-log (a live read: implies --live).")
@click.pass_context
def status(ctx: click.Context, live: bool, no_drives: bool) -> None:
    """Health of every pool on this host, its controllers and drives.

    While the agent (kvagent run) runs with this config file, shows the snapshot
    of its last collect, asked on its socket in node.run_dir (root only), and
    says how long ago it was collected and by which pid. With --live, or when no
    agent answers within 2 s, reads the host itself as the agent would.

    Also the apply lock: the agent's passes skipped because another process
    holds it, or a holder that is not kvagent's user, make the host degraded.
    Exit 0 healthy, 1 degraded or failed, 2 bad config.
    """
    cfg = load_cli_config()
    doc = None
    if not (live or no_drives):
        doc = from_agent(cfg, str(config_path(ctx.find_root().obj.get("config_file"))))
    if doc is None:
        doc = read_live(cfg, drives=not no_drives)
    emit(doc, render_status_doc)
    sys.exit(doc["exit_code"])


def from_agent(cfg: Config, config_file: str) -> dict[str, Any] | None:
    """The running agent's status, or None (no agent, another config, no answer within
    :data:`~agent.health.statusclient.ASK_TIMEOUT`)."""
    agent = running_agent(cfg)
    if agent is None:
        log.debug("no agent runs with this run directory; reading the host here",
                  run_dir=str(cfg.node.run_dir))
        return None
    if not same_file(agent.config, config_file):
        log.debug("the agent runs another config file; reading the host here",
                  pid=agent.pid, agent_config=agent.config, config=config_file)
        return None
    return statusclient.ask_agent(cfg.node.run_dir, agent, timeout=statusclient.ASK_TIMEOUT)


def read_live(cfg: Config, *, drives: bool = True) -> dict[str, Any]:
    """A collect in this process, with the apply lock as the agent's record and
    ``/proc/locks`` show it."""
    from ..health.collect import collect
    from ..health.lockstate import observed_busy
    from ..system.run import default_runner

    snap = collect(cfg, default_runner(), drives=drives)
    snap = dataclasses.replace(snap, apply_busy=observed_busy(cfg.node.run_dir))
    return to_status_json(snap, age_seconds=time.monotonic() - snap.collect_tick)

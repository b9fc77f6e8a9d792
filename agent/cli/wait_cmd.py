"""``kvagent wait``: until GPU pools are mounted, capped and handed off.

The gate an engine's systemd unit waits behind (``kvagent-pool@POOL.service`` runs it):
it asks the running agent, as ``kvagent status`` does, until each named pool is ready.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from ..config import config_path
from ..config.units import parse_duration
from ..errors import UsageError
from .context import load_cli_config
from .output import emit
from .status_cmd import from_agent

#: Seconds between two looks at the agent's status.
POLL = 1.0


@click.command("wait")
@click.argument("pools", nargs=-1, required=True)
@click.option("--timeout", default="15m", show_default=True,
              help="How long to wait (a duration: 90s, 15m).")
@click.pass_context
def wait(ctx: click.Context, pools: tuple[str, ...], timeout: str) -> None:
    """Wait until each GPU pool POOLS is ready: mounted, capped and handed off.

    Asks the running agent (kvagent run with this config file) once a second, and
    keeps asking while no agent answers (it may be starting). What an engine's
    systemd unit waits behind: kvagent-pool@POOL.service runs it, and an engine's
    unit that has Requires= and After=kvagent-pool@POOL.service starts only once the
    pool is ready. Exit 0 when every pool is ready, 1 at the timeout (with what each
    pool still lacks), 2 for a pool this config does not attach.
    """
    cfg = load_cli_config()
    attached = [p.name for p in cfg.initiator.pools] if cfg.initiator else []
    unknown = [p for p in pools if p not in attached]
    if unknown:
        raise UsageError(f"POOLS {unknown[0]}: not a GPU pool of this config "
                         f"(initiator.pools: {', '.join(attached) or 'none'})")
    try:
        seconds = parse_duration(timeout)
    except ValueError as exc:
        raise UsageError(f"--timeout {timeout}: {exc}") from None
    config_file = str(config_path(ctx.find_root().obj.get("config_file")))
    started = time.monotonic()
    while True:
        doc = from_agent(cfg, config_file)
        states = pool_states(doc, pools)
        waited = round(time.monotonic() - started, 1)
        if all(s["ready"] for s in states.values()):
            emit({"ready": True, "waited_seconds": waited, "pools": states}, render)
            sys.exit(0)
        if time.monotonic() - started >= seconds:
            emit({"ready": False, "waited_seconds": waited, "pools": states}, render)
            sys.exit(1)
        time.sleep(POLL)


def pool_states(doc: dict[str, Any] | None, names: tuple[str, ...]) -> dict[str, dict]:
    """Each named GPU pool's readiness in the agent's status ``doc`` (None: no agent)."""
    if doc is None:
        return {n: {"ready": False, "state": None,
                    "problems": ["no agent answers (kvagent run with this config file)"]}
                for n in names}
    found = {p["name"]: p for p in doc.get("pools", []) if p.get("role") == "initiator"}
    out = {}
    for n in names:
        p = found.get(n)
        out[n] = ({"ready": False, "state": None,
                   "problems": ["not in the agent's status yet (its first pass runs)"]}
                  if p is None else
                  {"ready": bool(p["ready"]), "state": p["state"],
                   "problems": list(p["problems"])})
    return out


def render(doc: dict[str, Any]) -> str:
    lines = []
    for name, s in doc["pools"].items():
        if s["ready"]:
            lines.append(f"pool {name}: ready")
        else:
            lines.append(f"pool {name}: not ready after {doc['waited_seconds']:g}s: "
                         + "; ".join(s["problems"] or [s["state"] or "unknown"]))
    return "\n".join(lines)

"""``kvagent pool list`` and ``kvagent pool destroy``."""

from __future__ import annotations

import sys

import click

from ..system.run import default_runner
from ..target.inventory import destroy_pool, list_pools
from .apply_cmd import lock_wait_message
from .context import load_cli_config
from .output import emit, table


@click.group("pool")
def pool_group() -> None:
    """Storage-host pools: list them, destroy an unexported one's data."""


@pool_group.command("list")
def pool_list() -> None:
    """Pools in the config or in kvagent's records, with what is exported now."""
    pools = list_pools(load_cli_config(), runner=default_runner())

    def text(rows: list[dict]) -> str:
        if not rows:
            return "no target pools"
        body = []
        for p in rows:
            b = p["backing"] or {}
            where = p["where"]
            ns = sum(s["namespaces"] for s in p["subsystems"])
            en = sum(s["enabled"] for s in p["subsystems"])
            state = "exported" if p["exported"] else (
                "configured, not exported" if p["configured"] else "unexported (data kept)")
            body.append([p["name"], b.get("kind", "?"), where, ",".join(p["hosts"]) or "-",
                         f"{en}/{ns}", state])
        out = table(body, ["POOL", "BACKING", "WHERE", "HOSTS", "NS ENABLED", "STATE"])
        ns_rows = [[p["name"], ns["host"] or "(shared)", str(ns["nsid"]), ns["storage"],
                    "?" if ns["devices"] is None else ",".join(ns["devices"]) or "-"]
                   for p in rows for ns in p["namespaces"]]
        if ns_rows:
            out += "\n\n" + table(ns_rows, ["POOL", "HOST", "NSID", "STORAGE", "DEVICES"])
        return out

    emit({"pools": pools}, lambda d: text(d["pools"]))


@pool_group.command("destroy")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Really delete (without it: show what would go).")
def pool_destroy(name: str, yes: bool) -> None:
    """Delete the LVs or files of pool NAME (only what kvagent owns).

    The pool must be gone from the config and unexported (kvagent apply) first.
    Whole devices are released from kvagent's claims, never wiped. It holds the
    apply lock (waiting up to 2 minutes for a running apply or the
    agent's pass), so that no pass changes kvagent's records meanwhile.
    """
    cfg = load_cli_config()
    result = destroy_pool(cfg, name, default_runner(), yes=yes,
                          on_wait=lock_wait_message("pool destroy"))

    def text(r: dict) -> str:
        verb = "deleted" if r["destroyed"] else "would delete"
        lines = [f"{verb}: {x}" for x in r["logical_volumes"] + r["files"]]
        lines += [f"{'released' if r['destroyed'] else 'would release'} claim (not wiped): {d}"
                  for d in r["device_claims"]]
        if not r["destroyed"]:
            lines.append("nothing deleted: pass --yes to destroy")
        return "\n".join(lines or [f"pool {r['pool']}: nothing to delete"])

    emit(result, text)
    if not yes:
        sys.exit(2)

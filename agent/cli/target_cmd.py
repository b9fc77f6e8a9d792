"""``kvagent target``: look at the live nvmet target (show, export)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from nvmet.configfs import RealConfigFS
from nvmet.errors import NvmetError, NvmetUnavailable
from nvmet.model import Tree, as_dict
from nvmet.nvmetcli import dumps
from nvmet.reader import read

from ..config import config_path, load_config
from ..errors import KvagentError, UsageError
from .output import emit

DEFAULT_CONFIGFS = "/sys/kernel/config"


def configfs_root(explicit: str | None) -> Path:
    """``--configfs``, else node.configfs of a readable config file, else /sys/kernel/config."""
    if explicit:
        return Path(explicit)
    ctx = click.get_current_context()
    path = config_path(ctx.find_root().obj.get("config_file"))
    if path.is_file() and os.access(path, os.R_OK):
        return Path(str(load_config(path).node.configfs))
    return Path(DEFAULT_CONFIGFS)


def read_live(explicit: str | None) -> Tree:
    """Read the live tree, turning library errors into kvagent errors (exit 1)."""
    root = configfs_root(explicit) / "nvmet"
    try:
        return read(RealConfigFS(root))
    except NvmetUnavailable as exc:
        raise KvagentError(f"the kernel NVMe target is not available: no {root}",
                           hint="load it and mount configfs: 'modprobe nvmet nvmet-tcp' "
                                "(nvmet-rdma for RDMA) and 'mount -t configfs none "
                                "/sys/kernel/config'; or point --configfs at its mount"
                           ) from exc
    except NvmetError as exc:
        raise KvagentError(exc.message, hint=exc.hint) from exc


def is_secret(attr: str) -> bool:
    """A host attribute that holds a secret (DH-HMAC-CHAP keys): shown only as set or not."""
    return "key" in attr


def redacted(data: dict[str, Any]) -> dict[str, Any]:
    """``as_dict`` output with every host secret replaced by ``<set>`` (or left empty)."""
    hosts = [{**h, "attrs": {k: ("<set>" if v and is_secret(k) else v)
                             for k, v in h["attrs"].items()}} for h in data["hosts"]]
    return {**data, "hosts": hosts}


def write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600, also when the file was
    there before), never through a symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)


def render(tree: Tree) -> str:
    """The live tree as indented text."""
    lines: list[str] = []
    lines.append(f"hosts ({len(tree.hosts)}):")
    for h in tree.hosts.values():
        extra = " ".join(f"{k}=<set>" if is_secret(k) and v else f"{k}={v}"
                         for k, v in h.attrs.items())
        lines.append(f"  {h.nqn}" + (f"  {extra}" if extra else ""))
    lines.append(f"subsystems ({len(tree.subsystems)}):")
    for s in tree.subsystems.values():
        lines.append(f"  {s.nqn}")
        if s.attrs:
            lines.append("    " + " ".join(f"{k}={v}" for k, v in s.attrs.items()))
        hosts = ", ".join(sorted(s.allowed_hosts)) or "(none)"
        lines.append(f"    allowed_hosts: {hosts}")
        for ns in s.namespaces.values():
            state = "enabled " if ns.enable else "disabled"
            extra = "".join(f" {k}={v}" for k, v in ns.attrs.items())
            lines.append(f"    ns {ns.nsid:<4} {state} {ns.device_path or '(no device)'}"
                         f"  uuid={ns.device_uuid} nguid={ns.device_nguid}"
                         f" ana_grpid={ns.ana_grpid}"
                         f"{' buffered_io' if ns.buffered_io else ''}{extra}")
    lines.append(f"ports ({len(tree.ports)}):")
    for p in tree.ports.values():
        a = p.addr
        where = f"{a.get('trtype') or '?'} {a.get('adrfam') or '?'} " \
                f"{a.get('traddr') or '?'}:{a.get('trsvcid') or '?'}"
        rest = " ".join(f"{k}={v}" for k, v in a.items()
                        if k not in ("trtype", "adrfam", "traddr", "trsvcid"))
        params = " ".join(f"{k}={v}" for k, v in p.params.items())
        lines.append(f"  {p.id:<5} {where}  {rest}  {params}".rstrip())
        lines.append(f"    subsystems: {', '.join(sorted(p.subsystems)) or '(none)'}")
        if p.ana_groups:
            lines.append("    ana_groups: " + ", ".join(f"{g}={st}"
                                                       for g, st in p.ana_groups.items()))
        for r in (p.referrals or {}).values():
            ra = r.addr
            lines.append(f"    referral {r.name}: {ra.get('trtype')} {ra.get('traddr')}:"
                         f"{ra.get('trsvcid')} {'enabled' if r.enable else 'disabled'}")
    return "\n".join(lines)


configfs_option = click.option(
    "--configfs", "configfs", metavar="PATH",
    help="configfs mount point [default: node.configfs of the config, else "
         f"{DEFAULT_CONFIGFS}].")


@click.group("target")
def target_group() -> None:
    """The kernel NVMe target (nvmet) on this host."""


@target_group.command("show")
@configfs_option
def show(configfs: str | None) -> None:
    """Show the live nvmet tree: hosts, subsystems with namespaces, ports with links.

    Read-only. Exit 1 when nvmet is not loaded or configfs not mounted.
    """
    tree = read_live(configfs)
    emit({"changed": False, **redacted(as_dict(tree))}, lambda _d: render(tree))


@target_group.command("export")
@click.option("--format", "fmt", type=click.Choice(["nvmetcli"]), default="nvmetcli",
              show_default=True, help="Output format.")
@click.option("-f", "--file", "out_file", type=click.Path(dir_okay=False, writable=True),
              help="Write to FILE instead of stdout.")
@configfs_option
def export(fmt: str, out_file: str | None, configfs: str | None) -> None:
    """Export the live nvmet tree, e.g. as nvmetcli's /etc/nvmet/config.json.

    The file can be restored with 'nvmetcli restore FILE'. Read-only on nvmet. It holds
    the hosts' DH-HMAC-CHAP secrets (a restore needs them): --file writes it readable by
    its owner only (0600), never through a symlink. A tree with secrets is never
    printed: without --file it is refused (exit 2).
    """
    tree = read_live(configfs)
    keyed = sorted(h.nqn for h in tree.hosts.values()
                   if any(v and is_secret(k) for k, v in h.attrs.items()))
    if keyed and not out_file:
        raise UsageError(
            f"the live tree holds the DH-HMAC-CHAP secrets of {len(keyed)} host(s) "
            f"({', '.join(keyed)}), and kvagent never prints a secret",
            "write the export to a file readable by root only: kvagent target export "
            "-f FILE (mode 0600)")
    text = dumps(tree)
    if out_file:
        try:
            write_private(out_file, text)
        except OSError as exc:
            raise KvagentError(f"cannot write {out_file}: {exc.strerror or exc}") from exc
        emit({"file": out_file, "format": fmt, "changed": True,
              "subsystems": len(tree.subsystems), "ports": len(tree.ports),
              "hosts": len(tree.hosts)},
             f"wrote {out_file} ({fmt}: {len(tree.subsystems)} subsystems, "
             f"{len(tree.ports)} ports, {len(tree.hosts)} hosts)")
        return
    click.echo(text, nl=False)

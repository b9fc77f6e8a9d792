"""The whole state a pass of the crash tests' config makes, read into one comparable dict.

:func:`state_of` reads what kvagent's apply is meant to leave — the nvmet tree, the
storage's LVs and pool files, the fabrics controllers and their settings, the
multipath I/O policies, the mounts under the lab's mount root (by the identity of
their source, not its name), the engines' rendered configs (byte for byte, as a
digest), the xfs project quotas, owner/mode/project of every directory and a digest of
every file under the mount root — normalized so that two reads of the same state
compare equal however the kernel numbered things this time (nvme controller and
namespace names, dm-N) and whatever random identities the storage drew when it was
made (namespace uuids/nguids become labels in order of appearance, with whether each is
recorded with its storage). Secrets are never kept, only whether they are set and a
short digest.

It is cheap: plain file reads, one ``lvs``, and per mount one ``blkid`` and (when
project quotas are on) one ``xfs_quota``. :func:`diff` shows two states line by line.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from pathlib import Path
from typing import Any

from agent.system.xfsquota import project_of

from . import kit

UUID = re.compile(r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?"
                  r"[0-9a-fA-F]{12}")
#: LVM's own uuids (PV, VG, LV): 6-4-4-4-4-4-6 alphanumerics.
LVM_UUID = re.compile(r"\b[0-9A-Za-z]{6}(?:-[0-9A-Za-z]{4}){5}-[0-9A-Za-z]{6}\b")
NVME_NAME = re.compile(r"\bnvme\d+(?:c\d+)?n\d+(?:p\d+)?\b")
NVME_CTRL = re.compile(r"\bnvme(?:-subsys)?\d+\b")
DM_NAME = re.compile(r"\bdm-\d+\b")
ZERO_ID = re.compile(r"^[0-]+$")
SECRET_FILES = ("dhchap_key", "dhchap_ctrl_key")
NAMESPACE_FILES = ("device_path", "enable", "device_uuid", "device_nguid", "buffered_io",
                   "ana_grpid")
CONTROLLER_FILES = ("subsysnqn", "transport", "address", "state", "hostnqn",
                    "fast_io_fail_tmo", "ctrl_loss_tmo", "reconnect_delay")


def renumbered(text: str) -> str:
    """``text`` without the names the kernel may give differently after a reconnect."""
    text = NVME_NAME.sub("nvmeXnY", text)
    text = NVME_CTRL.sub("nvmeX", text)
    return DM_NAME.sub("dm-N", text)


def normalize_step(step: str) -> str:
    """A failpoint step without what differs between two runs of one pass: kernel
    names (nvmeXnY, dm-N) and random identities (uuids, LVM uuids)."""
    return renumbered(LVM_UUID.sub("<lvm-uuid>", UUID.sub("<uuid>", step)))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError as exc:
        return f"<unreadable: errno {exc.errno}>"


class Ids:
    """Random identities (namespace uuid, nguid) as labels in order of first sight."""

    def __init__(self) -> None:
        self.labels: dict[str, str] = {}

    @staticmethod
    def key(value: str) -> str:
        return value.lower().replace("-", "")

    def __call__(self, value: str) -> str:
        if not value or ZERO_ID.match(value):
            return value and "<zero>"
        return self.labels.setdefault(self.key(value), f"<id{len(self.labels) + 1}>")

    def sub(self, text: str) -> str:
        return UUID.sub(lambda m: self(m.group(0)), text)


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def nvmet(ids: Ids, recorded: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The nvmet tree, and namespace uuid (its key) -> "<subsystem> ns<nsid>"."""
    root = kit.NVMET
    tree: dict[str, Any] = {"hosts": {}, "ports": {}, "subsystems": {}}
    where: dict[str, str] = {}
    for host in sorted((root / "hosts").iterdir()):
        entry: dict[str, Any] = {}
        for f in sorted(host.iterdir()):
            if not f.is_file():
                continue
            value = _read(f)
            if f.name in SECRET_FILES:  # never the secret: set or not, and a digest
                value = (f"set, digest {kit.digest(value.encode())[:12]}"
                         if value and value != "(null)" else "not set")
            entry[f.name] = value
        tree["hosts"][host.name] = entry
    for port in sorted((root / "ports").iterdir(), key=lambda p: p.name):
        tree["ports"][port.name] = {
            **{f.name: _read(f) for f in sorted(port.glob("addr_*"))},
            "subsystems": names(port / "subsystems"),
            "referrals": names(port / "referrals"),
        }
    for sub in sorted((root / "subsystems").iterdir()):
        namespaces: dict[str, Any] = {}
        for ns in sorted((sub / "namespaces").iterdir(), key=lambda p: int(p.name)):
            entry = {f: _read(ns / f) for f in NAMESPACE_FILES if (ns / f).exists()}
            for f in ("device_uuid", "device_nguid"):
                if f in entry:
                    raw = entry[f]
                    entry[f] = ids(raw)
                    if not ZERO_ID.match(raw):
                        entry[f + " recorded with the storage"] = Ids.key(raw) in recorded
                        if f == "device_uuid":
                            where[Ids.key(raw)] = f"{sub.name} ns{ns.name}"
            namespaces[ns.name] = entry
        tree["subsystems"][sub.name] = {
            **{f.name: _read(f) for f in sorted(sub.glob("attr_*"))},
            "allowed_hosts": names(sub / "allowed_hosts"),
            "namespaces": namespaces,
        }
    return tree, where


def lvs_output() -> str:
    return kit.sh("lvs", "--noheadings", "--separator", "|", "--units", "b", "--nosuffix",
                  "-o", "vg_name,lv_name,lv_size,lv_tags", check=False, timeout=120).stdout


def logical_volumes(out: str, ids: Ids) -> dict[str, Any]:
    """Every LV: its size and its tags (identities as labels)."""
    lvs: dict[str, Any] = {}
    for line in sorted(out.splitlines()):
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 4:
            lvs[f"{parts[0]}/{parts[1]}"] = {"size": parts[2],
                                            "tags": sorted(ids.sub(parts[3]).split(","))}
    return lvs


def tree_of(root: Path, *, contents: bool, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Owner, group, mode (and xfs project) of every directory under ``root``; size and
    mode of every file, with a digest of its bytes when ``contents``."""
    found: dict[str, Any] = {}
    if not root.is_dir():
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in [".", *dirnames, *sorted(filenames)]:
            path = Path(dirpath) / name if name != "." else Path(dirpath)
            rel = str(path.relative_to(root))
            st = path.lstat()
            entry: dict[str, Any] = {"owner": f"{st.st_uid}:{st.st_gid}",
                                     "mode": oct(stat.S_IMODE(st.st_mode))}
            if stat.S_ISDIR(st.st_mode):
                try:
                    project = project_of(str(path))
                    entry["project"] = f"{project.projid}{' inherit' if project.inherit else ''}"
                except OSError:
                    pass
                if name != ".":
                    continue  # os.walk enters it: its entry is written there as "."
            elif stat.S_ISLNK(st.st_mode):
                entry["link"] = os.readlink(path)
            else:
                entry["size"] = st.st_size
                if contents and path.name not in skip:
                    entry["digest"] = kit.digest_of(str(path))
            found[rel] = entry
    return found


def source_of(device: str, where: dict[str, str], ids: Ids) -> Any:
    """What a block device is, by identity: the exported namespace (target NQN and nsid)
    whose uuid it reports, or a device-mapper device by name and what it lies on."""
    name = os.path.basename(os.path.realpath(device))
    block = Path("/sys/class/block") / name
    if (block / "dm/name").exists():
        return {"dm": _read(block / "dm/name"),
                "on": sorted(str(source_of(f"/dev/{s.name}", where, ids))
                             for s in (block / "slaves").iterdir())}
    uuid = _read(block / "uuid") if (block / "uuid").exists() else ""
    if uuid:
        return where.get(Ids.key(uuid), f"namespace uuid {ids(uuid)}")
    return renumbered(device)


def filesystems(mount_root: Path, where: dict[str, str], ids: Ids) -> dict[str, Any]:
    """Mounts under ``mount_root``: source's identity, filesystem type and uuid (blkid),
    options and, with project quotas on, each project's limits (xfs_quota)."""
    mounts: dict[str, Any] = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        dev, mnt, fstype, options = line.split()[:4]
        if not (mnt == str(mount_root) or mnt.startswith(f"{mount_root}/")):
            continue
        probe = kit.sh("blkid", "-p", "-o", "export", dev, check=False).stdout
        blk = dict(p.split("=", 1) for p in probe.splitlines() if "=" in p)
        entry: dict[str, Any] = {"source": source_of(dev, where, ids), "fstype": fstype,
                                 "options": renumbered(options),
                                 "blkid": {k: blk.get(k) for k in ("TYPE", "UUID")}}
        if {"prjquota", "pquota", "pqnoenforce"} & set(options.split(",")):
            report = kit.sh("xfs_quota", "-x", "-c", "report -p -n -N -b", mnt,
                            check=False).stdout
            limits = {}
            for row in report.splitlines():
                cols = row.split()
                if len(cols) >= 4 and cols[0].startswith("#"):
                    limits[cols[0]] = f"soft {cols[2]} hard {cols[3]}"  # not the usage
            entry["project quotas"] = limits
        mounts[str(Path(mnt).relative_to(mount_root))] = entry
    return mounts


def initiator_side(where: dict[str, str]) -> dict[str, Any]:
    """Fabrics controllers (by subsystem and address, not name) and I/O policies."""
    controllers = []
    for c in sorted(Path("/sys/class/nvme").glob("nvme*")):
        if _read(c / "transport") not in ("tcp", "rdma", "loop", "fc"):
            continue
        controllers.append({f: _read(c / f) for f in CONTROLLER_FILES if (c / f).exists()})
    controllers.sort(key=lambda c: (c.get("subsysnqn", ""), c.get("address", "")))
    policies = {}
    for s in Path("/sys/class/nvme-subsystem").glob("*"):
        if (s / "iopolicy").exists():
            policies[_read(s / "subsysnqn")] = _read(s / "iopolicy")
    return {"controllers": controllers, "iopolicy": dict(sorted(policies.items()))}


def state_of(*, state_dir: Path, files_dir: Path, mount_root: Path) -> dict[str, Any]:
    """Everything a pass is meant to leave (see the module's docstring), normalized."""
    ids = Ids()
    lv_out = lvs_output()
    recorded = [lv_out]  # identities as recorded with the storage: LVM tags, ...
    for base in (state_dir, files_dir):  # ... records and the file pools' manifests
        for dirpath, _, filenames in os.walk(base):
            recorded += [_read(Path(dirpath) / f) for f in filenames
                         if not f.endswith(".img")]
    recorded_text = Ids.key("\n".join(recorded))
    tree, where = nvmet(ids, recorded_text)
    lvs = logical_volumes(lv_out, ids)
    engines = state_dir / "engines"
    return {
        "nvmet": tree,
        "logical volumes": lvs,
        "pool files": tree_of(files_dir, contents=False),
        "initiator": initiator_side(where),
        "mounts": filesystems(mount_root, where, ids),
        "engine configs": {k: v.get("digest") for k, v in
                           tree_of(engines, contents=True).items() if "size" in v},
        "under the mount root": tree_of(mount_root, contents=True),
    }


def summary(state: dict[str, Any]) -> str:
    """How much of each kind a state holds (for the CI log: what the checks compare)."""
    tree = state["nvmet"]
    namespaces = sum(len(s["namespaces"]) for s in tree["subsystems"].values())
    quotas = sum(len(m.get("project quotas", {})) for m in state["mounts"].values())
    return (f"nvmet {len(tree['ports'])} ports, {len(tree['hosts'])} hosts, "
            f"{len(tree['subsystems'])} subsystems, {namespaces} namespaces; "
            f"{len(state['logical volumes'])} LVs; {len(state['pool files'])} pool files/dirs; "
            f"{len(state['initiator']['controllers'])} fabrics controllers; "
            f"{len(state['mounts'])} mounts; {len(state['engine configs'])} engine configs; "
            f"{quotas} quota projects; {len(state['under the mount root'])} entries under "
            f"the mount root")


def lines(state: Any, prefix: str = "") -> list[str]:
    """``state`` flattened to ``path: value`` lines (for a readable diff)."""
    if isinstance(state, dict):
        out = []
        for k, v in state.items():
            out += lines(v, f"{prefix}/{k}" if prefix else str(k))
        return out or [f"{prefix}: {{}}"]
    if isinstance(state, list) and any(isinstance(v, dict) for v in state):
        return [line for i, v in enumerate(state) for line in lines(v, f"{prefix}[{i}]")]
    return [f"{prefix}: {state!r}"]


def diff(expected: dict[str, Any], actual: dict[str, Any]) -> str:
    """Unified diff of two states ('' when equal)."""
    return "\n".join(difflib.unified_diff(lines(expected), lines(actual),
                                          "clean run", "after the kill", lineterm="", n=1))

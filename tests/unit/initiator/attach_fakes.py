"""A fake GPU host for unit tests of the attach pass: nvme-cli, blkid, mkfs, mount, LVM.

Behaviour follows what the kernel tier shows on 6.1 (tests/kernel/test_attach_pools.py,
test_initiator_plumbing.py): a connect creates a controller, a subsystem and one
multipath head per namespace (uuid = nvmet.ids.namespace_uuid) in a FakeSysfs;
list-ns prints the nsids; blkid -p exits 2 on a blank device; mkfs.xfs writes
the uuid it is given; mount/umount edit a mountinfo file and move the
"filesystem's" files in and out of the mount directory, so a directory is
empty again after umount as on a real host.

Controller attributes written through :class:`KernelSysfs` behave as on 6.1
(tests/kernel/test_cache_failfast.py): -1 reads back ``off``, ``ctrl_loss_tmo``
is rounded up to a multiple of ``reconnect_delay``; every write is recorded. A
filesystem has the size of its device when it was made (or last grown with
xfs_growfs); a mount in ``shutdown`` is an xfs that shut down (until it is
mounted again).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent import failpoints
from agent.config import Config, parse_config
from agent.fabrics import DISCOVERY_NQN
from agent.initiator.filesystem import XfsSuperblock
from agent.initiator.nvme.cli import NvmeCli
from agent.initiator.nvme.kmsg import NoKernelLog
from agent.initiator.stages.context import HostSeams
from agent.initiator.sysfs import Sysfs
from agent.initiator.xfsmount import Geometry
from agent.system.mountusers import MountUser
from agent.system.probes import ProbeResult
from agent.system.run import CommandResult
from nvmet.ids import namespace_uuid
from tests.unit.engines.helpers import probe as fake_probe_result
from tests.unit.fakerunner import FakeRunner

from .fakesysfs import FakeSysfs

HOST = "nqn.2014-08.org.nvmexpress:uuid:11e85052-8716-44d9-b10e-1c51bae17688"
HOSTID = "11e85052-8716-44d9-b10e-1c51bae17688"
PREFIX = "nqn.2026-11.io.kvagent"
GIB = 1 << 30


@dataclass
class Export:
    """A subsystem the fake storage host offers this host."""

    nqn: str
    nsids: list[int]
    size: int = GIB
    traddr: str = "10.0.0.1"


class KernelSysfs(Sysfs):
    """A Sysfs whose controller attribute writes behave as the 6.1 kernel's, recorded."""

    def __init__(self, root: Path, writes: list[tuple[str, str, str]]):
        super().__init__(root)
        self.writes = writes

    def set_controller_attr(self, name: str, attr: str, value: str) -> None:
        self.writes.append((name, attr, value))
        super().set_controller_attr(name, attr, value)  # through the seam: a step
        d = self.root / "class/nvme" / name
        number = int(value)
        if attr == "ctrl_loss_tmo" and number >= 0:
            delay = int((d / "reconnect_delay").read_text())
            text = str(-(-number // delay) * delay)
        else:
            text = "off" if number < 0 else str(number)
        (d / attr).write_text(text + "\n")


@dataclass
class FakeHost:
    root: Path
    exports: list[Export] = field(default_factory=list)
    content: dict[str, dict[str, str]] = field(default_factory=dict)
    busy: set[str] = field(default_factory=set)
    refuse_vgchange_an: bool = False
    unreachable: set[str] = field(default_factory=set)  # target addresses that refuse
    #: the discovery referrals each storage host's port lists (traddr -> traddrs)
    referrals: dict[str, list[str]] = field(default_factory=dict)
    #: discovery ports whose log cannot be read (nvme discover: connection refused)
    discovery_down: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.sys = FakeSysfs(self.root / "sys")
        self.mountinfo = self.root / "mountinfo"
        self.mountinfo.write_text("21 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n")
        self.stash = self.root / "fs-contents"
        self.nvme_dir = self.root / "nvme"
        self.nvme_dir.mkdir()
        (self.nvme_dir / "hostnqn").write_text(HOST + "\n")
        (self.nvme_dir / "hostid").write_text(HOSTID + "\n")
        self.numbers: dict[str, str] = {}
        self.next_ctrl, self.next_minor = 2, 1
        self.vgs: dict[str, dict] = {}
        self.probed: list[str] = []
        #: xfs superblocks at the start of devices (mkfs writes one; a test may leave one
        #: that mkfs never finished)
        self.superblocks: dict = {}
        r = FakeRunner()
        r.on_call(["modprobe"], self._modprobe)
        r.on_call(["nvme", "discover"], self._discover)
        r.on_call(["nvme", "connect"], self._connect)
        r.on_call(["nvme", "list-ns"], self._list_ns)
        r.on_call(["nvme", "get-log"], self._get_log)
        r.on_call(["nvme", "disconnect"], self._disconnect)
        r.on_call(["blkid"], self._blkid)
        r.on_call(["mkfs.xfs"], self._mkfs)
        r.on_call(["mount"], self._mount)
        r.on_call(["umount"], self._umount)
        r.on_call(["pvs"], self._pvs)
        r.on_call(["vgcreate"], self._vgcreate)
        r.on_call(["lvcreate"], self._lvcreate)
        r.on_call(["vgchange"], self._vgchange)
        r.on_call(["lvs"], self._lvs)
        self.runner = r
        #: options written to /dev/nvme-fabrics (a replacement controller), as dicts
        self.fabrics_writes: list[dict[str, str]] = []
        self.cli = NvmeCli(r, kernel_log=NoKernelLog(), fabrics_write=self._fabrics_write)
        r.on_call(["xfs_growfs"], self._growfs)
        self.sleeps: list[float] = []
        self.now = 0.0
        self.on_sleep = None
        self.sysfs_writes: list[tuple[str, str, str]] = []
        #: mount points whose xfs shut down
        self.shutdown: set[str] = set()
        #: bytes of each device's filesystem (as made, or last grown)
        self.fs_bytes: dict[str, int] = {}
        #: processes using a mount (what /proc would show)
        self.users: dict[str, list[MountUser]] = {}
        #: the transparent-huge-page mode, and how often it was read
        self.thp = "madvise"
        self.thp_reads = 0
        #: directories made immutable through the seam (the real attribute would refuse
        #: the fake mount's stand-in writes into them)
        self.sealed: set[str] = set()

    # ------------------------------------------------------------ wiring
    @property
    def sysfs(self) -> Sysfs:
        return KernelSysfs(self.root / "sys", self.sysfs_writes)

    def seams(self) -> HostSeams:
        return HostSeams(mountinfo=self.mountinfo, devnum=self.devnum, sleep=self._sleep,
                         clock=lambda: self.now, exists=lambda d: d in self.numbers,
                         superblock=lambda d: self.superblocks.get(d),
                         volume_slaves=self.volume_slaves, wallclock=lambda: 1e9 + self.now,
                         shut_down=lambda m: m in self.shutdown, geometry=self.geometry,
                         users=lambda m: self.users.get(m, []), thp=self.read_thp,
                         sealed=lambda d: d in self.sealed, seal=self._seal)

    def _seal(self, path: str, on: bool) -> None:
        """The immutable attribute set or cleared, a step as the real effect's."""
        if on:
            self.sealed.add(path)
            failpoints.step("dir.seal", path)
        else:
            self.sealed.discard(path)
            failpoints.step("dir.unseal", path)

    def read_thp(self) -> str:
        self.thp_reads += 1
        return self.thp

    def geometry(self, mount: str) -> Geometry:
        if mount in self.shutdown:  # as on 6.1: opening its root fails
            raise OSError(errno.EIO, "Input/output error", mount)
        device = self.mounts()[mount]
        return Geometry(4096, self.fs_bytes.get(device, self.device_bytes(device)) // 4096)

    def device_bytes(self, device: str) -> int:
        return int((self.root / "sys/block" / device.removeprefix("/dev/") / "size")
                   .read_text()) * 512

    def volume_slaves(self, pool: str) -> frozenset[str] | None:
        """What sysfs lists under the pool's striped volume while it is active."""
        vg = self.vgs.get(f"kvs_{pool}")
        if not vg or not vg["active"] or not vg.get("lv"):
            return None
        return frozenset(d.rsplit("/", 1)[1] for d in vg["pvs"])

    def config(self, body: str) -> Config:
        return parse_config(self.config_text(body), "test.yaml")

    def config_text(self, body: str) -> str:
        """The whole config file for ``body`` (the initiator section)."""
        return f"""
version: 1
node:
  name: gpu0
  nqn_prefix: {PREFIX}
  state_dir: {self.root}/state
  run_dir: {self.root}/run
  sysfs: {self.root}/sys
  nvme_dir: {self.nvme_dir}
{body}"""

    def _sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep:
            self.on_sleep()

    def probe(self, path: str, transport: str | None = None, **_: object) -> ProbeResult:
        self.probed.append(path)
        return fake_probe_result(path)

    def devnum(self, device: str) -> str:
        return self.numbers[device]

    @staticmethod
    def opt(argv: tuple[str, ...], flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv else None

    @staticmethod
    def ok(argv: tuple[str, ...], stdout: str = "", rc: int = 0, err: str = "") -> CommandResult:
        return CommandResult(argv, rc, stdout, err)

    # ------------------------------------------------------------- nvme
    def _discover(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        """The log nvmet gives this host at ``--traddr`` (nvme-cli 2.x JSON): the port's
        own discovery record, its subsystems, its referrals; refused while down
        (tests/unit/initiator/fixtures/nvme-2.3/cases/discover-refused.json)."""
        traddr = self.opt(argv, "--traddr")
        if traddr in self.discovery_down:
            return self.ok(argv, rc=1, err="Failed to write to /dev/nvme-fabrics: Connection "
                           "refused\nfailed to add controller, error connection refused\n")
        record = {"trtype": "tcp", "adrfam": "ipv4", "portid": 1, "trsvcid": "4420"}
        records = [{**record, "subtype": "current discovery subsystem",
                    "subnqn": "nqn.2014-08.org.nvmexpress.discovery", "traddr": traddr}]
        records += [{**record, "subtype": "nvme subsystem", "subnqn": e.nqn,
                     "traddr": e.traddr} for e in self.exports if e.traddr == traddr]
        records += [{**record, "subtype": "discovery subsystem referral", "portid": 2,
                     "subnqn": "nqn.2014-08.org.nvmexpress.discovery", "traddr": to}
                    for to in self.referrals.get(traddr or "", [])]
        return self.ok(argv, json.dumps({"genctr": 1, "records": records}))

    def _export(self, nqn: str) -> Export:
        return next(e for e in self.exports if e.nqn == nqn)

    def _connect(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        """``nvme connect`` (nvme-cli 2.3: "already connected" for any host NQN)."""
        nqn, traddr = self.opt(argv, "--nqn"), self.opt(argv, "--traddr")
        if traddr in self.unreachable:
            return self.ok(argv, rc=1, err="Failed to write to /dev/nvme-fabrics: "
                                           "Connection refused\n")
        for c in self.sysfs.controllers():
            if (c.subsysnqn, c.address.traddr) == (nqn, traddr):
                return self.ok(argv, rc=1, err="already connected\n")
        opts = {"nqn": nqn, "traddr": traddr}
        for key, flag in (("hostnqn", "--hostnqn"), ("hostid", "--hostid"),
                          ("reconnect_delay", "--reconnect-delay"),
                          ("ctrl_loss_tmo", "--ctrl-loss-tmo"), ("host_traddr", "--host-traddr"),
                          ("host_iface", "--host-iface"), ("dhchap_secret", "--dhchap-secret"),
                          ("dhchap_ctrl_secret", "--dhchap-ctrl-secret")):
            if (value := self.opt(argv, flag)) is not None:
                opts[key] = value
        if "--tls" in argv:
            opts["tls"] = ""
        return self.ok(argv, json.dumps({"device": f"nvme{self._new_controller(opts)}"}))

    def _fabrics_write(self, options: str, _timeout: float) -> str:
        """/dev/nvme-fabrics: a new controller (refused with EALREADY when this host
        identity has one to the subsystem at that address, unless ``duplicate_connect``);
        a further one to a subsystem this host has gets a path to each of its namespaces
        (native multipath)."""
        opts = dict(t.split("=", 1) if "=" in t else (t, "") for t in options.split(","))
        self.fabrics_writes.append(opts)
        if opts["traddr"] in self.unreachable:
            raise OSError(errno.ECONNREFUSED, os.strerror(errno.ECONNREFUSED))
        if "duplicate_connect" not in opts and any(
                (c.subsysnqn, c.address.traddr, c.hostnqn, c.address.host_traddr,
                 c.address.host_iface) == (opts["nqn"], opts["traddr"], opts.get("hostnqn"),
                                           opts.get("host_traddr"), opts.get("host_iface"))
                for c in self.sysfs.controllers()):
            # (the kernel's nvmf_ip_options_match: the host side must be given to both and
            # equal, or to neither)
            raise OSError(errno.EALREADY, os.strerror(errno.EALREADY))
        return f"instance={self._new_controller(opts)},cntlid=1\n"

    def _new_controller(self, opts: dict[str, str]) -> int:
        """What the kernel makes of a connect request: a controller, and for the first
        one to a subsystem, the subsystem and its namespaces."""
        nqn, traddr = opts["nqn"], opts["traddr"]
        inst = self.next_ctrl
        self.next_ctrl += 1
        delay = int(opts.get("reconnect_delay") or 10)
        loss = int(opts.get("ctrl_loss_tmo") or 600)
        # The kernel shows the host side it was given (nvmf_get_address), then src_addr.
        host_side = "".join(f",{key}={opts[key]}" for key in ("host_traddr", "host_iface")
                            if key in opts)
        self.sys.add_controller(inst, subsysnqn=nqn, hostnqn=opts.get("hostnqn"),
                                hostid=opts.get("hostid"), transport="tcp",
                                address=f"traddr={traddr},trsvcid=4420{host_side},"
                                        "src_addr=10.0.0.9",
                                ctrl_loss_tmo="off" if loss < 0 else -(-loss // delay) * delay,
                                reconnect_delay=delay, fast_io_fail_tmo="off",
                                dhchap_secret=opts.get("dhchap_secret") or "none",
                                dhchap_ctrl_secret=opts.get("dhchap_ctrl_secret") or "none",
                                # 6.12: only a controller connected with TLS has tls_key
                                tls_key="0d1e2f3a" if "tls" in opts else None)
        first = next((c for c in self.sysfs.controllers()
                      if c.subsysnqn == nqn and c.name != f"nvme{inst}"), None)
        if first is None:
            self.sys.add_subsystem(inst, nqn, controllers=(inst,))
            export = self._export(nqn)
            for nsid in export.nsids:
                self._add_head(inst, nqn, nsid, export.size)
            return inst
        sub = self._subsys_inst(nqn)
        sd = self.root / "sys/class/nvme-subsystem" / f"nvme-subsys{sub}"
        ctrls = sorted(int(e.name[4:]) for e in sd.iterdir() if re.match(r"nvme\d+$", e.name))
        self.sys.add_subsystem(sub, nqn, controllers=(*ctrls, inst))
        for nsid in self._export(nqn).nsids:
            head = self.root / "sys/block" / f"nvme{sub}n{nsid}"
            paths = sorted({int(e.name.split("c")[1].split("n")[0]) for e in
                            (self.root / "sys/block").glob(f"nvme{sub}c*n{nsid}")} | {inst})
            size = int((head / "size").read_text())
            self.sys.add_namespace(sub, nsid, namespace_uuid(nqn, nsid), size=size,
                                   paths=tuple((c, "optimized") for c in paths))
        return inst

    def _add_head(self, inst: int, nqn: str, nsid: int, size: int) -> None:
        head = self.sys.add_namespace(inst, nsid, namespace_uuid(nqn, nsid),
                                      paths=((inst, "optimized"),), size=size // 512)
        number = f"259:{self.next_minor}"
        self.next_minor += 1
        self.numbers[f"/dev/nvme{inst}n{nsid}"] = number
        link = self.root / "sys/dev/block" / number
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(head)

    def _subsys_inst(self, nqn: str) -> int:
        return next(int(p.name.removeprefix("nvme-subsys"))
                    for p in (self.root / "sys/class/nvme-subsystem").iterdir()
                    if (p / "subsysnqn").read_text().strip() == nqn)

    def add_namespaces(self, nqn: str, *nsids: int) -> None:
        """The storage host exports more namespaces: the kernel adds their heads."""
        export = self._export(nqn)
        export.nsids = sorted({*export.nsids, *nsids})
        inst = self._subsys_inst(nqn)
        for nsid in nsids:
            self._add_head(inst, nqn, nsid, export.size)

    def resize(self, nqn: str, nsid: int, size: int) -> None:
        """The storage host grew a namespace: the kernel updates the head's size."""
        self.sys.set(f"block/nvme{self._subsys_inst(nqn)}n{nsid}/size", size // 512)

    def _list_ns(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        name = os.path.basename(argv[2])
        ctrl = self.sysfs.controller(name)
        assert ctrl is not None and ctrl.state == "live", f"list-ns on {name} not live"
        lines = [f"[{i:4}]:{nsid:#x}" for i, nsid in
                 enumerate(self._export(ctrl.subsysnqn).nsids)]
        return self.ok(argv, "\n".join(lines) + "\n")

    def _get_log(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        """The discovery log's header read through a discovery controller (the agent's
        AEN acknowledgement): only on a live one."""
        name = os.path.basename(argv[2])
        ctrl = self.sysfs.controller(name)
        assert ctrl is not None and ctrl.state == "live", f"get-log on {name} not live"
        assert ctrl.subsysnqn == DISCOVERY_NQN, f"get-log on {name}, not a discovery controller"
        return self.ok(argv, "Device:nvme log-id:112 namespace-id:0xffffffff\n")

    def _disconnect(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        name = self.opt(argv, "--device")
        if name and (self.root / "sys/class/nvme" / name).exists():
            inst = int(name[4:])
            block = self.root / "sys/block"
            if self._other_controllers(name):
                # Another controller serves the subsystem: the heads stay (multipath),
                # only this controller's paths go.
                for node in block.glob(f"nvme*c{inst}n*"):
                    node.unlink()
            else:
                for head in block.glob(f"nvme{inst}n*"):
                    head.unlink()
            self.sys.remove_controller(inst)
            return self.ok(argv)
        return self.ok(argv, err=f"Did not find device {name}\n")

    def _other_controllers(self, name: str) -> list[str]:
        """Controllers other than ``name`` linked in ``name``'s subsystem directory."""
        for sd in (self.root / "sys/class/nvme-subsystem").iterdir():
            linked = [e.name for e in sd.iterdir() if re.match(r"nvme\d+$", e.name)]
            if name in linked:
                return [c for c in linked if c != name
                        and (self.root / "sys/class/nvme" / c).exists()]
        return []

    def set_state(self, ctrl: str, state: str) -> None:
        self.sys.set(f"class/nvme/{ctrl}/state", state)

    # ------------------------------------------------------- filesystems
    def _blkid(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        props = self.content.get(argv[-1])
        if not props:
            return self.ok(argv, rc=2)
        return self.ok(argv, "".join(f"{k}={v}\n" for k, v in props.items()))

    def _mkfs(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        device = argv[-1]
        if self.content.get(device):
            return self.ok(argv, rc=1, err=f"mkfs.xfs: {device} appears to contain a filesystem")
        uuid = self.opt(argv, "-m").removeprefix("uuid=")
        self.content[device] = {"UUID": uuid, "LABEL": self.opt(argv, "-L"), "TYPE": "xfs"}
        self.superblocks[device] = XfsSuperblock(uuid, inprogress=False)
        block = self.root / "sys/block" / device.removeprefix("/dev/")
        self.fs_bytes[device] = self.device_bytes(device) if block.exists() else 1 << 40
        return self.ok(argv)

    def _growfs(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        path = argv[-1]
        assert path not in self.shutdown, f"xfs_growfs on shut-down {path}"
        device = self.mounts()[path]
        self.fs_bytes[device] = self.device_bytes(device)
        return self.ok(argv)

    def mounts(self) -> dict[str, str]:
        """mount point -> source, from the fake mountinfo."""
        out = {}
        for line in self.mountinfo.read_text().splitlines()[1:]:
            left, _, right = line.partition(" - ")
            out[left.split()[4]] = right.split()[1]
        return out

    def mount_line(self, device: str, path: str, number: str | None = None,
                   options: tuple[str, ...] = ()) -> None:
        """A mountinfo line as the kernel writes it for an xfs mounted with ``options``
        (the superblock options show prjquota / pqnoenforce as xfs does)."""
        number = number or self.devnum(device)
        quota = ("prjquota" if {"prjquota", "pquota"} & set(options) else
                 "pqnoenforce" if "pqnoenforce" in options else None)
        super_options = "rw,attr2,inode64" + (f",{quota}" if quota else "")
        with self.mountinfo.open("a") as f:
            f.write(f"99 21 {number} / {path} rw,noatime - xfs {device} {super_options}\n")

    def _mount(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        device, path = argv[-2], argv[-1]
        assert os.path.isdir(path) and not os.listdir(path), f"mount over {path}"
        saved = self.stash / self.devnum(device).replace(":", "_")
        if saved.is_dir():
            for child in saved.iterdir():
                shutil.move(str(child), path)
        options = tuple(self.opt(argv, "-o").split(",")) if "-o" in argv else ()
        self.mount_line(device, path, options=options)
        self.shutdown.discard(path)
        return self.ok(argv)

    def _umount(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        path = argv[-1]
        if path in self.busy:
            return self.ok(argv, rc=32, err=f"umount: {path}: target is busy.\n")
        lines = self.mountinfo.read_text().splitlines(keepends=True)
        keep = [ln for ln in lines if ln.split()[4] != path]
        assert len(keep) == len(lines) - 1, f"umount of {path}, which is not mounted"
        number = next(ln for ln in lines if ln.split()[4] == path).split()[2]
        self.mountinfo.write_text("".join(keep))
        saved = self.stash / number.replace(":", "_")
        saved.mkdir(parents=True, exist_ok=True)
        for child in Path(path).iterdir():
            shutil.move(str(child), saved)
        return self.ok(argv)

    # --------------------------------------------------------------- LVM
    def _pvs(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        devices = [a for a in argv if a.startswith("/dev/")]
        rows = [{"pv_name": d, "vg_name": vg, "vg_tags": ",".join(info["tags"])}
                for vg, info in self.vgs.items() for d in info["pvs"] if d in devices]
        rc = 0 if len(rows) == len(devices) else 5
        return self.ok(argv, json.dumps({"report": [{"pv": rows}]}), rc=rc)

    def _vgcreate(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        tags = [argv[i + 1] for i, a in enumerate(argv) if a == "--addtag"]
        devices = [a for a in argv if a.startswith("/dev/")]
        vg = argv[argv.index(devices[0]) - 1]
        self.vgs[vg] = {"tags": tags, "pvs": devices, "active": False}
        for d in devices:
            self.content[d] = {"TYPE": "LVM2_member", "UUID": f"pv-{d}"}
        return self.ok(argv)

    def _lvcreate(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        vg = argv[-1]
        self.vgs[vg]["active"] = True
        self.vgs[vg]["lv"] = True
        path = f"/dev/{vg}/data"
        self.numbers[path] = "253:0"
        node = self.root / "sys/devices/virtual/block/dm-0"
        (node / "dm").mkdir(parents=True, exist_ok=True)
        (node / "dm/name").write_text(f"{vg.replace('-', '--')}-data\n")
        link = self.root / "sys/dev/block/253:0"
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(node)
        return self.ok(argv)

    def _lvs(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        vg = self.vgs.get(argv[-1])
        return self.ok(argv, "  data\n" if vg and vg.get("lv") else "")

    def _modprobe(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        (self.root / "sys" / "module" / argv[-1].replace("-", "_")).mkdir(parents=True,
                                                                          exist_ok=True)
        return self.ok(argv)

    def _vgchange(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        vg = argv[-1]
        if vg not in self.vgs:
            return self.ok(argv, rc=5, err=f'  Volume group "{vg}" not found\n')
        if argv[1] == "-an" and self.refuse_vgchange_an:
            return self.ok(argv, rc=5, err=f"  Logical volume {vg}/data in use.\n")
        self.vgs[vg]["active"] = argv[1] == "-ay"
        if self.vgs[vg].get("lv"):  # /dev/VG/LV exists while the LV is active
            if argv[1] == "-ay":
                self.numbers[f"/dev/{vg}/data"] = "253:0"
            else:
                self.numbers.pop(f"/dev/{vg}/data", None)
        return self.ok(argv)


def fabrics_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 exports: list[Export]) -> FakeHost:
    """A FakeHost serving ``exports`` with nvme-fabrics and nvme-tcp loaded and
    ``os.path.ismount`` answered from its mount table (the attach tests' fixture)."""
    h = FakeHost(tmp_path, exports=exports)
    monkeypatch.setattr(os.path, "ismount", lambda p: os.fspath(p) in h.mounts())
    for module in ("nvme_fabrics", "nvme_tcp"):
        (tmp_path / "sys/module" / module).mkdir(parents=True)
    return h

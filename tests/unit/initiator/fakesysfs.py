"""A fake NVMe host sysfs on tmp_path, laid out like the 6.1 kernel's.

``load_dump`` rebuilds the tree recorded in fixtures/sysfs-6.1/sysfs-dump.txt
(real attribute values and symlinks); the ``add_*`` helpers add more objects
in the same layout (devices under /sys/devices, class and block entries as
symlinks, ``device`` links from path nodes to controllers and from heads to
subsystems), as tests/kernel shows the kernel does.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
DUMP = FIXTURES / "sysfs-6.1" / "sysfs-dump.txt"


class FakeSysfs:
    def __init__(self, root: Path):
        self.root = root
        for d in ("class/nvme", "class/nvme-subsystem", "block", "devices/virtual"):
            (root / d).mkdir(parents=True, exist_ok=True)

    # -- low level ------------------------------------------------------------
    def _link(self, link: Path, target: str) -> None:
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(target, link)

    @staticmethod
    def _write(d: Path, attrs: dict[str, object]) -> None:
        d.mkdir(parents=True, exist_ok=True)
        for key, value in attrs.items():
            if value is None:
                continue
            path = d / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{value}\n")

    def load_dump(self, dump: Path = DUMP) -> FakeSysfs:
        """Recreate the recorded objects: '== /sys/X -> /sys/devices/…' sections."""
        current: Path | None = None
        for line in dump.read_text().splitlines():
            if line.startswith("== "):
                name, _, real = line[3:].partition(" -> ")
                rel_real = real.removeprefix("/sys/")
                current = self.root / rel_real
                current.mkdir(parents=True, exist_ok=True)
                entry = self.root / name.removeprefix("/sys/")
                self._link(entry, os.path.relpath(current, entry.parent))
                continue
            if current is None or not line.strip():
                continue
            key, sep, value = line.partition("\t")
            if not sep:
                if key.endswith("/"):
                    (current / key).mkdir(parents=True, exist_ok=True)
                continue
            if value.startswith("-> "):
                self._link(current / key, value[3:])
            elif "Permission denied" in value:
                continue  # write-only attribute
            else:
                (current / key).parent.mkdir(parents=True, exist_ok=True)
                (current / key).write_text(value.rstrip(" ") + "\n")
        return self

    # -- objects --------------------------------------------------------------
    def add_controller(self, inst: int, *, subsysnqn: str, transport: str = "tcp",
                       address: str = "traddr=127.0.0.1,trsvcid=4420,src_addr=127.0.0.1",
                       state: str = "live", hostnqn: str | None = None,
                       hostid: str | None = None, **attrs: object) -> Path:
        name = f"nvme{inst}"
        d = self.root / "devices/virtual/nvme-fabrics/ctl" / name
        self._write(d, {"transport": transport, "address": address, "state": state,
                        "subsysnqn": subsysnqn, "hostnqn": hostnqn, "hostid": hostid,
                        "cntlid": attrs.pop("cntlid", 1), **attrs})
        self._link(self.root / "class/nvme" / name,
                   f"../../devices/virtual/nvme-fabrics/ctl/{name}")
        return d

    def add_subsystem(self, inst: int, nqn: str, controllers: tuple[int, ...] = (),
                      iopolicy: str = "numa") -> Path:
        name = f"nvme-subsys{inst}"
        d = self.root / "devices/virtual/nvme-subsystem" / name
        self._write(d, {"subsysnqn": nqn, "iopolicy": iopolicy, "subsystype": "nvm"})
        for c in controllers:
            self._link(d / f"nvme{c}", f"../../nvme-fabrics/ctl/nvme{c}")
        self._link(self.root / "class/nvme-subsystem" / name,
                   f"../../devices/virtual/nvme-subsystem/{name}")
        return d

    def add_namespace(self, subsys: int, nsid: int, uuid: str, *,
                      paths: tuple[tuple[int, str], ...] = (), size: int = 131072,
                      lbs: int = 512, nguid: str | None = None) -> Path:
        """A multipath head nvme<S>n<N> and hidden paths nvme<S>c<C>n<N> (ctrl, ana_state)."""
        head = f"nvme{subsys}n{nsid}"
        sd = self.root / "devices/virtual/nvme-subsystem" / f"nvme-subsys{subsys}"
        hd = sd / head
        common = {"uuid": uuid, "wwid": f"uuid.{uuid}", "nsid": nsid, "size": size,
                  "queue/logical_block_size": lbs, "nguid": nguid}
        self._write(hd, {**common, "hidden": 0})
        self._link(hd / "device", f"../../nvme-subsys{subsys}")
        self._link(self.root / "block" / head,
                   f"../devices/virtual/nvme-subsystem/nvme-subsys{subsys}/{head}")
        for ctrl, ana in paths:
            pname = f"nvme{subsys}c{ctrl}n{nsid}"
            pd = self.root / "devices/virtual/nvme-fabrics/ctl" / f"nvme{ctrl}" / pname
            self._write(pd, {**common, "hidden": 1, "ana_state": ana, "ana_grpid": 1})
            self._link(pd / "device", f"../../nvme{ctrl}")
            self._link(self.root / "block" / pname,
                       f"../devices/virtual/nvme-fabrics/ctl/nvme{ctrl}/{pname}")
        return hd

    def remove_controller(self, inst: int) -> None:
        name = f"nvme{inst}"
        (self.root / "class/nvme" / name).unlink()
        shutil.rmtree(self.root / "devices/virtual/nvme-fabrics/ctl" / name)

    def set(self, rel: str, value: object) -> None:
        """Write one attribute (``class/nvme/nvme2/state``), following the entry symlink."""
        (self.root / rel).write_text(f"{value}\n")

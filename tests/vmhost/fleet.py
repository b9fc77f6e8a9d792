"""A fleet of machines for host-side tests: scripts/fleet's machines, driven over SSH.

Each machine is Debian 12 booted with systemd from scripts/fleet's image, kvagent
installed from its .deb and run by its unit; the machines share a private network
(10.77.0.0/24). :class:`Fleet` boots them, runs commands on them and powers them off,
keeping every serial console and journal with the test's results.
"""

from __future__ import annotations

import email.utils
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
FLEET = [sys.executable, str(REPO / "scripts/fleet")]


class Fleet:
    """Machines booted by ``scripts/fleet up`` in ``where`` (their disks, consoles, journals)."""

    def __init__(self, where: Path, specs: list[str], *, power_safe: bool = False):
        self.where = where
        self.specs = specs
        #: disks that honour flushes (scripts/fleet up --power-safe): for power cuts
        self.power_safe = power_safe
        self.machines: dict[str, dict] = {}
        #: each machine's pools in the config configure() wrote last
        self.pools: dict[str, set[str]] = {}

    def up(self, timeout: float = 1500) -> float:
        """Boot every machine; the seconds until the last answered SSH."""
        started = time.monotonic()
        done = subprocess.run([*FLEET, "up", str(self.where), *self.specs,
                               "--timeout", str(timeout),
                               *(["--power-safe"] if self.power_safe else [])],
                              cwd=REPO, capture_output=True, text=True, check=False,
                              timeout=timeout + 600)
        assert done.returncode == 0, f"scripts/fleet up: {done.stdout}{done.stderr}"
        self.machines = {m["name"]: m for m in
                         json.loads((self.where / "fleet.json").read_text())}
        return time.monotonic() - started

    def down(self) -> None:
        subprocess.run([*FLEET, "down", str(self.where)], cwd=REPO, check=False,
                       capture_output=True, timeout=600)

    def sh(self, name: str, line: str, *, stdin: str = "", check: bool = True,
           timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run a shell ``line`` on machine ``name`` as root."""
        done = subprocess.run([*FLEET, "ssh", str(self.where), name, line], cwd=REPO,
                              input=stdin, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"{name}$ {line}\nexit {done.returncode}\n{done.stdout}"
                                 f"{done.stderr}")
        return done

    def put(self, name: str, local: Path, remote: str) -> None:
        """Copy the file ``local`` to ``remote`` on machine ``name``."""
        done = subprocess.run([*FLEET, "ssh", str(self.where), name,
                               f"cat > {remote}.part && mv {remote}.part {remote}"],
                              cwd=REPO, input=local.read_bytes(), capture_output=True,
                              timeout=600, check=False)
        assert done.returncode == 0, done.stderr.decode(errors="replace")

    def reboot(self, name: str, timeout: float = 900) -> float:
        """Reboot machine ``name`` cleanly; the seconds until it answers SSH again."""
        started = time.monotonic()
        self.sh(name, "systemctl reboot", check=False, timeout=60)
        time.sleep(5)  # (SSH may still answer while it shuts down)
        done = subprocess.run([*FLEET, "wait", str(self.where), name, "--timeout",
                               str(timeout)], cwd=REPO, capture_output=True, text=True,
                              check=False, timeout=timeout + 120)
        assert done.returncode == 0, f"{name} did not come back: {done.stdout}{done.stderr}"
        return time.monotonic() - started

    def fleet_command(self, *words: str, timeout: float = 1200) -> None:
        """``scripts/fleet WORD DIR ARGS...`` (``cut``, ``heal``, ``poweroff``, ``poweron``)."""
        done = subprocess.run([*FLEET, words[0], str(self.where), *words[1:]], cwd=REPO,
                              capture_output=True, text=True, timeout=timeout, check=False)
        assert done.returncode == 0, f"scripts/fleet {' '.join(words)}: {done.stdout}" \
            f"{done.stderr}"

    def address(self, name: str) -> str:
        return self.machines[name]["address"]

    def hostnqn(self, name: str) -> str:
        return self.machines[name]["hostnqn"]

    def configure(self, name: str, config: str) -> None:
        """Write the machine's /etc/kvagent/kvagent.yaml, check it, reload the agent
        (:meth:`wait_pools_ready` then waits for this config's pools)."""
        self.sh(name, "cat > /etc/kvagent/kvagent.yaml && kvagent config validate "
                      "&& systemctl reload kvagent", stdin=config)
        data = yaml.safe_load(config)
        self.pools[name] = {pool["name"] for role in ("target", "initiator")
                            for pool in (data.get(role) or {}).get("pools", [])}

    def status(self, name: str) -> dict:
        return json.loads(self.sh(name, "kvagent -o json status").stdout)

    def wait_pools_ready(self, name: str, timeout: float = 600) -> dict:
        """Until every pool of the machine's agent is ready, and they are the pools of
        the config :meth:`configure` wrote last (a reload is not done when ``systemctl
        reload`` returns: until then the status shows the old config's); its status."""
        deadline = time.monotonic() + timeout
        while True:
            done = self.sh(name, "kvagent -o json status", check=False)
            if done.returncode == 0:
                status = json.loads(done.stdout)
                pools = status.get("pools", [])
                names = {p.get("name") for p in pools}
                if (pools and all(p.get("ready") for p in pools)
                        and names == self.pools.get(name, names)):
                    return status
            if time.monotonic() > deadline:
                raise AssertionError(f"{name}: pools not ready after {timeout}s: "
                                     f"{done.stdout}{done.stderr}")
            time.sleep(3)


def root_below(fleet: Fleet, name: str, mount_point: str) -> tuple[list[str], str, str]:
    """What machine ``name``'s root filesystem holds under ``mount_point`` (seen through a
    bind mount of /, so below whatever is mounted there): (the paths found under it, its
    ``lsattr -d`` line, what ``touch`` of a new file in it said)."""
    out = fleet.sh(name, f"mkdir -p /mnt/root && mount --bind / /mnt/root && "
                         f"find /mnt/root{mount_point} -mindepth 1; "
                         f"echo ==; lsattr -d /mnt/root{mount_point}; "
                         f"touch /mnt/root{mount_point}/x 2>&1; umount /mnt/root",
                   check=False).stdout
    found, rest = out.split("==\n", 1)
    flags, _, refused = rest.partition("\n")
    return found.split(), flags, refused.strip()


def nvmet_tree(fleet: Fleet, storage: str) -> str:
    """A storage machine's nvmet configfs tree: every directory, link target and value."""
    return fleet.sh(storage, r"""cd /sys/kernel/config/nvmet && find . | sort | while read -r p; do
  if [ -L "$p" ]; then echo "$p -> $(readlink "$p")"
  elif [ -f "$p" ]; then echo "$p = $(cat "$p" 2>&1 | tr '\n' ' ')"
  else echo "$p/"; fi
done""").stdout


def metric(text: str, name: str) -> float | None:
    """The value of metric ``name`` (its first series) in a /metrics page, or None."""
    m = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def build_image() -> tuple[str, Path, float]:
    """kvagent's container image (scripts/build-image: built only when out of date):
    (its reference, its OCI archive, the seconds it took)."""
    started = time.monotonic()
    done = subprocess.run([str(REPO / "scripts/build-image")], cwd=REPO,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=3600, check=False)
    assert done.returncode == 0, f"scripts/build-image: {done.stdout[-4000:]}" \
        f"{done.stderr[-4000:]}"
    image, archive = done.stdout.strip().splitlines()[-2:]
    return image, REPO / archive, time.monotonic() - started


def lvm_storage_config(fleet: Fleet, storage: str, gpu: str | list[str], nqn_prefix: str,
                       *, namespaces: int, more: str = "", peers: str = "") -> str:
    """``storage``'s kvagent.yaml: pool kv on LVM on its first drive, ``namespaces`` of
    1 GiB exported over NVMe/TCP on the private network to the GPU machine(s) ``gpu``
    (``more``: more pools; ``peers``: the YAML of target.peers' list items)."""
    hosts = ", ".join(f'{{name: {name}, nqn: "{fleet.hostnqn(name)}"}}'
                      for name in ([gpu] if isinstance(gpu, str) else gpu))
    return f"""version: 1
node: {{name: {storage}, nqn_prefix: {nqn_prefix}}}
target:
  ports:
    - {{name: tcp0, id: 1, transport: tcp, address: {fleet.address(storage)}, service: 4420}}
{f"  peers:{chr(10)}{peers}" if peers else ""}  pools:
    - name: kv
      backing:
        kind: lvm
        volume_group: vg_kv
        devices: [/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_{storage.upper()}0]
      namespaces: {{count: {namespaces}, size: 1GiB}}
      ports: [tcp0]
      hosts: [{hosts}]
{more}health: {{listen: "127.0.0.1:9808", interval: 5s}}
"""


# ------------------------------------------------------------------- a newer package

@dataclass
class NewerDeb:
    old_version: str
    version: str
    deb: Path


def build_newer_deb(where: Path) -> NewerDeb:
    """The package built from a copy of its sources with a bumped version (a new
    debian/changelog entry), by that copy's own scripts/build-deb (a tree that is not a
    git checkout: it packages every file there): the checkout is not touched."""
    src = where / "src"
    build_deb = (REPO / "scripts/build-deb").read_text()
    sources = re.search(r"^SOURCES=\(([^)]*)\)", build_deb, re.M)
    assert sources, "scripts/build-deb names no SOURCES=(...)"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
         *sources.group(1).split(), "scripts/build-deb"],
        cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (REPO / name).exists() or (REPO / name).is_symlink():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name, follow_symlinks=False)
    changelog = src / "debian/changelog"

    def field(name: str) -> str:
        return subprocess.run(["dpkg-parsechangelog", "-l", str(changelog), "-S", name],
                              capture_output=True, text=True, check=True).stdout.strip()

    old = field("Version")
    new = f"{old}+fleet1"
    # (dated after the entry before it, or lintian fails the build)
    when = email.utils.formatdate(max(time.time(), int(field("Timestamp")) + 1))
    changelog.write_text(
        f"kvagent ({new}) unstable; urgency=medium\n\n"
        "  * Built by tests/vmhost/fleet.py: a newer version for the fleet's\n"
        "    upgrades.\n\n"
        f" -- {field('Maintainer')}  {when.replace('-0000', '+0000')}\n\n"
        + changelog.read_text())
    done = subprocess.run([str(src / "scripts/build-deb"), "--force"], cwd=src,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=1800, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    deb = src / done.stdout.strip().splitlines()[-1]
    assert deb.name == f"kvagent_{new}_all.deb", deb
    return NewerDeb(old, new, deb)

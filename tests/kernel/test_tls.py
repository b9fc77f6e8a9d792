"""NVMe/TCP TLS on Debian 13's 6.12 (the kernel tier's second kernel), storage and GPU
side on the same VM over 127.0.0.1, with Debian 13's tlshd and nvme-cli 2.13
(scripts/fetch-tls-tools; Debian 12 has neither).

- A pool on a port with ``tls: required``: the port has addr_tsas tls1.3 and addr_treq
  required, the PSKs are in the .nvme keyring, the GPU side discovers and connects over
  TLS 1.3 (the controller has a TLS key, tlshd logged both handshakes), data written
  with O_DIRECT reads back with the same checksum; the next apply changes nothing and
  runs no nvme-cli key command.
- A plain connect (no TLS) to that port by an allowed host is dropped (ECONNRESET), and
  no controller appears.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from agent.dhchap import write_secret
from agent.naming import subsystem_nqn
from agent.system.keyring import tlshd_running
from agent.tlspsk import generate_psk, identity, read_psk

from . import kit
from .crash import ci_log
from .pools import Lab, assert_converged, assert_ok, mount_tmpfs, umount_all_under

pytestmark = [pytest.mark.kernel(group="kernel-6.12", kernel="6.12.117+deb13-amd64"),
              pytest.mark.second_kernel]
PREFIX = "nqn.2026-12.io.kvagent.tls"
NVMET = Path("/sys/kernel/config/nvmet")
OTHER = "nqn.2014-08.org.nvmexpress:uuid:2c4f6a80-1b3d-4e5f-8a7b-9c0d1e2f3a4b"
TOOLS = Path(__file__).resolve().parents[2] / "build/tls/bin"


@pytest.fixture
def tls_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    if not (TOOLS / "tlshd").exists():
        pytest.fail("build/tls/bin/tlshd is missing: run scripts/setup (scripts/fetch-tls-tools)")
    monkeypatch.setenv("PATH", f"{TOOLS}:{os.environ['PATH']}")  # nvme-cli 2.13 for kvagent
    kit.sh("modprobe", "nvme-keyring", check=False)
    conf = tmp_path / "tlshd.conf"
    conf.write_text("[debug]\nloglevel=1\ntls=0\nnl=0\n[authenticate]\nkeyrings=.nvme\n")
    log = open(tmp_path / "tlshd.log", "w")  # noqa: SIM115 (closed below)
    tlshd = subprocess.Popen([str(TOOLS / "tlshd"), "-c", str(conf), "-s"], stdout=log,
                             stderr=subprocess.STDOUT)
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "200m")
    kit.wait_for(tlshd_running, 30, what="tlshd")
    yield lab
    umount_all_under(tmp_path)
    kit.force_clean()
    tlshd.terminate()
    tlshd.wait(timeout=30)
    log.close()


def test_tls_port_connect_io_and_plain_connect_refused(tls_lab: Lab) -> None:
    lab = tls_lab
    keys = lab.root / "keys"
    keys.mkdir(mode=0o700)
    psk_file, other_psk = str(keys / "lab.psk"), str(keys / "other.psk")
    write_secret(psk_file, generate_psk())
    write_secret(other_psk, generate_psk())
    lab.write(f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports: [{{name: s, id: 1, transport: tcp, address: 127.0.0.1, service: 4420, tls: required}}]
  pools:
    - name: sec
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: 1, size: 64MiB}}
      ports: [s]
      shared: true
      hosts: [{{name: lab, nqn: "{lab.hostnqn}", tls: {{key_file: {psk_file}}}}},
              {{name: other, nqn: "{OTHER}", tls: {{key_file: {other_psk}}}}}]
initiator:
  device_wait: 60s
  pools:
    - name: sec
      target: {{transport: tcp, address: 127.0.0.1, service: 4420}}
      mount: {lab.root}/mnt/sec
      shared: true
      tls: {{key_file: {psk_file}}}
""")
    nqn = subsystem_nqn(PREFIX, "lab", "sec", None)
    first = lab.apply()
    assert_ok(first)
    assert kit.read(NVMET / "ports/1/addr_tsas") == "tls1.3"
    assert kit.read(NVMET / "ports/1/addr_treq") == "required"
    psk = read_psk(psk_file)
    keyring = Path("/proc/keys").read_text()
    assert identity(psk, lab.hostnqn, nqn) in keyring
    assert identity(psk, lab.hostnqn, "nqn.2014-08.org.nvmexpress.discovery") in keyring
    assert psk.text not in repr(first.to_json())
    [ctrl] = kit.controllers_for(nqn)
    assert kit.read(ctrl / "state") == "live"
    assert kit.read(ctrl / "tls_key") not in ("", "none")  # the connection's TLS PSK
    tlshd_log = (lab.root / "tlshd.log").read_text()
    assert tlshd_log.count("was successful") >= 2, tlshd_log  # client and server side
    device = kit.wait_for(lambda: kit.block_by_uuid(kit.exported_uuid(nqn, 1)), 30,
                          what="the namespace's block device")
    digest = kit.odirect_roundtrip(device, size=8 << 20)
    again = lab.apply()
    assert_converged(again)
    assert not [a for a in again.actions if a.kind == "tls-psk"]
    ci_log(f"tls: TLS 1.3 connect (PSK, tlshd) and 8 MiB O_DIRECT round trip {digest[:12]} on "
           f"{kit.read('/proc/sys/kernel/osrelease')}")

    # A plain connect (no TLS) to the TLS port by the pool's other host (allowed, with a
    # PSK of its own), straight through /dev/nvme-fabrics (nvme-cli turns a second
    # identity on one port away first): the target drops the connection.
    refused = kit.fabrics_connect(OTHER, nqn, None)
    assert refused == errno.ECONNRESET, os.strerror(refused)
    assert [c.name for c in kit.controllers_for(nqn)] == [ctrl.name]
    ci_log(f"tls: plain connect to the TLS port refused: {errno.errorcode[refused]}")

    lab.write_empty(PREFIX)
    assert_ok(lab.apply())
    assert not kit.controllers_for(nqn) and not (NVMET / "ports/1").exists()

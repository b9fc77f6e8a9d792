"""On Debian 12's 6.1 (no NVME_TARGET_AUTH, no NVME_TARGET_TCP_TLS): a pool whose host
asks for DH-HMAC-CHAP, or a pool on a port with TLS, is refused with the missing kernel
option named, nothing of it exported (no silent downgrade to NQN-only access or to a
plain port), while a pool without either next to it is exported."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.dhchap import generate, write_secret
from agent.naming import subsystem_nqn
from agent.tlspsk import generate_psk

from . import kit
from .pools import Lab, mount_tmpfs, umount_all_under

pytestmark = pytest.mark.kernel
PREFIX = "nqn.2026-11.io.kvagent.noauth"
OTHER = "nqn.2014-08.org.nvmexpress:uuid:7d1c0f3e-2b4a-4c5d-9e6f-0a1b2c3d4e5f"


def test_auth_on_a_kernel_without_target_auth_is_refused(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "64m")
    key = tmp_path / "keys/host.key"
    key.parent.mkdir(mode=0o700)
    write_secret(str(key), generate())
    try:
        lab.write(f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {tmp_path}/run}}
target:
  ports: [{{name: p, id: 5, transport: tcp, address: 127.0.0.1, service: 4420}}]
  pools:
    - name: sec
      backing: {{kind: file, directory: {tmp_path}/files, buffered_io: true}}
      namespaces: {{count: 1, size: 8MiB}}
      ports: [p]
      hosts: [{{name: lab, nqn: "{lab.hostnqn}", auth: {{key_file: {key}}}}}]
    - name: plain
      backing: {{kind: file, directory: {tmp_path}/files, buffered_io: true}}
      namespaces: {{count: 1, size: 8MiB}}
      ports: [p]
      hosts: [{{name: other, nqn: "{OTHER}"}}]
""")
        result = lab.apply()
        [err] = result.errors
        assert err.pool == "sec" and "no DH-HMAC-CHAP" in err.message, err
        assert "CONFIG_NVME_TARGET_AUTH" in (err.hint or "")
        subsystems = {p.name for p in Path("/sys/kernel/config/nvmet/subsystems").iterdir()}
        assert subsystem_nqn(PREFIX, "lab", "sec", "lab") not in subsystems
        assert subsystem_nqn(PREFIX, "lab", "plain", "other") in subsystems
        assert not (Path("/sys/kernel/config/nvmet/hosts") / lab.hostnqn).exists()
    finally:
        lab.write_empty(PREFIX)
        lab.apply()
        umount_all_under(tmp_path)
        kit.force_clean()


def test_tls_on_a_kernel_without_target_tls_is_refused(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "64m")
    psk = tmp_path / "keys/host.psk"
    psk.parent.mkdir(mode=0o700)
    write_secret(str(psk), generate_psk())
    try:
        lab.write(f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {tmp_path}/run}}
target:
  ports:
    - {{name: p, id: 5, transport: tcp, address: 127.0.0.1, service: 4420}}
    - {{name: s, id: 6, transport: tcp, address: 127.0.0.1, service: 4421, tls: required}}
  pools:
    - name: sec
      backing: {{kind: file, directory: {tmp_path}/files, buffered_io: true}}
      namespaces: {{count: 1, size: 8MiB}}
      ports: [s]
      hosts: [{{name: lab, nqn: "{lab.hostnqn}", tls: {{key_file: {psk}}}}}]
    - name: plain
      backing: {{kind: file, directory: {tmp_path}/files, buffered_io: true}}
      namespaces: {{count: 1, size: 8MiB}}
      ports: [p]
      hosts: [{{name: other, nqn: "{OTHER}"}}]
""")
        result = lab.apply()
        [err] = result.errors
        assert err.pool == "sec" and "no NVMe/TCP TLS" in err.message, err
        assert "CONFIG_NVME_TARGET_TCP_TLS" in (err.hint or "")
        nvmet = Path("/sys/kernel/config/nvmet")
        subsystems = {p.name for p in (nvmet / "subsystems").iterdir()}
        assert subsystem_nqn(PREFIX, "lab", "sec", "lab") not in subsystems
        assert subsystem_nqn(PREFIX, "lab", "plain", "other") in subsystems
        assert not (nvmet / "ports/6").exists() and (nvmet / "ports/5").exists()
    finally:
        lab.write_empty(PREFIX)
        lab.apply()
        umount_all_under(tmp_path)
        kit.force_clean()

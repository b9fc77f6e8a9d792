"""DH-HMAC-CHAP on Debian 13's 6.12 (the kernel tier's second kernel), storage and GPU
side on the same VM over NVMe/TCP on 127.0.0.1.

- The fake's 6.12 profile matches the running kernel (attribute sets and defaults).
- A pool whose host has a host secret and a controller secret (bidirectional, SHA-512,
  ffdhe2048): one apply connects with them, the next changes nothing, data round-trips.
- Rotation: new secret files, one apply: nvmet has the new secrets, the live controller
  got them without a disconnect (same controller), and a controller reset (a fresh
  authentication) succeeds with them.
- Turning auth off for a host with a secret is refused; the connection stays.
- A wrong secret and no secret are refused by the kernel, and kvagent says what to check.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.dhchap import generate, read_secret, write_secret
from agent.initiator.nvmecli import FabricsOptions, NvmeCli, PermanentConnectError
from agent.naming import subsystem_nqn
from nvmet.fake import KERNEL_6_12, profile_problems

from . import kit
from .capture_profile import capture
from .crash import ci_log
from .pools import Lab, assert_converged, assert_ok, mount_tmpfs, umount_all_under

pytestmark = [pytest.mark.kernel(group="kernel-6.12", kernel="6.12.117+deb13-amd64"),
              pytest.mark.second_kernel]
PREFIX = "nqn.2026-11.io.kvagent.auth"
NVMET = Path("/sys/kernel/config/nvmet")


@pytest.fixture
def lab(tmp_path: Path):
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "300m")
    yield lab
    umount_all_under(tmp_path)
    kit.force_clean()


def write_config(lab: Lab, *, target_auth: str, initiator_auth: str) -> None:
    lab.write(f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports: [{{name: p, id: 1, transport: tcp, address: 127.0.0.1, service: 4420}}]
  pools:
    - name: sec
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: 1, size: 64MiB}}
      ports: [p]
      shared: true
      hosts: [{{name: lab, nqn: "{lab.hostnqn}"{target_auth}}}]
initiator:
  device_wait: 60s
  pools:
    - name: sec
      target: {{transport: tcp, address: 127.0.0.1, service: 4420}}
      mount: {lab.root}/mnt/sec
      shared: true{initiator_auth}
""")


def test_the_fakes_6_12_profile_is_the_running_kernels() -> None:
    assert kit.read("/proc/sys/kernel/osrelease").startswith("6.12")
    assert profile_problems(KERNEL_6_12, capture()) == []


def test_dhchap_attach_rotate_and_refusals(lab: Lab) -> None:
    keys = lab.root / "keys"
    keys.mkdir(mode=0o700)
    host_key, ctrl_key = str(keys / "host.key"), str(keys / "ctrl.key")
    write_secret(host_key, generate())
    write_secret(ctrl_key, generate())
    with_auth = dict(
        target_auth=f", auth: {{key_file: {host_key}, ctrl_key_file: {ctrl_key}, "
                    "hash: sha512, dhgroup: ffdhe2048}",
        initiator_auth=f"\n      auth: {{key_file: {host_key}, ctrl_key_file: {ctrl_key}}}")
    write_config(lab, **with_auth)
    nqn = subsystem_nqn(PREFIX, "lab", "sec", None)
    host = NVMET / "hosts" / lab.hostnqn

    first = lab.apply()
    assert_ok(first)
    assert kit.read(host / "dhchap_key") == read_secret(host_key).text
    assert kit.read(host / "dhchap_hash") == "hmac(sha512)"
    [ctrl] = kit.controllers_for(nqn)
    assert kit.read(ctrl / "state") == "live"
    assert kit.read(ctrl / "dhchap_secret") == read_secret(host_key).text
    assert kit.read(ctrl / "dhchap_ctrl_secret") == read_secret(ctrl_key).text
    device = kit.wait_for(lambda: kit.block_by_uuid(kit.exported_uuid(nqn, 1)), 30,
                          what="the namespace's block device")
    kit.odirect_roundtrip(device)
    assert_converged(lab.apply())
    ci_log(f"auth: bidirectional DH-HMAC-CHAP (sha512, ffdhe2048) connect on "
               f"{kit.read('/proc/sys/kernel/osrelease')}")

    # Rotation: both files get new secrets; one apply, no disconnect.
    write_secret(host_key, generate(), replace=True)
    write_secret(ctrl_key, generate(), replace=True)
    rotated = lab.apply()
    assert_ok(rotated)
    assert kit.read(host / "dhchap_key") == read_secret(host_key).text
    assert kit.read(host / "dhchap_ctrl_key") == read_secret(ctrl_key).text
    assert [c.name for c in kit.controllers_for(nqn)] == [ctrl.name]  # the same controller
    assert kit.read(ctrl / "dhchap_secret") == read_secret(host_key).text
    assert kit.wait_for(lambda: kit.read(ctrl / "state") == "live", 30, what="live")
    kit.odirect_roundtrip(device)
    kit.write(ctrl / "reset_controller", "1")  # a fresh authentication, with the new secrets
    kit.wait_for(lambda: kit.read(ctrl / "state") == "live", 60, what="live after a reset")
    kit.odirect_roundtrip(device)
    assert_converged(lab.apply())

    # Turning auth off for this host: refused, nothing changed, still connected.
    write_config(lab, target_auth="", initiator_auth="")
    off = lab.apply()
    assert any("cannot remove a secret" in e.message for e in off.errors), off.errors
    assert kit.read(host / "dhchap_key") == read_secret(host_key).text
    assert kit.read(ctrl / "state") == "live"

    # A wrong secret and no secret: refused by the kernel, explained by kvagent (with the
    # controller gone: a second one of the same host identity is turned away first).
    kit.sh("nvme", "disconnect", "-n", nqn)
    kit.wait_for(lambda: not kit.controllers_for(nqn), 30, what="the controller to go")
    cli = NvmeCli()
    for secret, errno_name, words in ((generate().text, "EKEYREJECTED", "must hold the secret"),
                                      (None, "ENOKEY", "requires DH-HMAC-CHAP")):
        with pytest.raises(PermanentConnectError) as refused:
            cli.connect("tcp", "127.0.0.1", 4420, nqn, hostnqn=lab.hostnqn,
                        options=FabricsOptions(ctrl_loss_tmo=None, dhchap_secret=secret))
        assert refused.value.errno_name == errno_name, refused.value
        assert words in (refused.value.hint or "")
        if secret:
            assert secret not in str(refused.value)
    assert not kit.controllers_for(nqn)

    # Detach and unexport: nothing left.
    lab.write(f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target: {{ports: [], pools: []}}
initiator: {{pools: []}}
""")
    assert_ok(lab.apply())
    assert not kit.controllers_for(nqn) and not host.exists()

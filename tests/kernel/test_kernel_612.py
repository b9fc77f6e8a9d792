"""The second kernel (Debian 13's 6.12): the nvmet errno table, the defaults against the
fake's 6.12 profile, and a smoke of kvagent's main job over NVMe/TCP and NVMe/RDMA
(soft-RoCE): export -> attach (xfs, mounted) -> kvagent bench -> detach -> unexport."""

from __future__ import annotations

import errno as E
import json
import os
from pathlib import Path

import pytest

from nvmet.fake import KERNEL_6_12, FakeConfigFS
from tests.unit.nvmet.errno_table import CASES, defaults_snapshot, run_case

from . import kit
from .crash import ci_log
from .pools import Lab, assert_converged, assert_ok, mount_tmpfs, umount_all_under
from .test_nvmet_errno import KernelEnv

#: Weights: minutes under TCG (the errno cases take seconds each).
KERNEL = "6.12.117+deb13-amd64"
pytestmark = [pytest.mark.kernel(group="kernel-6.12", kernel=KERNEL, weight=0.05),
              pytest.mark.second_kernel]
PREFIX = "nqn.2026-11.io.kvagent.smoke"


class KernelEnv612(KernelEnv):
    """6.1's environment, but files without O_DIRECT on a ramfs: tmpfs has O_DIRECT since
    6.6 (a file on the guest's /tmp enables on 6.12)."""

    def __init__(self, nullb, scratch: Path):  # type: ignore[no-untyped-def]
        nodirect = scratch / "ramfs"
        nodirect.mkdir()
        kit.sh("mount", "-t", "ramfs", "kvramfs", str(nodirect))
        self._ramfs = nodirect
        super().__init__(nullb, nodirect)

    def close(self) -> None:
        try:
            super().close()
        finally:
            kit.sh("umount", str(self._ramfs), check=False)


@pytest.fixture
def kenv(nullb, tmp_path):  # type: ignore[no-untyped-def]
    env = KernelEnv612(nullb, tmp_path)
    assert kit.nvmet_is_empty(), kit.nvmet_tree()
    try:
        yield env
    finally:
        env.close()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_errno_rule_on_6_12(case, kenv) -> None:  # type: ignore[no-untyped-def]
    if case.name.startswith("rdma_"):
        kenv.setup_rdma()
    got = run_case(case, kenv)
    assert got == case.expect, (
        f"{case.rule}: expected {E.errorcode.get(case.expect, case.expect)}, "
        f"got {E.errorcode.get(got, got)}")


def test_mkdir_defaults_match_the_fakes_6_12_profile(kenv) -> None:  # type: ignore[no-untyped-def]
    assert defaults_snapshot(kenv.fs) == defaults_snapshot(FakeConfigFS(profile=KERNEL_6_12))


@pytest.fixture
def lab(tmp_path: Path):
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "900m")
    yield lab
    umount_all_under(tmp_path)
    kit.force_clean()


def smoke_config(lab: Lab, transport: str, address: str, attach: bool = True) -> None:
    text = f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports: [{{name: p, id: 3, transport: {transport}, address: {address}, service: 4420}}]
  pools:
    - name: kv
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: 1, size: 400MiB}}
      ports: [p]
      hosts: [{{name: lab, nqn: "{lab.hostnqn}"}}]
"""
    if attach:
        text += f"""
initiator:
  device_wait: 60s
  pools:
    - name: kv
      target: {{transport: {transport}, address: {address}, service: 4420}}
      mount: {lab.root}/mnt/kv
"""
    lab.write(text)


@pytest.mark.kernel(group="kernel-6.12", kernel=KERNEL, weight=1.5)
@pytest.mark.parametrize("transport", ["tcp", "rdma"])
def test_export_attach_bench_detach(lab: Lab, transport: str, request) -> None:  # type: ignore[no-untyped-def]
    address = "127.0.0.1"
    if transport == "rdma":
        address = request.getfixturevalue("rxe").address
    smoke_config(lab, transport, address)
    first = lab.apply()
    assert_ok(first)
    mount = lab.root / "mnt/kv/lab-ns1"
    assert os.path.ismount(mount)
    assert_converged(lab.apply())
    bench = lab.cli("-o", "json", "bench", "kv", "--profile", "tiny", check=True)
    report = json.loads(bench.stdout)
    jobs = [j for d in report["directories"] for j in d["jobs"]]
    reads = [j for j in jobs if j["rw"] == "read"]
    assert reads and all(j["bw_bytes"] > 0 for j in reads), jobs
    ci_log(f"6.12 smoke over {transport}: best read "
           f"{max(j['gbps'] for j in reads):.3f} GB/s (TCG)")
    smoke_config(lab, transport, address, attach=False)
    assert_ok(lab.apply())
    assert not os.path.ismount(mount)
    assert not any(kit.read(c / "transport") in ("tcp", "rdma")
                   for c in Path("/sys/class/nvme").glob("nvme*"))
    lab.write(f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target: {{ports: [], pools: []}}
""")
    assert_ok(lab.apply())
    assert kit.nvmet_is_empty(), kit.nvmet_tree()

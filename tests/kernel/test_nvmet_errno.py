"""The shared nvmet errno table (tests/unit/nvmet/errno_table.py) on the real 6.1 kernel.

Same cases, same expectations as the fake in the unit tier: a rule that differs here
fails both the fake's claim and this test.
"""

from __future__ import annotations

import errno as E
import itertools
import socket
from pathlib import Path

import pytest

from nvmet.configfs import RealConfigFS
from nvmet.fake import FakeConfigFS
from tests.unit.nvmet.errno_table import CASES, defaults_snapshot, run_case, wipe

from . import kit

pytestmark = pytest.mark.kernel

DUMMY = "kvdummy0"
DUMMY_ADDR = "10.98.0.1"


class KernelEnv:
    """Real configfs, null_blk devices, files on the guest's /tmp (no O_DIRECT there)."""

    local_addr = "127.0.0.1"
    rdma_nodev_addr = DUMMY_ADDR

    def __init__(self, nullb, scratch: Path):
        self.fs = RealConfigFS(kit.NVMET)
        self._nullb = nullb
        self._scratch = scratch
        self._sockets: list[socket.socket] = []
        self._dummy = False
        self._n = itertools.count()

    def block_device(self) -> str:
        return self._nullb(64)

    def nodirect_file(self) -> str:
        path = self._scratch / f"nodirect{next(self._n)}.img"
        with open(path, "wb") as f:
            f.truncate(64 << 20)
        return str(path)

    def missing_path(self) -> str:
        return str(self._scratch / "missing-device")

    def directory(self) -> str:
        return str(self._scratch)

    def occupy(self, addr: str, svcid: str) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, int(svcid)))
        s.listen()
        self._sockets.append(s)

    def setup_rdma(self) -> None:
        """A local non-loopback address without an RDMA device (a dummy interface)."""
        kit.modprobe("nvmet-rdma")
        kit.sh("ip", "link", "add", DUMMY, "type", "dummy")
        self._dummy = True
        kit.sh("ip", "addr", "add", f"{DUMMY_ADDR}/24", "dev", DUMMY)
        kit.sh("ip", "link", "set", DUMMY, "up")

    def close(self) -> None:
        try:
            wipe(self.fs)
        finally:
            for s in self._sockets:
                s.close()
            if self._dummy:
                kit.sh("ip", "link", "del", DUMMY, check=False)


@pytest.fixture
def kenv(nullb, tmp_path):
    env = KernelEnv(nullb, tmp_path)
    assert kit.nvmet_is_empty(), kit.nvmet_tree()
    try:
        yield env
    finally:
        env.close()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_errno_rule_on_real_kernel(case, kenv) -> None:
    if case.name.startswith("rdma_"):
        kenv.setup_rdma()
    got = run_case(case, kenv)
    assert got == case.expect, (
        f"{case.rule}: expected {E.errorcode.get(case.expect, case.expect)}, "
        f"got {E.errorcode.get(got, got)}")


def test_mkdir_defaults_match_the_fake(kenv) -> None:
    """Every file and default group that mkdir creates, with modes and values, is what
    the fake creates (random device_uuid/attr_serial checked for format)."""
    real = defaults_snapshot(kenv.fs)
    fake = defaults_snapshot(FakeConfigFS())
    assert real == fake

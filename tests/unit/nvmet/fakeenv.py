"""The fake backend for the shared errno table (tests/unit/nvmet/errno_table.py)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from nvmet.fake import FakeConfigFS


class FakeEnv:
    """Devices and addresses registered with an in-memory FakeConfigFS."""

    local_addr = "127.0.0.1"
    rdma_nodev_addr = "10.98.0.1"

    def __init__(self, profile: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.fs = FakeConfigFS(local_addresses={"127.0.0.1", "::1", self.rdma_nodev_addr},
                               profile=profile)
        self._n = itertools.count()

    def block_device(self) -> str:
        path = f"/dev/fakeblk{next(self._n)}"
        self.fs.add_device(path, "block")
        return path

    def nodirect_file(self) -> str:
        path = "/tmp/kvagent-fake-nodirect.img"
        self.fs.add_device(path, "file-nodirect")
        return path

    def missing_path(self) -> str:
        return "/tmp/kvagent-errno-missing-device"

    def directory(self) -> str:
        self.fs.add_device("/tmp", "dir")
        return "/tmp"

    def occupy(self, addr: str, svcid: str) -> None:
        self.fs.occupy(addr, svcid)

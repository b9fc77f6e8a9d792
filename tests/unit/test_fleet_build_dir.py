"""scripts/fleet's build directory after a build killed midway: mmdebstrap leaves /proc,
/sys, /dev/pts, /dev/shm and the .deb mounted inside it. Removing it as a plain tree
(what the script did) deletes through those mounts: the files of the host's own
/dev/shm. A session found such a directory left behind, its mounts live."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

FLEET = Path(__file__).resolve().parents[2] / "scripts/fleet"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")


def fleet_module() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("kvfleet", str(FLEET))
    spec = importlib.util.spec_from_loader("kvfleet", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kvfleet"] = module  # (its dataclasses look their module up)
    loader.exec_module(module)
    return module


@pytest.fixture
def left_behind(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A build directory with a tmpfs (the host's /dev/shm, as far as the build knows)
    mounted at root/dev/shm, holding a file; (the directory, that file)."""
    work = tmp_path / "kvfleet-build-x"
    shm = work / "root/dev/shm"
    shm.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "kvtest", str(shm)], check=True)
    (shm / "host file").write_text("not the build's")
    try:
        yield work, shm / "host file"
    finally:
        subprocess.run(["umount", str(shm)], check=False, capture_output=True)


def test_a_build_directory_is_removed_after_its_mounts_and_never_through_them(
        left_behind: tuple[Path, Path]) -> None:
    work, host_file = left_behind
    fleet = fleet_module()
    assert fleet.mounts_below(work) == [str(work / "root/dev/shm")]
    with open(host_file) as held:  # (busy: umount fails)
        with pytest.raises(SystemExit, match=r"still mounted there: .*/root/dev/shm"):
            fleet.remove_build_dir(work)
        assert host_file.read_text() == "not the build's" and held.readable()
    fleet.remove_build_dir(work)
    assert not work.exists()
    assert fleet.mounts_below(work.parent) == []

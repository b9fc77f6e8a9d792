"""agent.system.gds.probe_gds over a fake host root: nvidia-fs and cuFile found or not."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.system.gds import probe_gds


def host(tmp_path: Path, *, module: str | None = None, devices: int = 0,
         cache: bytes | None = None, cuda_lib: str | None = None) -> Path:
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    if module:
        (root / module).mkdir(parents=True)
    for i in range(devices):
        (root / f"dev/nvidia-fs{i}").touch()
    if cache is not None:
        (root / "etc").mkdir()
        (root / "etc/ld.so.cache").write_bytes(cache)
    if cuda_lib:
        (root / cuda_lib).parent.mkdir(parents=True)
        (root / cuda_lib).touch()
    return root


# What /etc/ld.so.cache holds around a library (glibc-ld.so.cache1.1: names and paths as
# NUL-terminated strings after a binary header).
CACHE = (b"glibc-ld.so.cache1.1\x00\x00\x03\x00\x00\x00" + b"\x00" * 24
         + b"libcufile_rdma.so.1\x00/usr/lib/x86_64-linux-gnu/libcufile_rdma.so.1\x00"
         + b"libcufile.so.0\x00/usr/lib/x86_64-linux-gnu/libcufile.so.0\x00"
         + b"libc.so.6\x00/lib/x86_64-linux-gnu/libc.so.6\x00")


def test_everything_present_is_ready(tmp_path: Path) -> None:
    g = probe_gds(host(tmp_path, module="sys/module/nvidia_fs", devices=2, cache=CACHE))
    assert g.ready and g.missing == ()
    assert g.cufile == "/usr/lib/x86_64-linux-gnu/libcufile.so.0"
    assert g.nvidia_fs_module == "/sys/module/nvidia_fs"
    assert g.nvidia_fs_devices == "/dev/nvidia-fs0"
    assert "nvidia-fs loaded" in g.describe()


def test_proc_driver_counts_as_the_module_and_cuda_dirs_as_the_library(tmp_path: Path) -> None:
    g = probe_gds(host(tmp_path, module="proc/driver/nvidia-fs", devices=1,
                       cuda_lib="usr/local/cuda-12.8/targets/x86_64-linux/lib/libcufile.so.0"))
    assert g.ready
    assert g.cufile == "/usr/local/cuda-12.8/targets/x86_64-linux/lib/libcufile.so.0"


@pytest.mark.parametrize(("kw", "missing"), [
    ({"cache": CACHE}, ["nvidia-fs kernel module is not loaded"]),
    ({"module": "sys/module/nvidia_fs", "cache": CACHE}, ["no device nodes"]),
    ({"module": "sys/module/nvidia_fs", "devices": 1,
      "cache": CACHE.replace(b"libcufile.so.0", b"libcuxxxx.so.0")}, ["cuFile"]),
    ({}, ["nvidia-fs kernel module is not loaded", "cuFile"]),
])
def test_what_is_missing_is_named(tmp_path: Path, kw: dict, missing: list[str]) -> None:
    g = probe_gds(host(tmp_path, **kw))
    assert not g.ready
    assert len(g.missing) == len(missing)
    for line, words in zip(g.missing, missing, strict=True):
        assert words in line
    assert g.describe().startswith("GPUDirect Storage not usable")

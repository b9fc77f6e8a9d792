"""Is GPUDirect Storage usable on this host? nvidia-fs (kernel) and cuFile (library).

GPUDirect Storage moves data between NVMe and GPU memory through NVIDIA's cuFile
library (``libcufile.so``) and, for the direct path, the ``nvidia-fs`` kernel module
(``/proc/driver/nvidia-fs``, device nodes ``/dev/nvidia-fs*``). :func:`probe_gds`
looks for both without loading anything or running a command: a few stats and one
read of the dynamic linker's cache (``/etc/ld.so.cache``), then the usual CUDA
library directories. ``root`` lets tests give a tree of their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: The library cuFile ships as (libcufile.so.0 / .so.1 on current CUDA releases).
CUFILE = "libcufile.so"
#: Where CUDA installs libraries that the linker cache may not list.
CUDA_LIB_GLOBS = ("usr/local/cuda*/targets/*/lib/libcufile.so*",
                  "usr/local/cuda*/lib64/libcufile.so*")
_CACHE_PATH = re.compile(rb"/[\x21-\x7e]*/libcufile\.so[.0-9]*")
INSTALL_HINT = ("install NVIDIA GPUDirect Storage on this host (the nvidia-fs module and "
                "cuFile: the 'nvidia-gds' package of NVIDIA's CUDA repository), load it "
                "(modprobe nvidia-fs) and check it with gdscheck -p")


@dataclass(frozen=True)
class GdsReadiness:
    """What this host has of GPUDirect Storage; ``None`` fields are missing."""

    nvidia_fs_module: str | None  # where the loaded module shows itself
    nvidia_fs_devices: str | None  # one of its device nodes
    cufile: str | None  # path of libcufile

    @property
    def ready(self) -> bool:
        return not self.missing

    @property
    def missing(self) -> tuple[str, ...]:
        """What is missing, in words (empty when GDS is usable)."""
        out = []
        if self.nvidia_fs_module is None:
            out.append("the nvidia-fs kernel module is not loaded (no /sys/module/nvidia_fs, "
                       "no /proc/driver/nvidia-fs)")
        elif self.nvidia_fs_devices is None:
            out.append("nvidia-fs has no device nodes (/dev/nvidia-fs*)")
        if self.cufile is None:
            out.append(f"cuFile ({CUFILE}) is not installed (not in /etc/ld.so.cache or "
                       "/usr/local/cuda*)")
        return tuple(out)

    def describe(self) -> str:
        """One line for notes and logs."""
        if self.ready:
            return (f"GPUDirect Storage: nvidia-fs loaded ({self.nvidia_fs_module}, "
                    f"{self.nvidia_fs_devices}), cuFile at {self.cufile}")
        return "GPUDirect Storage not usable: " + "; ".join(self.missing)


def _cufile_in_cache(root: Path) -> str | None:
    try:
        data = (root / "etc/ld.so.cache").read_bytes()
    except OSError:
        return None
    match = _CACHE_PATH.search(data)
    return match.group().decode() if match else None


def probe_gds(root: Path = Path("/")) -> GdsReadiness:
    """Look for nvidia-fs and cuFile under ``root`` (the host's ``/``)."""
    module = next((str(Path("/") / p) for p in ("sys/module/nvidia_fs", "proc/driver/nvidia-fs")
                   if (root / p).exists()), None)
    devices = next((str(Path("/dev") / p.name) for p in sorted((root / "dev").glob("nvidia-fs*"))),
                   None)
    cufile = _cufile_in_cache(root)
    if cufile is None:
        cufile = next((str(Path("/") / p.relative_to(root)) for pattern in CUDA_LIB_GLOBS
                       for p in sorted(root.glob(pattern))), None)
    return GdsReadiness(module, devices, cufile)

"""Probes of a mounted pool directory: what an engine can really do there.

``probe_mount(path)`` writes and reads back a few MiB with O_DIRECT, asks for a
fallocate and checks that blocks were really reserved, reads the direct-I/O
alignment (statx STATX_DIOALIGN), the backing device's logical block size
(sysfs), free space (statvfs), and records the transport the caller passes.

A failing probe never raises: the result records which step failed and the
errno, so renderers can switch engines to their fallback settings. Temporary
files are always removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno as errno_mod
import mmap
import os
import platform
import stat
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

#: Bytes written and read back with O_DIRECT (what the probe asks is whether O_DIRECT
#: works there, not how fast: a probe is on the path of every namespace added).
ODIRECT_BYTES = 1024 * 1024
#: Bytes fallocate is asked to reserve.
FALLOCATE_BYTES = 16 * 1024 * 1024
_PAGE = mmap.PAGESIZE
_TEMP_PREFIX = ".kvagent-probe-"

# statx(2): <linux/stat.h>
STATX_DIOALIGN = 0x00002000
_AT_FDCWD = -100
_STATX_SYSCALL = {"x86_64": 332, "aarch64": 291}
_STX_MASK_OFFSET = 0
_STX_DEV_MAJOR_OFFSET = 136
_STX_DIO_MEM_ALIGN_OFFSET = 152
_STX_DIO_OFFSET_ALIGN_OFFSET = 156
_STATX_SIZE = 256
#: The system calls this module makes past Python's own wrappers (fallocate and statx
#: through libc, anonymous mmap buffers for O_DIRECT); the unit's SystemCallFilter must
#: allow them (tests/unit/health/test_systemd_syscalls.py).
SYSCALLS = ("fallocate", "statx", "mmap", "munmap")


@dataclass(frozen=True)
class StepFailure:
    """Which step of a probe failed, with the errno when the kernel gave one."""

    step: str
    errno: int | None
    error: str


@dataclass(frozen=True)
class ODirectResult:
    """An aligned O_DIRECT write, fsync and read-back of ``size_bytes`` in a temp file."""

    ok: bool
    size_bytes: int
    alignment: int
    failure: StepFailure | None = None


@dataclass(frozen=True)
class FallocateResult:
    """fallocate(2) of ``requested_bytes``; ``reserved_bytes`` is how much st_blocks grew."""

    ok: bool
    requested_bytes: int
    reserved_bytes: int | None = None
    method: str | None = None
    failure: StepFailure | None = None


@dataclass(frozen=True)
class DioAlign:
    """statx STATX_DIOALIGN; both None when the kernel or filesystem does not report it."""

    mem_align: int | None
    offset_align: int | None
    error: str | None = None


@dataclass(frozen=True)
class ProbeResult:
    """Everything kvagent learned about one mounted directory (JSON via ``asdict``)."""

    path: str
    transport: str | None
    started_at: str
    finished_at: str
    odirect_ok: bool
    fallocate_ok: bool
    odirect: ODirectResult
    fallocate: FallocateResult
    dio_align: DioAlign
    device: str | None
    logical_block_size: int | None
    total_bytes: int | None
    free_bytes: int | None
    errors: tuple[str, ...] = ()


def probe_mount(path: str | os.PathLike[str], transport: str | None = None, *,
                sysfs: str | os.PathLike[str] = "/sys",
                odirect_bytes: int = ODIRECT_BYTES,
                fallocate_bytes: int = FALLOCATE_BYTES,
                clock: Callable[[], datetime] | None = None) -> ProbeResult:
    """Probe the directory ``path`` (normally a pool mount); never raises for a failing probe.

    ``transport`` is recorded as given (the caller knows whether the pool came
    over tcp or rdma). ``sysfs`` is the sysfs root used for the block size.
    """
    now = clock or (lambda: datetime.now(timezone.utc))
    started = now()
    directory = os.fspath(path)
    errors: list[str] = []

    st_dev: int | None = None
    try:
        st = os.stat(directory)
        if not stat.S_ISDIR(st.st_mode):
            errors.append(f"{directory} is not a directory")
        st_dev = st.st_dev
    except OSError as exc:
        errors.append(f"stat {directory}: {exc.strerror or exc}")

    total_bytes = free_bytes = None
    try:
        vfs = os.statvfs(directory)
        total_bytes = vfs.f_blocks * vfs.f_frsize
        free_bytes = vfs.f_bavail * vfs.f_frsize
    except OSError as exc:
        errors.append(f"statvfs {directory}: {exc.strerror or exc}")

    device = logical = None
    if st_dev is not None:
        device = f"{os.major(st_dev)}:{os.minor(st_dev)}"
        logical = logical_block_size(st_dev, sysfs)

    dio = _dio_of_temp_file(directory)
    alignment = max(_PAGE, logical or 0, dio.offset_align or 0, dio.mem_align or 0)
    odirect = _probe_odirect(directory, odirect_bytes, alignment)
    fallocate = _probe_fallocate(directory, fallocate_bytes, free_bytes)

    return ProbeResult(
        path=directory,
        transport=transport,
        started_at=_iso(started),
        finished_at=_iso(now()),
        odirect_ok=odirect.ok,
        fallocate_ok=fallocate.ok,
        odirect=odirect,
        fallocate=fallocate,
        dio_align=dio,
        device=device,
        logical_block_size=logical,
        total_bytes=total_bytes,
        free_bytes=free_bytes,
        errors=tuple(errors),
    )


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _temp_name(directory: str) -> str:
    return os.path.join(directory, f"{_TEMP_PREFIX}{uuid.uuid4().hex}.tmp")


def _failure(step: str, exc: BaseException) -> StepFailure:
    if isinstance(exc, OSError):
        code = exc.errno
        name = errno_mod.errorcode.get(code, "") if code is not None else ""
        text = exc.strerror or str(exc)
        return StepFailure(step, code, f"{name}: {text}" if name else text)
    return StepFailure(step, None, str(exc))


def _remove(name: str, created: bool) -> None:
    """Unlink our temp file. ``created`` False means open failed before any file was ours."""
    if not created:
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name)


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def _probe_odirect(directory: str, size: int, alignment: int) -> ODirectResult:
    """Aligned O_DIRECT write + fsync + read-back through a fresh temp file.

    O_DIRECT can be accepted at open() and refused at write() (or read()), so
    every step is tried and the first failing one is recorded.
    """
    size = max(alignment, _round_up(size, alignment))
    if not hasattr(os, "O_DIRECT"):
        return ODirectResult(False, size, alignment,
                             StepFailure("open", None, "O_DIRECT is not available here"))
    name = _temp_name(directory)
    payload = _pattern(size)
    src = mmap.mmap(-1, size)
    dst = mmap.mmap(-1, size)
    created = False
    step = "open"
    try:
        src.write(payload)
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600)
        except OSError as exc:
            # The kernel may create the file and then refuse O_DIRECT (EINVAL): the
            # name is unique to us, so a file left there is ours to remove.
            created = exc.errno != errno_mod.EEXIST
            raise
        created = True
        try:
            step = "write"
            written = os.pwritev(fd, [src], 0)
            if written != size:
                raise OSError(errno_mod.EIO, f"short write: {written} of {size} bytes")
            step = "fsync"
            os.fsync(fd)
            step = "read"
            got = os.preadv(fd, [dst], 0)
            if got != size:
                raise OSError(errno_mod.EIO, f"short read: {got} of {size} bytes")
        finally:
            os.close(fd)
        step = "verify"
        if dst[:] != payload:  # (memcmp: two sha256 digests were most of a probe under TCG)
            return ODirectResult(False, size, alignment,
                                 StepFailure("verify", None, "data read back differs"))
        return ODirectResult(True, size, alignment)
    except OSError as exc:
        return ODirectResult(False, size, alignment, _failure(step, exc))
    finally:
        src.close()
        dst.close()
        _remove(name, created)


def _pattern(size: int) -> bytes:
    """``size`` bytes to write and read back: one random 4 KiB block repeated, each copy
    stamped with its index, so stale, zeroed or misplaced blocks read back differ
    (``os.urandom`` of the whole size cost a tenth of a probe under TCG)."""
    blocks = -(-size // 4096)
    data = bytearray(os.urandom(4096) * blocks)
    for i in range(blocks):
        struct.pack_into("<Q", data, i * 4096, i)
    return bytes(data[:size])


def _libc_fallocate() -> Callable[[int, int, int, int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        func = libc.fallocate
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    func.restype = ctypes.c_int
    return func


def _fallocate(fd: int, length: int) -> str:
    """fallocate(2) mode 0 via libc (no emulation); posix_fallocate only without it.

    Returns the method used; raises OSError with the kernel's errno.
    """
    func = _libc_fallocate()
    if func is None:
        os.posix_fallocate(fd, 0, length)
        return "posix_fallocate"
    if func(fd, 0, 0, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return "fallocate"


def _probe_fallocate(directory: str, size: int, free_bytes: int | None) -> FallocateResult:
    """fallocate ``size`` bytes (less when space is short) and check st_blocks really grew."""
    if free_bytes is not None and free_bytes < 4 * size:
        size = (free_bytes // 4) // (1024 * 1024) * (1024 * 1024)
        if size <= 0:
            return FallocateResult(False, 0, None, None, StepFailure(
                "space", errno_mod.ENOSPC, f"only {free_bytes} bytes free; nothing probed"))
    name = _temp_name(directory)
    created = False
    step = "open"
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        created = True
        try:
            before = os.fstat(fd).st_blocks
            step = "fallocate"
            method = _fallocate(fd, size)
            step = "fstat"
            after = os.fstat(fd).st_blocks
        finally:
            os.close(fd)
        reserved = (after - before) * 512
        if reserved < size:
            return FallocateResult(False, size, reserved, method, StepFailure(
                "reserve", None,
                f"fallocate returned success but st_blocks grew by {reserved} of {size} bytes"))
        return FallocateResult(True, size, reserved, method)
    except OSError as exc:
        return FallocateResult(False, size, None, None, _failure(step, exc))
    finally:
        _remove(name, created)


def statx_dioalign(path: str) -> DioAlign:
    """STATX_DIOALIGN of ``path`` through the raw statx syscall (Python has no os.statx)."""
    number = _STATX_SYSCALL.get(platform.machine())
    if number is None:
        return DioAlign(None, None, f"statx syscall number unknown on {platform.machine()}")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    except OSError as exc:
        return DioAlign(None, None, f"libc: {exc}")
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    rc = libc.syscall(ctypes.c_long(number), ctypes.c_int(_AT_FDCWD),
                      ctypes.c_char_p(os.fsencode(path)), ctypes.c_int(0),
                      ctypes.c_uint(STATX_DIOALIGN), buf)
    if rc != 0:
        code = ctypes.get_errno()
        return DioAlign(None, None, f"statx: {os.strerror(code)}")
    raw = buf.raw
    mask = int.from_bytes(raw[_STX_MASK_OFFSET:_STX_MASK_OFFSET + 4], "little")
    if not mask & STATX_DIOALIGN:
        return DioAlign(None, None, "the kernel or filesystem does not report STATX_DIOALIGN")
    mem = int.from_bytes(raw[_STX_DIO_MEM_ALIGN_OFFSET:_STX_DIO_MEM_ALIGN_OFFSET + 4], "little")
    off = int.from_bytes(
        raw[_STX_DIO_OFFSET_ALIGN_OFFSET:_STX_DIO_OFFSET_ALIGN_OFFSET + 4], "little")
    # 0 means "direct I/O not supported on this file" (statx(2)).
    if mem == 0 and off == 0:
        return DioAlign(None, None, "statx reports no direct I/O support for this file")
    return DioAlign(mem, off)


def _dio_of_temp_file(directory: str) -> DioAlign:
    """STATX_DIOALIGN of a regular temp file in ``directory`` (filesystems report it per file)."""
    name = _temp_name(directory)
    created = False
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        created = True
        os.close(fd)
        return statx_dioalign(name)
    except OSError as exc:
        return DioAlign(None, None, f"temp file: {exc.strerror or exc}")
    finally:
        _remove(name, created)


def logical_block_size(st_dev: int, sysfs: str | os.PathLike[str] = "/sys") -> int | None:
    """Logical block size of the block device behind ``st_dev``; None when it has none.

    Reads ``<sysfs>/dev/block/M:m/queue/logical_block_size``; a partition has no
    queue of its own, so its parent disk's is used.
    """
    node = Path(sysfs) / "dev" / "block" / f"{os.major(st_dev)}:{os.minor(st_dev)}"
    candidates = [node / "queue" / "logical_block_size"]
    if (node / "partition").exists():
        candidates.append(node.resolve().parent / "queue" / "logical_block_size")
    for candidate in candidates:
        try:
            return int(candidate.read_text().strip())
        except (OSError, ValueError):
            continue
    return None

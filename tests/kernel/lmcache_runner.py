"""LMCache 0.5.6's own ``LocalDiskBackend`` on a directory kvagent prepared.

Imported by ``engine_runner.py`` (in a process forked after torch was imported), not run
by pytest. LMCache's modules are the pinned wheel's files under ``WHEEL``, unchanged, and
import their real dependencies (numba and llvmlite, aiohttp, pyzmq, msgspec, ... from
the venv: pyproject.toml's test extra). One package ``__init__`` is not run:
``lmcache.v1.storage_backend``'s (registered bare, pointing at the wheel's directory),
which imports every backend (GDS, P2P, the remote backend and its CacheGen serde, which
imports transformers at module level) to offer ``CreateStorageBackends``; the disk
backend's own module imports what it needs itself. No stub: ``lmcache``'s own
``__init__`` runs and picks its ``cpu`` device (``StubCPUDevice``, LMCache's own
no-accelerator fallback).

The configuration is kvagent's rendered ``lmcache.yaml``, loaded the way vLLM's LMCache
connector loads it: ``LMCACHE_CONFIG_FILE`` and ``lmcache_get_or_create_config()``.
The backend is built as LMCache's ``CreateStorageBackends`` builds it for a worker: a
``LocalCPUBackend`` (its allocator: LMCache's ``HostMemoryAllocator``, 16 MiB, instead
of the default 5 GiB ``max_local_cpu_size`` that kvagent does not render) and a
``LocalDiskBackend(config, loop, local_cpu_backend)`` with an asyncio loop in a thread
(``dst_device`` LMCache's default, ``cpu``; no cache controller, no model metadata).

It stores KV chunks (CPU bf16 tensors, KV_2LTD ``[2, layers, chunk_size, hidden]``)
through ``batched_submit_put_task`` in batches, waiting for each batch's write
callbacks (LMCache drops a failed write's exception: a chunk whose callback never comes
is a failed put), reads the first ones back through ``get_blocking`` and compares the
bytes, then keeps storing until it has written ``fill`` times ``max_cache_size``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sys
import threading
import time
import types
from typing import Any

MODEL = "kvagent/engine-storage-test"
ALLOCATOR_BYTES = 16 << 20
BATCH = 8
FIRST = 8
LAYERS = 2
WRITE_TIMEOUT = 60.0


class Records(logging.Handler):
    """Every record of LMCache's loggers: (phase, level, message); the phase is "setup"
    while the backend is built, "run" while chunks are stored and read."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[str, str, str]] = []
        self.phase = "setup"

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((self.phase, record.levelname, record.getMessage()))


def listen(records: Records) -> None:
    """Add ``records`` to every LMCache logger (``init_logger`` turns propagation off)."""
    for name, logger in logging.Logger.manager.loggerDict.items():
        if (name.split(".")[0] == "lmcache" and isinstance(logger, logging.Logger)
                and records not in logger.handlers):
            logger.addHandler(records)


def load(wheel: str) -> dict[str, Any]:
    """LMCache's modules from the wheel's files (``lmcache.v1.storage_backend`` bare)."""
    sys.path.insert(0, wheel)
    import lmcache.v1

    package = types.ModuleType("lmcache.v1.storage_backend")
    package.__path__ = [os.path.join(wheel, "lmcache/v1/storage_backend")]
    sys.modules[package.__name__] = package
    from lmcache.integration.vllm.utils import lmcache_get_or_create_config
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.memory_allocators.host_memory_allocator import HostMemoryAllocator
    from lmcache.v1.memory_management import MemoryFormat
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

    assert lmcache.v1.__file__.startswith(wheel), lmcache.v1.__file__
    return dict(get_config=lmcache_get_or_create_config, Key=CacheEngineKey,
                Allocator=HostMemoryAllocator, Format=MemoryFormat, CPU=LocalCPUBackend,
                Disk=LocalDiskBackend)


class Written:
    """The chunk hashes whose disk write completed (LMCache's ``on_complete_callback``)."""

    def __init__(self) -> None:
        self.done: set[int] = set()
        self._cond = threading.Condition()

    def __call__(self, key: Any) -> None:
        with self._cond:
            self.done.add(key.chunk_hash)
            self._cond.notify_all()

    def wait(self, hashes: list[int], timeout: float) -> list[int]:
        """The hashes still not written after ``timeout`` seconds."""
        with self._cond:
            self._cond.wait_for(lambda: self.done.issuperset(hashes), timeout)
            return [h for h in hashes if h not in self.done]


def digest(memory_obj: Any) -> str:
    """MD5 of a memory object's bytes (its ``byte_array``, what LMCache writes)."""
    return hashlib.md5(bytes(memory_obj.byte_array), usedforsecurity=False).hexdigest()


class Store:
    """One LMCache worker's LocalDiskBackend and the chunks it was given."""

    def __init__(self, lm: dict[str, Any], config: Any, chunk_bytes: int) -> None:
        import torch

        self.torch, self.lm = torch, lm
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.cpu = lm["CPU"](config, memory_allocator=lm["Allocator"](ALLOCATOR_BYTES))
        self.disk = lm["Disk"](config, self.loop, self.cpu)
        hidden = chunk_bytes // (2 * LAYERS * config.chunk_size * 2)  # bf16: 2 bytes
        self.shape = torch.Size([2, LAYERS, config.chunk_size, hidden])
        self.written = Written()

    def key(self, i: int) -> Any:
        return self.lm["Key"](MODEL, 1, 0, i, self.torch.bfloat16)

    def chunk(self) -> Any:
        """A KV chunk of random bytes in LMCache's CPU memory (bf16 NaN patterns too)."""
        obj = self.cpu.allocate(self.shape, self.torch.bfloat16, self.lm["Format"].KV_2LTD)
        assert obj is not None, "LMCache's CPU allocator is full"
        data = bytearray(os.urandom(obj.get_physical_size()))
        obj.tensor.view(-1).view(self.torch.uint8).copy_(
            self.torch.frombuffer(data, dtype=self.torch.uint8))
        return obj

    def put_batch(self, start: int, count: int, digests: dict[int, str],
                  keep: set[int]) -> list[int]:
        """Store chunks ``start..start+count-1``; the ones whose write never completed."""
        hashes = list(range(start, start + count))
        objs = [self.chunk() for _ in hashes]
        for i, obj in zip(hashes, objs, strict=True):
            if i in keep:
                digests[i] = digest(obj)
        self.disk.batched_submit_put_task([self.key(i) for i in hashes], objs,
                                          on_complete_callback=self.written)
        for obj in objs:
            obj.ref_count_down()  # the caller's reference (LMCache's storage manager's)
        return self.written.wait(hashes, WRITE_TIMEOUT)

    def read_back(self, i: int) -> str | None:
        """Digest of chunk ``i`` read through ``get_blocking`` (None: not on disk)."""
        obj = self.disk.get_blocking(self.key(i))
        if obj is None:
            return None
        value = digest(obj)
        obj.ref_count_down()
        return value

    def close(self) -> None:
        self.disk.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def fill(store: Store, fill_factor: float) -> dict[str, Any]:
    """Store past ``fill_factor`` × max_cache_size; read the first and the last back."""
    probe = store.chunk()
    chunk_bytes = probe.get_physical_size()
    probe.ref_count_down()
    chunks = int(fill_factor * store.disk.max_cache_size) // chunk_bytes + 1
    last = chunks - 1
    digests: dict[int, str] = {}
    failures: list[int] = []
    first: list[str | None] = []
    started = time.monotonic()
    for start in range(0, chunks, BATCH):
        count = min(BATCH, chunks - start)
        failures += store.put_batch(start, count, digests, {*range(FIRST), last})
        if start + count == FIRST:  # read the first chunks back while they are there
            first = [store.read_back(i) for i in range(FIRST)]
    seconds = time.monotonic() - started
    survivors = [i for i in range(chunks) if store.disk.contains(store.key(i))]
    last_back = store.read_back(last)
    return {
        "chunk_bytes": chunk_bytes, "chunks": chunks, "failures": failures,
        "stored_bytes": (chunks - len(failures)) * chunk_bytes,
        "first_match": [first[i] == digests[i] for i in range(FIRST)] if first else [],
        "last_match": last_back == digests[last],
        "survivors": survivors, "seconds": round(seconds, 1),
        "last_file": store.disk._key_to_path(store.key(last)),  # the engine's own naming
    }


def on_disk(path: str) -> dict[str, int]:
    """The files in LMCache's directory and their bytes."""
    names = [n for n in os.listdir(path) if not n.startswith(".")]
    return {"files": len(names),
            "bytes": sum(os.path.getsize(os.path.join(path, n)) for n in names)}


def run(wheel: str, fill_factor: float, chunk_bytes: int) -> dict[str, Any]:
    """Load LMCache, build its disk backend from ``LMCACHE_CONFIG_FILE``, fill it."""
    started = time.monotonic()
    records = Records()
    lm = load(wheel)
    import_s = time.monotonic() - started
    listen(records)
    config = lm["get_config"]()
    store = Store(lm, config, chunk_bytes)
    listen(records)
    records.phase = "run"
    report = fill(store, fill_factor)
    report.update(
        engine_version=version(wheel), import_seconds=round(import_s, 1),
        config_file=os.environ.get("LMCACHE_CONFIG_FILE"), local_disk=config.local_disk,
        max_local_disk_size=config.max_local_disk_size, path=store.disk.path,
        max_cache_size=store.disk.max_cache_size, use_odirect=store.disk.use_odirect,
        current_cache_size=store.disk.current_cache_size, tracked=len(store.disk.dict),
        put_tasks_left=len(store.disk.disk_worker.put_tasks),
        on_disk=on_disk(store.disk.path), pid=os.getpid())
    store.close()
    report["log"] = records.lines
    return report


def version(wheel: str) -> str:
    """The wheel's version (its dist-info), as importlib.metadata reads it."""
    from importlib.metadata import PathDistribution
    from pathlib import Path

    (info,) = Path(wheel).glob("lmcache-*.dist-info")
    return PathDistribution(info).version

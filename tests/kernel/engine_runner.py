"""Runs engines' own storage classes on directories kvagent prepared (run as a FILE).

    python engine_runner.py RESULT.json [--sglang WHEEL --ranks N --page-bytes B]
                                        [--lmcache WHEEL --chunk-bytes B] --fill X

torch (CPU) is imported once, then each engine runs in processes forked from this one
(torch imports in minutes under TCG), all at once; RESULT.json holds their reports
(``ranks``: SGLang's, one per rank; ``lmcache``: LMCache's, see lmcache_runner.py).

SGLang 0.5.23's ``HiCacheFile`` (sglang/srt/mem_cache/hicache_storage.py) and its
``LRUFileEvictor`` (sglang/srt/mem_cache/storage/file/lru_file_evictor.py) are loaded
from the pinned wheel's files under ``WHEEL``, unchanged, with what they import:
``sglang.srt.environ`` (the wheel's file: it reads the ``SGLANG_HICACHE_FILE_BACKEND_*``
variables this process got from kvagent's env file) and torch (CPU). Not run: the
``sglang``, ``sglang.srt``, ``sglang.srt.mem_cache``... package ``__init__`` files (the
top one imports the server, CUDA kernels and dozens of packages this venv lacks); those
packages are registered bare, pointing at the wheel's directories. The one stand-in:
``sglang.srt.utils.common`` (3,000 lines importing orjson, psutil, CUDA helpers...) is a
module holding only ``human_readable_int``, whose source is taken from the wheel's
common.py with ast, unchanged: the function the evictor parses MAX_SIZE with.

The SGLang ranks are forked after SGLang's imports: each is a process of its own with
its own ``HiCacheFile`` (tp_rank r of tp_size N) on the same directory, as SGLang's TP
workers are. Each stores KV pages (CPU tensors) through ``set``, reads the first ones
back through ``get`` and compares the bytes, then keeps storing until it has written
``X`` times its MAX_SIZE, and reports what the engine returned and logged.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import json
import logging
import os
import sys
import time
import types
from collections.abc import Callable
from functools import partial
from typing import Any

PACKAGES = ("sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.mem_cache",
            "sglang.srt.mem_cache.storage", "sglang.srt.mem_cache.storage.file")
MODEL = "kvagent/engine-storage-test"


class Records(logging.Handler):
    """Every log record of the engine's loggers (``sglang.*``), as text."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelname, record.getMessage()))


def bare_packages(wheel: str) -> None:
    """Register SGLang's packages without running their ``__init__`` files."""
    for name in PACKAGES:
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(wheel, *name.split("."))]
        sys.modules[name] = module


def common_module(wheel: str) -> types.ModuleType:
    """``sglang.srt.utils.common`` holding only the wheel's own ``human_readable_int``."""
    path = os.path.join(wheel, "sglang/srt/utils/common.py")
    with open(path) as f:
        source = f.read()
    tree = ast.parse(source, path)
    (func,) = [n for n in tree.body
               if isinstance(n, ast.FunctionDef) and n.name == "human_readable_int"]
    module = types.ModuleType("sglang.srt.utils.common")
    prelude = "import argparse, re\nfrom decimal import Decimal\n"
    exec(compile(prelude + ast.get_source_segment(source, func), path, "exec"),
         module.__dict__)
    sys.modules[module.__name__] = module
    return module


def load_sglang(wheel: str) -> types.ModuleType:
    """The wheel's hicache_storage module (and, through it, its evictor)."""
    bare_packages(wheel)
    common_module(wheel)
    storage = importlib.import_module("sglang.srt.mem_cache.hicache_storage")
    importlib.import_module("sglang.srt.mem_cache.storage.file.lru_file_evictor")
    assert storage.__file__.startswith(wheel), storage.__file__
    return storage


def page(torch: Any, page_bytes: int) -> Any:
    """One KV page: a CPU bf16 tensor of random bytes (NaN patterns included)."""
    return torch.frombuffer(bytearray(os.urandom(page_bytes)), dtype=torch.bfloat16)


def digest(tensor: Any) -> str:
    """MD5 of a tensor's bytes (compared as bytes: bf16 NaNs do not compare equal)."""
    import torch

    data = tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def run_rank(storage: types.ModuleType, rank: int, ranks: int, page_bytes: int,
             fill: float) -> dict[str, Any]:
    """One TP rank's HiCacheFile: store, read back, fill past its cap."""
    import torch

    records = Records()
    logging.getLogger("sglang").addHandler(records)
    logging.getLogger("sglang").setLevel(logging.DEBUG)
    config = storage.HiCacheStorageConfig(
        tp_rank=rank, tp_size=ranks, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=MODEL)
    cache = storage.HiCacheFile(config)
    evictor = cache._evictor
    cap = evictor.max_size_bytes
    pages = int(fill * cap) // page_bytes
    digests, results, failures = {}, [], []
    started = time.monotonic()
    for i in range(pages):
        value = page(torch, page_bytes)
        if i < 8 or i == pages - 1:
            digests[i] = digest(value)
        ok = cache.set(f"page-{i:06}", value)
        results.append(bool(ok))
        if not ok:
            failures.append(i)
        if i == 7:  # read the first pages back while they are still there
            first = [read_back(cache, torch, k, page_bytes) for k in range(8)]
    written_s = time.monotonic() - started
    survivors = [i for i in range(pages) if cache.exists(f"page-{i:06}")]
    last = pages - 1
    last_back = read_back(cache, torch, last, page_bytes)
    return {
        "rank": rank, "pid": os.getpid(), "file_path": cache.file_path,
        "max_size_env": os.environ.get("SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"),
        "max_size_bytes": cap, "eviction_ratio": evictor.eviction_ratio,
        "eviction_enabled": evictor.enabled, "page_bytes": page_bytes, "pages": pages,
        "stored_bytes": sum(results) * page_bytes, "failures": failures,
        "first_match": [first[k] == digests[k] for k in range(8)],
        "last_match": last_back == digests[last],
        "survivors": survivors, "tracked_bytes": evictor._total_bytes,
        "seconds": round(written_s, 1),
        "log": records.lines,
    }


def read_back(cache: Any, torch: Any, index: int, page_bytes: int) -> str | None:
    """The digest of page ``index`` read through ``HiCacheFile.get`` (None: missing)."""
    target = torch.empty(page_bytes // 2, dtype=torch.bfloat16)
    got = cache.get(f"page-{index:06}", target)
    return None if got is None else digest(got)


def fork(task: Callable[[], dict[str, Any]], path: str, name: dict[str, Any]) -> int:
    """Run ``task`` in a forked process that writes its report (or its crash) to ``path``."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            report = task()
        except BaseException as exc:  # reported to the test
            report, code = {**name, "crashed": repr(exc)}, 1
        with open(path, "w") as f:
            json.dump(report, f)
        os._exit(code)
    return pid


def collect(children: list[tuple[int, str]]) -> tuple[list[dict[str, Any]], int]:
    """Wait for the forked processes; their reports and whether any failed."""
    reports, status = [], 0
    for pid, path in children:
        _, code = os.waitpid(pid, 0)
        status |= code
        with open(path) as f:
            reports.append(json.load(f))
    return reports, 1 if status else 0


def run_all(args: argparse.Namespace) -> int:
    """SGLang's ranks and LMCache's worker, each forked, all at once; one report."""
    children = []
    if args.sglang:
        started = time.monotonic()
        storage = load_sglang(args.sglang)
        print(f"[runner] imported {storage.__file__} in {time.monotonic() - started:.1f}s",
              flush=True)
        for rank in range(args.ranks):
            task = partial(run_rank, storage, rank, args.ranks, args.page_bytes, args.fill)
            path = f"{args.result}.rank{rank}"
            children.append((fork(task, path, {"rank": rank}), path))
    lmcache = None
    if args.lmcache:
        import lmcache_runner

        task = partial(lmcache_runner.run, args.lmcache, args.fill, args.chunk_bytes)
        lmcache = (fork(task, f"{args.result}.lmcache", {}), f"{args.result}.lmcache")
    ranks, status = collect(children)
    report: dict[str, Any] = {"ranks": ranks}
    if lmcache:
        (report["lmcache"],), lm_status = collect([lmcache])
        status |= lm_status
    with open(args.result, "w") as f:
        json.dump(report, f)
    return status


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("result")
    parser.add_argument("--sglang", metavar="WHEEL", help="SGLang's unpacked wheel")
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--page-bytes", type=int, default=128 << 10)
    parser.add_argument("--lmcache", metavar="WHEEL", help="LMCache's unpacked wheel")
    parser.add_argument("--chunk-bytes", type=int, default=256 << 10)
    parser.add_argument("--fill", type=float, default=3.0)
    args = parser.parse_args()
    started = time.monotonic()
    import torch  # once, before the forks: each engine's process inherits it

    print(f"[runner] imported torch {torch.__version__} in {time.monotonic() - started:.1f}s",
          flush=True)
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())

"""Sweeps of pools for the size properties: a case, its render context, and what each
rendered file lets its processes fill, read back from the file as the engine reads it.

A :class:`Case` is a pool as the hand-off sees it: namespaces of given sizes, the engine
with ``others`` other engines sharing each mount (so each engine's cap on a mount is
``quota.mount_caps``, what apply sets as the directory's xfs project quota), tensor and
data parallelism, and the engine's own choice (SGLang's backend, vLLM's cpu_cache).
:func:`allocations` reads a render back: for every engine process, the directory it
writes in and the most bytes it may fill there, in the engine's own unit and rounding
(restated here from the engines' code, docs/engines.md; not from the renderers).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import yaml
from hypothesis import strategies as st

from agent.config.model import EngineConfig
from agent.engines import EngineContext, Rendered
from agent.engines.quota import mount_caps

from .helpers import parse_env

GB = 1000**3
GIB = 1024**3
ORDER = ("lmcache", "vllm", "dynamo", "sglang", "mooncake")


@dataclass(frozen=True)
class Case:
    """One pool and one engine on it."""

    kind: str
    sizes: tuple[int, ...]  # each namespace's filesystem size, bytes
    others: int  # other engines on the pool (each mount split between all of them)
    tp: int
    dp: int
    backend: str | None = None  # sglang: None (file) or "mooncake"
    cpu: bool = False  # vllm: cpu_cache given (the fs tier) or not (the disk backend)

    def engines(self) -> list[EngineConfig]:
        rest = [k for k in ORDER if k != self.kind][:self.others]
        return [EngineConfig(kind=self.kind)] + [EngineConfig(kind=k) for k in rest]

    def caps(self) -> tuple[int, ...]:
        """Each directory's hard cap: the quota apply sets on its mount."""
        return tuple(mount_caps(s, self.engines())[self.kind] for s in self.sizes)

    def context(self, root: str = "/mnt/kv") -> EngineContext:
        dirs = tuple(os.path.join(root, f"store1-ns{i + 1}", self.kind)
                     for i in range(len(self.sizes)))
        caps = self.caps()
        return EngineContext("kv", self.kind, dirs, sum(caps), directory_caps=caps,
                             tensor_parallel=self.tp, data_parallel=self.dp,
                             cpu_bytes=8 * GIB if self.cpu else None, backend=self.backend,
                             cleaner=self.cpu)


def cases(kind: str) -> st.SearchStrategy[Case]:
    """Pools of 1 to 3 namespaces from 10 MB to ~10 TB (uneven), 0 to 4 other engines,
    tensor_parallel 1-8, data_parallel 1-4, and the engine's own choices."""
    size = st.builds(lambda m, e: m * 10**e, st.integers(1, 999), st.integers(7, 10))
    return st.builds(
        Case, kind=st.just(kind), sizes=st.lists(size, min_size=1, max_size=3).map(tuple),
        others=st.integers(0, 4), tp=st.sampled_from([1, 2, 4, 8]),
        dp=st.integers(1, 4),
        backend=st.sampled_from([None, "mooncake"]) if kind == "sglang" else st.none(),
        cpu=st.booleans() if kind == "vllm" else st.just(False))


# ------------------------------------------------------------------ reading renders back
def owner(path: str, dirs: tuple[str, ...]) -> str:
    """The engine directory ``path`` lies in (AssertionError: outside all of them)."""
    norm = os.path.normpath(path)
    found = [d for d in dirs if norm == d or norm.startswith(d + "/")]
    assert found, f"{path} is outside the engine's directories {dirs}"
    return found[0]


def lmcache_workers(n: int, i: int, tp: int, dp: int) -> int:
    """LMCache workers that can land on directory ``i`` of ``n``: PathSharder gives the
    worker on CUDA device d the directory d % n; an instance's TP ranks are consecutive
    devices starting anywhere; dp instances each."""
    return dp * max(sum((s + k) % n == i for k in range(tp)) for s in range(n))


def allocations(case: Case, ctx: EngineContext, r: Rendered) -> list[tuple[str, int]]:
    """(directory, most bytes one process may fill there) for every engine process the
    render configures; vLLM's fs tier has no size: none."""
    dirs = ctx.directories
    out: list[tuple[str, int]] = []
    if case.kind == "dynamo":  # one env file per directory, dp KVBM instances on it
        for text in r.files.values():
            env = parse_env(text)
            d = owner(env["DYN_KVBM_DISK_CACHE_DIR"], dirs)
            out += [(d, int(env["DYN_KVBM_DISK_CACHE_GB"]) * GB)] * case.dp
    elif case.kind == "lmcache":  # one size for every worker, int(GiB * 1024**3) bytes
        data = yaml.safe_load(r.files["lmcache.yaml"])
        paths = [p.strip().removeprefix("file://") for p in data["local_disk"].split(",")]
        each = int(data["max_local_disk_size"] * 1024**3)
        for i, p in enumerate(paths):
            out += [(owner(p, dirs), each)] * lmcache_workers(len(paths), i, case.tp, case.dp)
    elif case.kind == "sglang" and case.backend != "mooncake":  # every rank, flat
        for name, text in r.files.items():
            if name.endswith(".env"):
                env = parse_env(text)
                d = owner(env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"], dirs)
                out += [(d, int(env["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"]))] * (
                    case.tp * case.dp)
    elif case.kind == "sglang":  # one env file per server (directory, replica): tp ranks
        for name, text in r.files.items():
            if name.endswith(".env"):
                env = parse_env(text)
                d = owner(env["MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"], dirs)
                size = max(int(env["MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"]),
                           int(env["MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE"]))
                out += [(d, size)] * case.tp
    elif case.kind == "mooncake":  # one env file per client
        for text in r.files.values():
            env = parse_env(text)
            d = owner(env["MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"], dirs)
            out.append((d, max(int(env[k]) for k in (
                "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES",
                "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE", "MOONCAKE_BUCKET_MAX_TOTAL_SIZE"))))
    elif case.kind == "vllm" and not case.cpu:  # one file per instance: tp workers each
        for text in r.files.values():
            extra = json.loads(text)["kv_connector_extra_config"]
            # each worker opens <disk_path>.rank_<device> (v1/simple_kv_offload/worker.py)
            d = owner(extra["disk_path"] + ".rank_0", dirs)
            out += [(d, int(extra["disk_capacity_bytes"]))] * case.tp
    return out


def used_directories(case: Case, ctx: EngineContext, r: Rendered) -> set[str]:
    """The directories some file of the render points the engine at."""
    if case.kind == "vllm" and case.cpu:
        return {owner(t["root_dir"], ctx.directories) for text in r.files.values()
                for t in json.loads(text)["kv_connector_extra_config"]["secondary_tiers"]}
    return {d for d, _ in allocations(case, ctx, r)}


def processes(case: Case, ctx: EngineContext, i: int) -> int:
    """How many processes each enforce the size on directory ``i``."""
    if case.kind == "dynamo":
        return case.dp
    if case.kind == "lmcache":
        return lmcache_workers(len(ctx.directories), i, case.tp, case.dp)
    return case.tp * case.dp


def own_size(case: Case, cap: int, procs: int) -> int:
    """What one process of a directory whose cap is ``cap`` gets, in bytes, restated from
    the engines' units: 97% of the cap (3% headroom) split among ``procs`` processes,
    rounded down to the engine's unit (KVBM: whole decimal GB; LMCache: 1/100 GiB, read
    back as int(GiB * 1024**3); the others: bytes)."""
    share = cap * 97 // 100 // procs
    if case.kind == "dynamo":
        return share // GB * GB
    if case.kind == "lmcache":
        hundredths = math.floor(share * 100 / GIB)
        while hundredths > 0 and int(hundredths / 100 * GIB) > share:
            hundredths -= 1
        return int(hundredths / 100 * GIB)
    return share


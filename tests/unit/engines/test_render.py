"""Every renderer's output, parsed back and compared with the keys each engine documents.

The expected key sets are written here from the engines' own sources (cited
next to each), not taken from the renderers' constants.
"""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from agent.config.model import EngineKind
from agent.engines import KINDS, EngineContext, render
from agent.errors import UsageError
from agent.system.gds import GdsReadiness

from .helpers import parse_env, probe

GIB = 1024**3

# sgl-project/sglang python/sglang/srt/environ.py and mem_cache/hicache_storage.py
# (HiCacheFile) / storage/file/lru_file_evictor.py; server_args.py for the flags.
SGLANG_ENV_KEYS = {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR",
                   "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"}
SGLANG_ARGS = ["--enable-hierarchical-cache", "--hicache-storage-backend", "file"]


def ctx(kind: EngineKind, dirs: tuple[str, ...] = ("/mnt/kv/ns0/x",), cap: int = 100 * GIB,
        probes=None, **kw) -> EngineContext:
    if probes is None:
        probes = tuple(probe(d.rsplit("/", 1)[0]) for d in dirs)
    if "ranks" in kw:
        kw["tensor_parallel"] = kw.pop("ranks")
    if kind == "vllm":  # its fs tier (cpu_cache); the disk backend: test_render_vllm.py
        kw.setdefault("cpu_bytes", 32 * GIB)
    return EngineContext("pool-a", kind, dirs, cap, probes, **kw)


# vLLM: test_render_vllm.py

@pytest.mark.parametrize("kind", ["lmcache", "vllm", "sglang", "mooncake"])
def test_only_dynamo_depends_on_gds(kind: EngineKind) -> None:
    """The other renderers never refuse for GDS (LMCache's gds_path is not rendered)."""
    r = render(kind, ctx(kind, (f"/mnt/kv/ns0/{kind}",), gds=GdsReadiness(None, None, None)))
    assert r.files and "gds_path" not in "".join(r.files.values())


@pytest.mark.parametrize("kind", ["lmcache", "vllm", "sglang"])
def test_notes_promise_no_cleanup_that_does_not_exist(kind: EngineKind) -> None:
    """Caps are hard limits (project quotas); nothing is deleted unless the cleaner is on."""
    notes = " ".join(render(kind, ctx(kind, (f"/mnt/kv/ns0/{kind}",))).notes)
    assert "cleanup" not in notes
    assert "project quota" in notes and "engines[].cleaner" in notes


# ------------------------------------------------------------------ all engines

def test_kinds_are_the_config_models() -> None:
    from typing import get_args

    assert set(KINDS) == set(get_args(EngineKind))


@pytest.mark.parametrize("kind", KINDS)
def test_rendering_is_deterministic(kind: str) -> None:
    dirs = (f"/mnt/kv/ns0/{kind}", f"/mnt/kv/ns1/{kind}")
    probes = (probe("/mnt/kv/ns1", odirect=False), probe("/mnt/kv/ns0"))
    first = render(kind, ctx(kind, dirs, probes=probes))
    again = render(kind, ctx(kind, dirs, probes=tuple(reversed(probes))))
    assert first == again
    assert list(first.files) == sorted(first.files)


@pytest.mark.parametrize("kind", KINDS)
def test_every_file_parses_in_its_format(kind: str) -> None:
    r = render(kind, ctx(kind, (f"/mnt/kv/ns0/{kind}", f"/mnt/kv/ns1/{kind}")))
    for name, text in r.files.items():
        fmt = r.format_of(name)
        if fmt == "yaml":
            assert isinstance(yaml.safe_load(text), dict)
        elif fmt == "json":
            assert isinstance(json.loads(text), dict)
        elif fmt == "env":
            assert parse_env(text)
        else:
            assert shlex.split(text)


def test_env_values_with_spaces_are_quoted() -> None:
    d = '/mnt/kv space/ns0/"dyn"$x'
    env = parse_env(render("dynamo", ctx("dynamo", (d,))).files["dynamo-kvbm.env"])
    assert env["DYN_KVBM_DISK_CACHE_DIR"] == d


def test_probe_of_the_longest_matching_mount_is_used() -> None:
    p_root = probe("/mnt/kv", odirect=True)
    p_ns = probe("/mnt/kv/ns0", odirect=False)
    c = ctx("dynamo", ("/mnt/kv/ns0/dynamo",), probes=(p_root, p_ns))
    assert c.probe_for("/mnt/kv/ns0/dynamo") is p_ns
    assert c.probe_for("/mnt/kv/ns00/dynamo") is p_root
    assert c.probe_for("/elsewhere/dynamo") is None


@pytest.mark.parametrize(("bad", "message"), [
    ({"dirs": ()}, "no directories"),
    ({"dirs": ("relative/dir",)}, "absolute"),
    ({"dirs": ("/a/b/../c",)}, "normalised"),
    ({"dirs": ("/a/x", "/a/x")}, "twice"),
    ({"dirs": ("/a,b",)}, "','"),
    ({"cap": 0}, "no capacity"),
    ({"ranks": 0}, "tensor_parallel"),
])
def test_bad_context_is_a_usage_error(bad: dict, message: str) -> None:
    kw = {"dirs": ("/mnt/kv/ns0/lmcache",), "cap": GIB} | bad
    c = EngineContext("pool-a", "lmcache", kw["dirs"], kw["cap"], (),
                      tensor_parallel=bad.get("ranks", 1))
    with pytest.raises(UsageError, match=message):
        render("lmcache", c)


def test_unknown_engine_and_mismatched_kind() -> None:
    with pytest.raises(UsageError, match="unknown engine 'redis'"):
        render("redis", ctx("lmcache"))
    with pytest.raises(UsageError, match="not 'vllm'"):
        render("vllm", ctx("lmcache"))


def test_a_mount_is_probed_inside_a_bounded_step() -> None:
    """The probe's I/O goes to the pool's device: a step bounded by the kernel's I/O
    timeouts, not the watchdog's 30 s between steps."""
    from agent import progress
    from agent.engines.handoff import probe_bounded

    seen: list[tuple[progress.Step | None, str]] = []

    def probe(mount: str, transport: str | None, *, sysfs: str) -> str:
        seen.append((progress.tracker.current(), sysfs))
        return "probed"

    assert probe_bounded(probe, "/mnt/kv", "tcp", "/sys") == "probed"  # type: ignore[arg-type]
    ((step, sysfs),) = seen
    assert step is not None and step.bound == progress.DEVICE_IO_BOUND
    assert step.what == "probing /mnt/kv" and sysfs == "/sys"

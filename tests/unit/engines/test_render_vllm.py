"""vLLM's renderer: one ``--kv-transfer-config`` JSON per directory, with the CPU tier vLLM
requires, or no render at all.

Expected keys are written here from vLLM 0.33.0's code: vllm/config/kv_transfer.py
(KVTransferConfig's fields), vllm/v1/kv_offload/cpu/spec.py (CPUOffloadingSpec raises
"cpu_bytes_to_use must be specified" without it), vllm/v1/kv_offload/tiering/spec.py
(TieringOffloadingSpec's ``secondary_tiers``) and tiering/fs/manager.py
(FileSystemTierManager's constructor). The contract test (contract/test_vllm.py) holds
renders to the pinned wheel.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.engines import EngineContext, render
from agent.errors import UsageError

from .contract.kit import apply_pool
from .helpers import probe

GIB = 1024**3
NAME = "vllm-kv-transfer-config.json"
# vllm/config/kv_transfer.py: KVTransferConfig (pydantic, extra fields forbidden).
TOP_KEYS = {"kv_connector", "kv_role", "kv_connector_extra_config"}
# vllm/v1/kv_offload: factory.py (spec_name), cpu/spec.py (cpu_bytes_to_use),
# tiering/spec.py (secondary_tiers).
EXTRA_KEYS = {"spec_name", "cpu_bytes_to_use", "secondary_tiers"}
# tiering/fs/manager.py: FileSystemTierManager(root_dir, n_read_threads, n_write_threads,
# enable_kv_events, locality); tiering/factory.py pops type, module_path, backpressure.
FS_TIER_KEYS = {"type", "root_dir", "n_read_threads", "n_write_threads", "enable_kv_events",
                "locality", "module_path", "backpressure"}


def ctx(dirs: tuple[str, ...] = ("/mnt/kv/ns0/vllm",), cpu_bytes: int | None = 32 * GIB,
        **kw) -> EngineContext:
    probes = kw.pop("probes", None)
    if probes is None:
        probes = tuple(probe(d.rsplit("/", 1)[0]) for d in dirs)
    return EngineContext("pool-a", "vllm", dirs, 100 * GIB, probes, cpu_bytes=cpu_bytes, **kw)


def test_json_keys() -> None:
    r = render("vllm", ctx())
    assert r.format == "json" and list(r.files) == [NAME] and r.subdirectories == ()
    data = json.loads(r.files[NAME])
    assert set(data) == TOP_KEYS
    assert data["kv_connector"] == "OffloadingConnector" and data["kv_role"] == "kv_both"
    extra = data["kv_connector_extra_config"]
    assert set(extra) == EXTRA_KEYS
    assert extra["spec_name"] == "TieringOffloadingSpec"
    assert extra["cpu_bytes_to_use"] == 32 * GIB and type(extra["cpu_bytes_to_use"]) is int
    assert extra["secondary_tiers"] == [{"type": "fs", "root_dir": "/mnt/kv/ns0/vllm"}]
    assert set(extra["secondary_tiers"][0]) <= FS_TIER_KEYS


def test_one_file_per_directory() -> None:
    dirs = ("/mnt/kv/ns0/vllm", "/mnt/kv/ns1/vllm")
    r = render("vllm", ctx(dirs, cpu_bytes=10 * GIB))
    assert list(r.files) == ["vllm-kv-transfer-config-0.json", "vllm-kv-transfer-config-1.json"]
    for name, d in zip(r.files, dirs, strict=True):
        extra = json.loads(r.files[name])["kv_connector_extra_config"]
        assert extra["cpu_bytes_to_use"] == 10 * GIB
        assert extra["secondary_tiers"] == [{"type": "fs", "root_dir": d}]
    assert any("one file per directory" in n for n in r.notes)


def test_without_cpu_cache_it_refuses_to_render() -> None:
    """vLLM refuses to start without cpu_bytes_to_use: no render, an error naming the field."""
    with pytest.raises(UsageError, match=r"engines\[\]\.cpu_cache") as err:
        render("vllm", ctx(cpu_bytes=None))
    assert "cpu_bytes_to_use" in err.value.message and "refuses to start" in err.value.message
    assert err.value.hint is not None and "{kind: vllm, cpu_cache: 32GiB}" in err.value.hint


def test_cpu_tier_is_per_engine_and_data_parallel_multiplies_it() -> None:
    one = render("vllm", ctx(tensor_parallel=4))
    dp = render("vllm", ctx(data_parallel=2))
    assert one.files == dp.files  # neither parallel size changes what vLLM is told
    assert not any("data_parallel" in n for n in one.notes)
    assert any(f"{2 * 32 * GIB} bytes of host RAM" in n for n in dp.notes)


def test_without_odirect_only_notes() -> None:
    d = "/mnt/kv/ns0/vllm"
    good = render("vllm", ctx((d,)))
    bad = render("vllm", ctx((d,), probes=(probe("/mnt/kv/ns0", odirect=False),)))
    assert bad.files == good.files  # vLLM has no O_DIRECT key: nothing to switch
    assert any("falls back to buffered" in n for n in bad.notes)


def test_notes_say_the_quota_is_the_only_bound() -> None:
    notes = " ".join(render("vllm", ctx()).notes)
    assert "no size setting" in notes and "project quota" in notes
    assert "engines[].cleaner" in notes and "_r<rank>" in notes


# ------------------------------------------------------------------ through an apply

def test_apply_without_cpu_cache_is_a_pool_error(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The apply reports the missing field, removes an old vllm render, writes none, and
    renders the pool's other engines."""
    old = tmp_path / "state/engines/kv/vllm" / NAME
    old.parent.mkdir(parents=True)
    old.write_text("{}\n")
    applied = apply_pool(tmp_path, monkeypatch, ["kind: vllm", "kind: mooncake"])
    messages = [e.message for e in applied.result.errors]
    assert len(messages) == 1 and "engines[].cpu_cache" in messages[0], messages
    assert "cpu_cache: 32GiB" in (applied.result.errors[0].hint or "")
    assert applied.files("vllm") == {} and not old.parent.exists()
    assert applied.files("mooncake")


def test_apply_with_cpu_cache_renders_it(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    applied = apply_pool(tmp_path, monkeypatch, ["kind: vllm, cpu_cache: 32GiB"])
    assert applied.result.ok, applied.result.errors
    files = applied.files("vllm")
    assert sorted(files) == ["vllm-kv-transfer-config-0.json", "vllm-kv-transfer-config-1.json"]
    for text, mount in zip(files.values(), applied.mounts, strict=True):
        extra = json.loads(text)["kv_connector_extra_config"]
        assert extra["cpu_bytes_to_use"] == 32 * GIB
        assert extra["secondary_tiers"] == [{"type": "fs", "root_dir": f"{mount}/vllm"}]

"""The engine settings that choose how a tier is bounded: vLLM's cleaner default.

vLLM's fs tier (cpu_cache given) never evicts on disk, so its cleaner is on unless the
config turns it off or the pool's mounts have no quota usage to read (noquota); vLLM's
disk backend (no cpu_cache) evicts inside its own files, where the cleaner would delete
a file the engine is writing: turning it on there is refused, naming the field.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agent.cli.main import main
from agent.config import parse_config


def config(engines: list[dict], options: list[str] | None = None) -> dict:
    pool: dict = {"name": "kv", "target": {"transport": "tcp", "address": "10.0.0.11"},
                  "mount": "/var/lib/kvcache/kv", "engines": engines}
    if options is not None:
        pool["mount_options"] = options
    return {"version": 1, "node": {"name": "gpu-01"}, "initiator": {"pools": [pool]}}


def engines(data: dict) -> dict:
    cfg = parse_config(yaml.safe_dump(data))
    return {e.kind: e for e in cfg.initiator.pools[0].engines}


def test_the_cleaner_is_on_by_default_only_for_vllms_fs_tier() -> None:
    got = engines(config([{"kind": "vllm", "cpu_cache": "8GiB"}, {"kind": "lmcache"},
                          {"kind": "sglang"}, {"kind": "mooncake"},
                          {"kind": "dynamo", "gds": "trust"}]))
    assert {k: e.cleaner.enabled for k, e in got.items()} == {
        "vllm": True, "lmcache": False, "sglang": False, "mooncake": False, "dynamo": False}
    assert (got["vllm"].cleaner.high, got["vllm"].cleaner.low) == (95, 85)


def test_vllms_disk_backend_has_no_cleaner_by_default() -> None:
    assert engines(config([{"kind": "vllm"}]))["vllm"].cleaner.enabled is False


@pytest.mark.parametrize(("engine", "options", "want"), [
    ({"kind": "vllm", "cpu_cache": "8GiB", "cleaner": {"enabled": False}}, None, False),
    ({"kind": "vllm", "cpu_cache": "8GiB"}, ["noatime", "noquota"], False),
    ({"kind": "vllm", "cpu_cache": "8GiB"}, ["noatime", "pqnoenforce"], True),
    ({"kind": "lmcache", "cleaner": {"enabled": True}}, None, True),
])
def test_an_explicit_choice_or_noquota_decides(engine: dict, options: list[str] | None,
                                                 want: bool) -> None:
    """Explicit values are kept; noquota (no usage for the cleaner to read) leaves the
    default off; pqnoenforce accounts usage, so the default stays on."""
    assert engines(config([engine], options))[engine["kind"]].cleaner.enabled is want


@pytest.mark.parametrize(("engine", "options", "words"), [
    ({"kind": "vllm", "cleaner": {"enabled": True}}, None,
     "vllm without cpu_cache uses vLLM's disk backend"),
    ({"kind": "vllm", "cpu_cache": "8GiB", "cleaner": {"enabled": True}},
     ["noatime", "noquota"], "noquota"),
])
def test_a_cleaner_that_cannot_work_is_refused(tmp_path: Path, engine: dict,
                                               options: list[str] | None, words: str) -> None:
    file = tmp_path / "kvagent.yaml"
    file.write_text(yaml.safe_dump(config([engine], options), sort_keys=False))
    result = CliRunner().invoke(main, ["-c", str(file), "config", "validate"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = [ln for ln in result.output.splitlines()
               if ": initiator.pools[0].engines[0].cleaner.enabled: " in ln]
    assert words in line, line

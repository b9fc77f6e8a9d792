"""``kvagent bench`` end to end with a fake fio (recorded output), and once with the real one."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agent.bench.models import BUILTIN
from agent.cli import bench_cmd
from agent.cli.main import main
from agent.system.run import CommandNotFound, CommandResult, SubprocessRunner
from tests.unit.fakerunner import FakeRunner

from .conftest import fake_fio, fio_jobs

HOST = "nqn.2014-08.org.nvmexpress:uuid:2b7e1a3c-0d4f-4b6a-9c1e-5f2a7d9e0b11"


@pytest.fixture
def fio_runner(monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    runner = fake_fio()
    monkeypatch.setattr(bench_cmd, "make_runner", lambda: runner)
    return runner


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_text_report(tmp_path: Path, fio_runner: FakeRunner) -> None:
    code, out, err = invoke("bench", "--path", str(tmp_path))
    assert code == 0, err
    # 16 jobs of the quick profile in the job table, each with GB/s, IOPS and latencies
    assert out.count("write-") == 8 and out.count("read-") >= 8
    assert re.search(r"read-2MiB-qd8-j1\s+1\.61\s+767\s+10\.03 ms\s+14\.61 ms\s+17\.69 ms", out)
    assert re.search(r"write-256KiB-qd1-j1\s+1\.98\s+7569\s+56 us\s+2\.24 ms\s+4\.62 ms", out)
    assert "H100 SXM 989 TFLOP/s × 0.5 MFU = 494.5 TFLOP/s effective" in out
    for name in BUILTIN:
        assert re.search(rf"^{re.escape(name)}\s+1K\s", out, re.M)
        assert re.search(rf"^{re.escape(name)}\s+128K\s.*(beats|slower than) recompute by",
                         out, re.M)
    # no progress on stdout, and none on stderr either: it is not a terminal
    assert "kvagent bench: [" not in out + err
    # fio's files and the scratch directory are gone
    assert list(tmp_path.iterdir()) == []


def test_json_report(tmp_path: Path, fio_runner: FakeRunner) -> None:
    code, out, err = invoke("-o", "json", "bench", "--path", str(tmp_path), "--sizes",
                            "2MiB,32MiB", "--model", "Llama-3.1-8B", "--model", "qwen2.5-7b",
                            "--gpu", "h200", "--mfu", "0.6")
    assert code == 0, err
    data = json.loads(out)
    assert data["changed"] is False and data["pool"] is None
    assert data["fio_version"] == "fio-3.33" and data["ioengine"] == "libaio"
    assert data["throughput"]["effective_tflops"] == pytest.approx(593.4)
    (d,) = data["directories"]
    assert d["directory"] == str(tmp_path)
    assert [j["name"] for j in d["jobs"]] == [
        "write-2MiB-qd1-j1", "write-2MiB-qd8-j1", "read-2MiB-qd1-j1", "read-2MiB-qd8-j1",
        "write-32MiB-qd1-j1", "write-32MiB-qd8-j1", "read-32MiB-qd1-j1", "read-32MiB-qd8-j1"]
    read = d["jobs"][2]
    assert read["gbps"] == pytest.approx(1.609200792)
    assert (read["lat_p50_us"], read["lat_p99_us"], read["lat_p999_us"]) == (
        10027.008, 14614.528, 17694.72)
    llama, qwen = d["models"]
    assert llama["model"] == "Llama-3.1-8B" and qwen["model"] == "Qwen2.5-7B"
    assert llama["kv_bytes_per_token"] == 131072 and qwen["kv_bytes_per_token"] == 57344
    # Llama chunk 32 MiB → 32MiB reads; Qwen chunk 14 MiB: ln(14/2) = 1.95 > ln(32/14) = 0.83
    assert llama["io_size"] == qwen["io_size"] == 32 * 2**20
    assert llama["read_gbps"] == pytest.approx(1.609200792)
    p1k = llama["prefixes"][0]
    assert p1k["tokens"] == 1024
    # 134217728 B / 1609200792 B/s + 10027.008 us = 0.0834060 + 0.0100270 = 0.0934330 s
    assert p1k["load_s"] == pytest.approx(0.0934330, rel=1e-5)
    # 1.67205863424e13 FLOPs / 593.4e12 = 0.0281776 s → slower by 0.093433/0.0281776 = 3.3
    assert p1k["recompute_s"] == pytest.approx(0.0281776, rel=1e-5)
    assert p1k["verdict"] == "slower than recompute by 3.3×"
    assert [p["tokens"] for p in llama["prefixes"]] == [1024, 32768, 131072]
    assert list(tmp_path.iterdir()) == []


def test_bad_model_config_exits_2_naming_the_field(tmp_path: Path,
                                                   fio_runner: FakeRunner) -> None:
    cfg = dict(BUILTIN["Qwen2.5-7B"].config)
    del cfg["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, out, err = invoke("bench", "--path", str(tmp_path), "--model-config", str(path))
    assert code == 2
    assert f"{path}: missing field 'num_hidden_layers'" in err
    assert out == "" and fio_runner.calls == []
    path.write_text("{")
    code, _, err = invoke("bench", "--path", str(tmp_path), "--model-config", str(path))
    assert code == 2 and "not valid JSON" in err


def test_model_config_is_assessed(tmp_path: Path, fio_runner: FakeRunner) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"_name_or_path": "acme/Tiny-1B",
                                **BUILTIN["Llama-3.1-8B"].config}))
    code, out, err = invoke("-o", "json", "bench", "--path", str(tmp_path), "--model-config",
                            str(path), "--sizes", "256KiB")
    assert code == 0, err
    (m,) = json.loads(out)["directories"][0]["models"]
    assert m["model"] == "Tiny-1B" and m["params_estimated"] is True
    assert m["params_active"] == 8_030_261_248
    assert any("estimated" in n for n in m["notes"])


@pytest.mark.parametrize(("args", "message"), [
    (["--tflops", "400", "--gpu", "h100"], "either --tflops or --gpu/--mfu"),
    (["--model", "gpt-5"], "unknown model 'gpt-5'"),
    (["--sizes", "1000"], "not a positive multiple of 4KiB"),
    (["--sizes", "2 furlongs"], "is not a size"),
    (["--io-size", "8MiB", "--sizes", "2MiB"], "--io-size 8MiB is not one of the sizes"),
    (["--mfu", "1.5"], "--mfu"),
    (["--profile", "forever"], "--profile"),
    (["--all-namespaces"], "--all-namespaces applies to a POOL"),
])
def test_bad_arguments_exit_2(tmp_path: Path, fio_runner: FakeRunner, args: list[str],
                              message: str) -> None:
    code, out, err = invoke("bench", "--path", str(tmp_path), *args)
    assert code == 2, err
    assert message in err and out == ""
    assert fio_runner.calls == []


def test_pool_or_path_is_required(tmp_path: Path, fio_runner: FakeRunner) -> None:
    code, _, err = invoke("bench")
    assert code == 2 and "name an initiator pool from the config, or give --path DIR" in err
    code, _, err = invoke("bench", "kv", "--path", str(tmp_path))
    assert code == 2 and "either POOL or --path" in err
    code, _, err = invoke("bench", "--path", str(tmp_path / "missing"))
    assert code == 2 and "does not exist" in err


def test_missing_fio_exits_1_with_install_hint(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(argv: tuple[str, ...], _stdin: str | None) -> CommandResult:
        raise CommandNotFound(argv[0])

    runner = FakeRunner().on_call(["fio"], missing)
    monkeypatch.setattr(bench_cmd, "make_runner", lambda: runner)
    code, out, err = invoke("bench", "--path", str(tmp_path))
    assert code == 1 and out == ""
    assert "fio is not installed" in err and "apt-get install fio" in err


def test_fio_failure_exits_1_and_cleans_up(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    runner = fake_fio()
    runner.on(["fio", "--output-format=json", "--eta=never", "--name=read-256KiB-qd1-j1"],
              returncode=1, stderr="fio: pid=1, err=5/file:io_u.c:1889, func=io_u error, "
                                   "error=Input/output error\n")
    monkeypatch.setattr(bench_cmd, "make_runner", lambda: runner)
    code, _, err = invoke("bench", "--path", str(tmp_path), "--sizes", "256KiB")
    assert code == 1
    assert "fio job read-256KiB-qd1-j1" in err and "Input/output error" in err
    assert list(tmp_path.iterdir()) == []


def write_config(tmp_path: Path, layout: str = "per-namespace", shared: bool = False) -> Path:
    mount = tmp_path / "mnt" / "kv"
    pool = {"name": "kv", "target": {"transport": "tcp", "address": "10.0.0.11"},
            "mount": str(mount), "layout": layout}
    if shared:
        pool["shared"] = True
    cfg = {"version": 1, "node": {"name": "gpu-01"}, "initiator": {"pools": [pool]}}
    path = tmp_path / "kvagent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_pool_benches_its_first_namespace_or_all(tmp_path: Path, fio_runner: FakeRunner,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write_config(tmp_path)
    mount = tmp_path / "mnt" / "kv"
    for ns in ("ns10", "ns2", "lost+found", "store1-ns1", "store0-ns3"):
        (mount / ns).mkdir(parents=True)
    mounted: list[str] = []
    monkeypatch.setattr(bench_cmd, "is_mount", lambda p: mounted.append(p) or True)
    code, out, err = invoke("-c", str(cfg), "-o", "json", "bench", "kv", "--sizes", "2MiB")
    assert code == 0, err
    data = json.loads(out)
    assert data["pool"] == "kv"
    # numeric order: ns2 before ns10; only the first without --all-namespaces
    assert [d["directory"] for d in data["directories"]] == [str(mount / "ns2")]
    assert {j["directory"].rsplit("/", 1)[0] for j in fio_jobs(fio_runner)} == {
        str(mount / "ns2")}
    code, out, err = invoke("-c", str(cfg), "-o", "json", "bench", "kv", "--sizes", "2MiB",
                            "--all-namespaces", "--model", "DeepSeek-V3")
    assert code == 0, err
    # a pool attached by an older version (nsN) first, then by storage node and nsid
    assert [d["directory"] for d in json.loads(out)["directories"]] == [
        str(mount / "ns2"), str(mount / "ns10"), str(mount / "store0-ns3"),
        str(mount / "store1-ns1")]
    assert sorted(os.listdir(mount)) == ["lost+found", "ns10", "ns2", "store0-ns3",
                                         "store1-ns1"]
    assert os.listdir(mount / "ns2") == [] and os.listdir(mount / "ns10") == []


def test_unmounted_pool_is_refused(tmp_path: Path, fio_runner: FakeRunner,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write_config(tmp_path, layout="striped")
    (tmp_path / "mnt" / "kv").mkdir(parents=True)
    monkeypatch.setattr(bench_cmd, "is_mount", lambda _p: False)
    code, _, err = invoke("-c", str(cfg), "bench", "kv")
    assert code == 1
    assert "is not a mount point" in err and "kvagent apply" in err
    assert fio_runner.calls == []


def test_pool_errors(tmp_path: Path, fio_runner: FakeRunner) -> None:
    cfg = write_config(tmp_path)
    code, _, err = invoke("-c", str(cfg), "bench", "other")
    assert code == 2 and "no initiator pool named 'other'; initiator pools: kv" in err
    code, _, err = invoke("-c", str(cfg), "bench", "kv")
    assert code == 1 and "has no directory to bench" in err
    shared = write_config(tmp_path, shared=True)
    code, _, err = invoke("-c", str(shared), "bench", "kv")
    assert code == 2 and "shared (raw block)" in err


def _odirect_works(directory: Path) -> bool:
    path = directory / ".odirect-probe"
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600)
    except OSError:
        return False
    try:
        import mmap

        buf = mmap.mmap(-1, 4096)
        os.write(fd, buf)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        path.unlink()


def test_real_fio_quick_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert shutil.which("fio"), "fio is not installed (scripts/setup installs it)"
    if not _odirect_works(tmp_path):
        pytest.skip(f"{tmp_path} does not support O_DIRECT")
    monkeypatch.setattr(bench_cmd, "make_runner", SubprocessRunner)
    code, out, err = invoke("-o", "json", "bench", "--path", str(tmp_path), "--profile",
                            "quick", "--sizes", "256KiB", "--model", "Llama-3.1-8B")
    assert code == 0, err
    data = json.loads(out)
    assert data["fio_version"].startswith("fio-")
    (d,) = data["directories"]
    assert [(j["rw"], j["block_size"]) for j in d["jobs"]] == [
        ("write", 262144), ("write", 262144), ("read", 262144), ("read", 262144)]
    for j in d["jobs"]:
        assert j["gbps"] > 0 and j["iops"] > 0 and j["io_bytes"] > 0
        assert j["lat_p50_us"] > 0
        assert j["lat_p50_us"] <= j["lat_p99_us"] <= j["lat_p999_us"]
    (m,) = d["models"]
    assert m["io_size"] == 262144
    assert all(re.fullmatch(r"(beats|slower than) recompute by [0-9.]+×", p["verdict"])
               for p in m["prefixes"])
    assert list(tmp_path.iterdir()) == []

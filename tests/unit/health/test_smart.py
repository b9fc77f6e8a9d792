"""smart-log normalisation over recorded outputs of several tool versions (see fixtures/smart)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.health.smart import (
    SmartLogError,
    local_controllers,
    parse_smart_log,
    read_local_drives,
)
from agent.system.run import CommandResult
from tests.unit.fakerunner import FakeRunner

FIXTURES = Path(__file__).parent / "fixtures" / "smart"


def load(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("fixture", "celsius", "used", "spare", "thresh", "media", "errlog", "hours", "unsafe"),
    [
        # nvme-cli 2.3, QEMU drive: 323 K, counters as strings
        ("nvme-cli-2.3-qemu.json", 49.85, 0, 0, 0, 0, 0, 0, 0),
        # nvme-cli 1.x, Samsung PM983: 322 K, counters as numbers
        ("nvme-cli-1.x-samsung-pm983.json", 48.85, 0, 100, 10, 0, 0, 4221, 0),
        # nvme-cli 2.x -H: critical_warning is an object
        ("nvme-cli-2.x-human.json", 54.85, 2, 100, 10, 0, 1860, 12993, 97),
        # smartctl 7.5 -j: Celsius, available_spare/percentage_used
        ("smartctl-7.5-nvme.json", 55.0, 2, 100, 10, 0, 1860, 12968, 97),
    ],
)
def test_recorded_versions(fixture, celsius, used, spare, thresh, media, errlog, hours,
                           unsafe) -> None:
    d = parse_smart_log(load(fixture), device="/dev/nvme0")
    assert d.temperature_celsius == celsius
    assert d.critical_warning == 0
    assert (d.percent_used, d.available_spare, d.available_spare_threshold) == (used, spare,
                                                                                thresh)
    assert (d.media_errors, d.error_log_entries, d.power_on_hours, d.unsafe_shutdowns) == (
        media, errlog, hours, unsafe)
    assert d.error is None and d.warnings == ()
    assert all(isinstance(v, int) for v in (d.percent_used, d.media_errors, d.power_on_hours))


def test_kelvin_is_converted_never_passed_through() -> None:
    # Every nvme-cli fixture reports kelvin; a plausible drive is far below 100 °C.
    for name in ("nvme-cli-2.3-qemu.json", "nvme-cli-1.x-samsung-pm983.json",
                 "nvme-cli-2.x-human.json"):
        raw = json.loads(load(name))["temperature"]
        assert raw > 273
        assert parse_smart_log(load(name), device="x").temperature_celsius == round(
            raw - 273.15, 2)


def test_fabrics_log_has_no_temperature() -> None:
    d = parse_smart_log(load("nvme-cli-2.3-fabrics.json"), device="/dev/nvme1")
    assert d.temperature_celsius is None  # 0 K means "not reported"


def test_smartctl_identity_fields() -> None:
    doc = json.loads(load("smartctl-7.5-nvme.json"))
    doc.update(model_name="Some SSD", serial_number="S1", firmware_version="F1")
    d = parse_smart_log(doc, device="/dev/nvme0")
    assert (d.model, d.serial, d.firmware) == ("Some SSD", "S1", "F1")


def test_capitalised_keys_of_some_2x_sources() -> None:
    """Derived (not recorded): one nvme-cli 2.x revision printed "Temperature" and "Value"."""
    doc = json.loads(load("nvme-cli-2.x-human.json"))
    doc["Temperature"] = doc.pop("temperature")
    doc["critical_warning"] = {"Value": 4, "reliability_degraded": 1}
    d = parse_smart_log(doc, device="/dev/nvme0")
    assert d.temperature_celsius == 54.85
    assert d.critical_warning == 4 and d.warnings == ("reliability degraded",)


@pytest.mark.parametrize(("raw", "celsius"), [
    ("49 °C", 49.0), ("322 K", 48.85), ("42 C (315 Kelvin)", 42.0), ("315 Kelvin", 41.85),
])
def test_temperature_strings_with_units(raw, celsius) -> None:
    """Synthetic: no recorded JSON carries units, but the text format does ("42 C (315 Kelvin)")."""
    doc = json.loads(load("nvme-cli-2.3-qemu.json"))
    doc["temperature"] = raw
    assert parse_smart_log(doc, device="x").temperature_celsius == celsius


def test_big_128_bit_counters_stay_exact() -> None:
    doc = json.loads(load("nvme-cli-2.3-qemu.json"))
    doc["media_errors"] = str(2**70 + 1)
    assert parse_smart_log(doc, device="x").media_errors == 2**70 + 1


@pytest.mark.parametrize(("change", "message"), [
    ({"media_errors": "lots"}, "'media_errors' is 'lots'"),
    ({"percent_used": True}, "'percent_used' is a boolean"),
    ({"temperature": [1]}, "temperature is [1]"),
    ({"temperature": "warm"}, "temperature 'warm'"),
])
def test_bad_values_name_the_field(change, message) -> None:
    doc = {**json.loads(load("nvme-cli-2.3-qemu.json")), **change}
    with pytest.raises(SmartLogError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_smart_log(doc, device="/dev/nvme0")


def test_not_a_smart_log() -> None:
    with pytest.raises(SmartLogError, match="not JSON"):
        parse_smart_log("Smart Log for NVME device:nvme0", device="/dev/nvme0")
    with pytest.raises(SmartLogError, match="not a SMART / Health log"):
        parse_smart_log({"Devices": []}, device="/dev/nvme0")
    with pytest.raises(SmartLogError, match="not a JSON object"):
        parse_smart_log("[1, 2]", device="/dev/nvme0")


def make_sysfs(root: Path, controllers: dict[str, dict[str, str]]) -> Path:
    for name, attrs in controllers.items():
        d = root / "class" / "nvme" / name
        d.mkdir(parents=True)
        for key, value in attrs.items():
            (d / key).write_text(value + "\n")
    return root


def test_reads_only_local_drives_through_the_runner(tmp_path) -> None:
    sysfs = make_sysfs(tmp_path, {
        "nvme0": {"transport": "pcie", "model": "QEMU NVMe Ctrl                          ",
                  "serial": "KVTEST0", "firmware_rev": "8.0.0"},
        "nvme10": {"transport": "pcie", "model": "QEMU NVMe Ctrl", "serial": "KVTEST1"},
        "nvme2": {"transport": "pcie", "model": "Broken"},
        "nvme3": {"transport": "tcp", "model": "Linux"},  # fabrics: never asked
        "nvme4": {},  # vanished mid-scan (no transport): skipped
    })
    runner = FakeRunner()
    runner.on(["nvme", "smart-log", "/dev/nvme0"], stdout=load("nvme-cli-2.3-qemu.json"))
    runner.on(["nvme", "smart-log", "/dev/nvme10"],
              stdout=load("nvme-cli-1.x-samsung-pm983.json"))
    runner.on(["nvme", "smart-log", "/dev/nvme2"], returncode=1,
              stderr="NVMe status: Invalid Log Page(0x109)")
    drives = read_local_drives(runner, sysfs=sysfs)
    assert [d.device for d in drives] == ["/dev/nvme0", "/dev/nvme2", "/dev/nvme10"]
    assert runner.calls == [
        ("nvme", "smart-log", "/dev/nvme0", "-o", "json"),
        ("nvme", "smart-log", "/dev/nvme2", "-o", "json"),
        ("nvme", "smart-log", "/dev/nvme10", "-o", "json"),
    ]
    first, broken, tenth = drives
    assert (first.model, first.serial, first.firmware) == ("QEMU NVMe Ctrl", "KVTEST0", "8.0.0")
    assert first.temperature_celsius == 49.85 and first.healthy
    assert tenth.firmware is None and tenth.temperature_celsius == 48.85
    assert broken.error is not None and "Invalid Log Page" in broken.error
    assert not broken.healthy


def test_timeout_and_garbage_become_unhealthy_drives(tmp_path) -> None:
    sysfs = make_sysfs(tmp_path, {"nvme0": {"transport": "pcie"},
                                  "nvme1": {"transport": "pcie"}})
    runner = FakeRunner()
    runner.on(["nvme", "smart-log", "/dev/nvme0"], stdout="{\"critical_warning\": 0")
    seen = {}

    def slow(argv, _input):
        from agent.system.run import CommandTimeout

        raise CommandTimeout(argv, 15.0)

    runner.on_call(["nvme", "smart-log", "/dev/nvme1"], slow)

    def record_timeout(argv, *, timeout=60.0, **kw) -> CommandResult:
        seen[argv[2]] = timeout
        return runner(argv, timeout=timeout, **kw)

    drives = read_local_drives(record_timeout, sysfs=sysfs, timeout=7.5)
    assert seen == {"/dev/nvme0": 7.5, "/dev/nvme1": 7.5}
    assert "not JSON" in (drives[0].error or "")
    assert "did not finish within 15s" in (drives[1].error or "")


def test_no_nvme_class_means_no_drives(tmp_path) -> None:
    assert local_controllers(tmp_path) == []
    assert read_local_drives(FakeRunner(), sysfs=tmp_path) == ()


def test_a_collect_with_a_topology_reads_the_drives_it_found_without_a_listing(
        tmp_path, monkeypatch) -> None:
    """The local controllers are part of the topology: a periodic collect reading the
    topology of the last event or pass asks their smart-logs without listing class/nvme
    and reading every (fabrics) controller's transport again."""
    from agent.config import parse_config
    from agent.health import collect as collect_module

    sysfs = make_sysfs(tmp_path / "sys", {
        "nvme0": {"transport": "pcie", "model": "QEMU NVMe Ctrl", "serial": "KVTEST0"},
        **{f"nvme{i}": {"transport": "tcp"} for i in range(1, 9)},
    })
    cfg = parse_config(f"version: 1\nnode: {{name: unit, sysfs: {sysfs}, "
                       f"state_dir: {tmp_path}/state, run_dir: {tmp_path}/run}}\n")
    topo = collect_module.read_topology(cfg)
    assert topo.local_drives == (sysfs / "class" / "nvme" / "nvme0",)
    assert collect_module.read_topology(cfg, drives=False).local_drives is None
    runner = FakeRunner()
    runner.on(["nvme", "smart-log", "/dev/nvme0"], stdout=load("nvme-cli-2.3-qemu.json"))
    listed: list[object] = []
    real = collect_module.local_controllers
    monkeypatch.setattr(collect_module, "local_controllers",
                        lambda root: listed.append(root) or real(root))
    import agent.health.smart as smart_module
    monkeypatch.setattr(smart_module, "local_controllers",
                        lambda root: listed.append(root) or real(root))
    snap = collect_module.collect(cfg, runner, topology=topo)
    assert [d.device for d in snap.drives] == ["/dev/nvme0"] and listed == []
    collect_module.collect(cfg, runner)  # no topology: read now, drives included
    assert listed == [str(sysfs)]

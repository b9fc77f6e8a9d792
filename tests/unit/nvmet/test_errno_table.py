"""The shared errno table on the fake, with both kernels' profiles (the kernel tier runs the
same table on 6.1 and on 6.12)."""

from __future__ import annotations

import errno as E
from pathlib import Path

import pytest

from nvmet.fake import KERNEL_6_1, KERNEL_6_12, FakeConfigFS
from nvmet.reader import read

from .errno_table import CASES, HOST, RANDOM, SUB, defaults_snapshot, run_case, wipe
from .fakeenv import FakeEnv

CAPTURE = Path(__file__).parent / "fixtures" / "kernel-6.1"


@pytest.mark.parametrize("profile", [KERNEL_6_1, KERNEL_6_12], ids=["6.1", "6.12"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_errno_rule_on_fake(case, profile) -> None:  # type: ignore[no-untyped-def]
    env = FakeEnv(profile)
    got = run_case(case, env)
    assert got == case.expect, (
        f"{case.rule}: expected {E.errorcode.get(case.expect, case.expect)}, "
        f"got {E.errorcode.get(got, got)}")
    wipe(env.fs)
    assert read(env.fs).is_empty()


def test_table_covers_every_design_rule() -> None:
    names = {c.name for c in CASES}
    design_rules = {
        "mkdir_existing_subsystem", "mkdir_nsid_zero", "write_device_path_while_enabled",
        "write_device_uuid_while_enabled", "write_device_nguid_while_enabled",
        "write_buffered_io_while_enabled", "write_addr_trsvcid_linked", "port_link_nonlocal",
        "port_link_same_address", "rdma_port_without_device", "rmdir_linked_subsystem",
        "rmdir_linked_host", "rmdir_subsystem_with_namespace", "unlink_attribute_file",
        "mkdir_any_string_subsystem", "enable_file_without_odirect", "enable_file_buffered",
        "allowed_hosts_to_subsystem", "port_link_to_host",
    }
    assert design_rules <= names, sorted(design_rules - names)
    assert len(names) == len(CASES), "case names must be unique"


def _capture_values() -> dict[str, str]:
    out = {}
    for line in (CAPTURE / "configfs-values.txt").read_text().splitlines():
        path, _, value = line.partition("\t")
        if path.startswith("/sys/kernel/config/nvmet/") and not value.startswith("cat:"):
            out[path[len("/sys/kernel/config/nvmet/"):]] = value
    return out


def test_fake_defaults_match_the_reference_capture() -> None:
    """Attribute files the fake creates on mkdir have the captured 6.1 names and values
    (for values the capture recorded before anything wrote them)."""
    snap = defaults_snapshot(FakeConfigFS())
    captured = _capture_values()
    sub = "subsystems/nqn.2026-11.io.kvagent:pool0"
    fake_sub = {p.rsplit("/", 1)[1]: v[3] for p, v in snap.items()
                if p.startswith(f"subsystems/{SUB}/attr_")}
    cap_sub = {p.rsplit("/", 1)[1]: v for p, v in captured.items()
               if p.startswith(f"{sub}/attr_")}
    assert set(fake_sub) == set(cap_sub)
    for name, value in cap_sub.items():
        assert fake_sub[name] == (RANDOM if name == "attr_serial" else value), name
    ns = {p.rsplit("/", 1)[1] for p in snap if p.startswith(f"subsystems/{SUB}/namespaces/1/")}
    cap_ns = {p.rsplit("/", 1)[1] for p in captured if p.startswith(f"{sub}/namespaces/1/")}
    assert cap_ns | {"revalidate_size"} == ns
    port = {p.rsplit("/", 1)[1] for p in snap if p.count("/") == 2 and p.startswith("ports/1/")
            and snap[p] != "dir"}
    cap_port = {p.rsplit("/", 1)[1] for p in captured if p.count("/") == 2
                and p.startswith("ports/1/")}
    assert port == cap_port
    assert snap[f"hosts/{HOST}"] == "dir"
    assert not [p for p in snap if p.startswith(f"hosts/{HOST}/")], "6.1 hosts have no files"
    assert snap["ports/1/ana_groups/1/ana_state"][3] == "optimized"
    assert snap[f"subsystems/{SUB}/namespaces/1/revalidate_size"] == ("file", False, True, None)

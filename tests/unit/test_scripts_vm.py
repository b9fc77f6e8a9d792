"""scripts/vm's KVM detection: no probe without VT-x/AMD-V, and a probe that hangs is
killed and counts as no KVM (a sandbox's /dev/kvm once hung every VM group's start)."""

from __future__ import annotations

import importlib.util
import os
import time
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_vm() -> ModuleType:
    loader = SourceFileLoader("kvagent_scripts_vm", str(REPO / "scripts/vm"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_virtualization_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    vm = load_vm()
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 hypervisor\n")
    assert not vm.cpu_has_virtualization(str(info))
    info.write_text("processor\t: 0\nflags\t\t: fpu vmx sse2\n")
    assert vm.cpu_has_virtualization(str(info))
    assert not vm.cpu_has_virtualization(str(tmp_path / "missing"))


def test_a_hanging_probe_is_killed_and_cached_as_no_kvm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vm = load_vm()
    pidfile = tmp_path / "probe.pid"
    vng = tmp_path / "vng"
    vng.write_text(f"#!/bin/sh\nsleep 600 &\necho $! > {pidfile}\nwait\n")
    vng.chmod(0o755)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KVAGENT_VM_KVM", raising=False)
    monkeypatch.setattr(vm.os, "access", lambda *a, **k: True)
    monkeypatch.setattr(vm, "cpu_has_virtualization", lambda: True)
    assert vm.kvm_usable(str(vng), "/boot/vmlinuz-test", timeout=1) is False
    cache = tmp_path / ".cache/kvagent/kvm-vmlinuz-test"
    assert cache.read_text() == "no\n"
    child = int(pidfile.read_text())
    for _ in range(50):  # the probe's whole process group is gone
        if not Path(f"/proc/{child}").exists() or \
                Path(f"/proc/{child}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.1)
    else:
        os.kill(child, 9)
        pytest.fail("the probe's child was left running")
    # cached: no second probe
    vng.write_text("#!/bin/sh\nexit 0\n")
    assert vm.kvm_usable(str(vng), "/boot/vmlinuz-test", timeout=1) is False


def test_under_tcg_the_guest_cpu_has_no_erms() -> None:
    """TCG emulates ERMS's byte-wise ``rep movsb``/``stosb`` a byte at a time: the guest's
    CPU model leaves ERMS out (a later ``-cpu`` than vng's ``-cpu max`` wins); KVM's is
    left alone."""
    vm = load_vm()
    common = dict(memory="2G", cpus=1, out=Path("/out"), scratch=Path("/scratch"),
                  qemu_opts=["-device nvme,serial=KVTEST0"], guest_command="sh guest.sh")
    tcg = vm.vng_argv("vng", "/boot/vmlinuz-x", use_kvm=False, **common)
    assert "--disable-kvm" in tcg
    (opts,) = [a for a in tcg if a.startswith("--qemu-opts=")]
    assert opts == "--qemu-opts=-device nvme,serial=KVTEST0 -cpu max,-erms"
    assert tcg[tcg.index("--cpus") + 1] == "1"
    assert tcg[-2:] == ["--", "sh guest.sh"]
    kvm = vm.vng_argv("vng", "/boot/vmlinuz-x", use_kvm=True, **common)
    assert "--disable-kvm" not in kvm
    assert "--qemu-opts=-device nvme,serial=KVTEST0" in kvm

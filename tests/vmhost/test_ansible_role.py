"""The Ansible role against the real-kernel VM (storage and GPU roles), run twice.

The controller runs here on the host; every task runs in the VM (connection
``kvagent_vm``, through the VM's shared directory: tests/vmhost/vm_channel.py). With
the controller in the guest too, each play took 15 minutes under TCG (the controller's
start and its per-task work emulated) and the test was the kernel tier's longest VM.

The role installs kvagent with its default method, the Debian package
scripts/build-deb made (offline: its dependencies are on the host's root filesystem
the guest runs from); tests/unit/test_ansible.py covers the venv method. The second run
must report changed=0. Afterwards the pool is taken down and nothing may be left in the
guest's kernel (nvmet objects, controllers, mounts).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vmplugin import GUEST_CPUS

from .vm_channel import Channel

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ROOT = "/var/lib/kvagent-ansible"  # (kvtest_root of ansible/tests/inventory.yml)
#: Weight: its minutes under TCG alone; ranks its VM slot among the kernel tier's groups.
#: Long (15 VM-minutes): scripts/test runs it with KVAGENT_LONG=1.
pytestmark = [pytest.mark.vmhost(weight=15), pytest.mark.long]
#: What the guest runs through the venv's Python (kit and pools are kernel-test helpers).
PY = f"cd {REPO} && {REPO}/.venv/bin/python -c"


def play(label: str, out: Path, tmp: Path, say) -> dict[str, int]:
    env = {**os.environ, "ANSIBLE_HOME": str(tmp / "ansible-home"),
           "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-local"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_CONNECTION_PLUGINS": str(HERE / "connection_plugins"),
           "KVAGENT_VM_CHANNEL": str(out)}
    proc = subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), "-i", "ansible/tests/inventory.yml",
         "-e", "ansible_connection=kvagent_vm", "-e", "ansible_become=false",
         "ansible/tests/localhost.yml"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1500, check=False)
    recap = proc.stdout[proc.stdout.rfind("PLAY RECAP"):]
    for line in recap.strip().splitlines():
        say(f"ansible {label}: {line}")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    m = re.search(r"kvtest\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)",
                  recap)
    assert m, recap
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m.groups()),
                    strict=True))


@pytest.mark.usefixtures("vm_slot")  # one of the kernel tier's parallel VM slots
def test_role_twice_second_run_changes_nothing(tmp_path: Path,
                                               request: pytest.FixtureRequest) -> None:
    assert list((REPO / "build/deb").glob("kvagent_*_all.deb")), \
        "no Debian package for the role to install: run scripts/setup (scripts/build-deb)"
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")

    def say(line: str) -> None:
        if reporter:
            reporter.write_line(f"[kernel tier] {line}")

    out, log = tmp_path / "out", tmp_path / "guest.log"
    out.mkdir()
    vm = subprocess.Popen(
        [sys.executable, str(REPO / "scripts/vm"), "--cpus", str(GUEST_CPUS), "--out",
         str(out), "--quiet", "--log", str(log), "--timeout", "1500", "--",
         "python3", str(HERE / "vm_channel.py"), "serve"],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    chan = Channel(out, vm)
    try:
        chan.wait_ready(600)
        chan.check(f"{PY} 'from tests.kernel import kit; kit.prepare_apt()'")
        # The pool's files on a filesystem nvmet exports files from (the guest's overlay /var
        # is not).
        chan.check(f"mkdir -p {ROOT}/pool && "
                   f"mount -t tmpfs -o size=400m,mode=0700 tmpfs {ROOT}/pool")
        try:
            first = play("first run", out, tmp_path, say)
            assert first["changed"] > 0 and first["failed"] == 0
            chan.check(f"mountpoint -q {ROOT}/mnt/kvtest/kvtest-ns1")  # the pool is mounted
            chan.check("dpkg -s kvagent >/dev/null")  # the role installed the package
            second = play("second run", out, tmp_path, say)
            assert second["changed"] == 0 and second["failed"] == 0, second
        finally:
            chan.run(f"{PY} 'from pathlib import Path; from tests.kernel import kit, pools; "
                     f"pools.umount_all_under(Path(\"{ROOT}\")); kit.force_clean()'")
            chan.run("dpkg --purge kvagent")
        left = chan.check(f"{PY} 'from tests.kernel import kit; print(*kit.leftovers(), "
                          "sep=chr(10))'").strip()
        assert not left, f"left in the guest's kernel:\n{left}"
    finally:
        chan.stop()
        try:
            tail = vm.communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            vm.kill()
            tail = vm.communicate()[0]
        say(f"ansible: {tail.strip()}")
    assert vm.returncode == 0, f"scripts/vm exit {vm.returncode}: {tail}\n" + (
        log.read_text(errors="replace")[-4000:] if log.exists() else "")

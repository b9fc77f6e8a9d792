"""The Ansible role against this VM as localhost (storage and GPU roles), run twice.

The role installs kvagent with its default method, the Debian package (the .deb
scripts/build-deb made, offline: its dependencies are on the host's root
filesystem); tests/unit/test_ansible.py covers the venv method. The second run
must report changed=0. Both recaps are printed with a ``KVAGENT-CI-LOG:`` prefix,
which the host-side plugin copies into the test log.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from . import kit
from .pools import umount_all_under

pytestmark = pytest.mark.kernel(group="ansible", weight=16)

REPO = Path(__file__).resolve().parents[2]
ROOT = Path("/tmp/kvagent-ansible")


def play(label: str) -> dict[str, int]:
    env = {**os.environ, "ANSIBLE_HOME": "/tmp/ansible-home",
           "ANSIBLE_LOCAL_TEMP": "/tmp/ansible-local", "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), "-i", "ansible/tests/inventory.yml",
         "ansible/tests/localhost.yml"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False)
    recap = proc.stdout[proc.stdout.rfind("PLAY RECAP"):]
    for line in recap.strip().splitlines():
        print(f"KVAGENT-CI-LOG: ansible {label}: {line}")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    m = re.search(r"kvtest\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)",
                  recap)
    assert m, recap
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m.groups()),
                    strict=True))


def test_role_twice_on_localhost_second_run_changes_nothing() -> None:
    assert list((REPO / "build/deb").glob("kvagent_*_all.deb")), \
        "no Debian package for the role to install: run scripts/setup (scripts/build-deb)"
    kit.prepare_apt()
    # The pool's files on a filesystem nvmet exports files from (the guest's /tmp is not).
    (ROOT / "pool").mkdir(parents=True, exist_ok=True)
    kit.sh("mount", "-t", "tmpfs", "-o", "size=400m,mode=0700", "tmpfs", str(ROOT / "pool"))
    try:
        first = play("first run")
        assert first["changed"] > 0 and first["failed"] == 0
        assert os.path.ismount(ROOT / "mnt/kvtest/kvtest-ns1"), "the pool is mounted"
        assert subprocess.run(["dpkg", "-s", "kvagent"], capture_output=True,
                              check=False).returncode == 0, "the role installed the package"
        second = play("second run")
        assert second["changed"] == 0 and second["failed"] == 0, second
    finally:
        umount_all_under(ROOT)
        kit.force_clean()
        subprocess.run(["dpkg", "--purge", "kvagent"], capture_output=True, check=False)

"""The engines' hard caps under the unit's system call filter, on a real xfs.

The VM has no systemd as PID 1, so the unit's ``SystemCallFilter=`` is emulated: its
groups are expanded with systemd-analyze's own tables (tests/syscallfilter.py) and
loaded as a seccomp allow-list (EPERM for the rest) through libseccomp, the library
systemd loads it with (tests/kernel/seccomp_runner.py). Under it, kvagent's own
functions set and read a project quota's hard limit on an xfs mounted with prjquota:

- no filter: works (the filesystem and the calls are sound);
- the unit before issue 35 (``@system-service @mount @module``): EPERM, nothing set
  (quotactl_fd is only in ``@privileged`` on systemd 252);
- the unit as shipped: works, and the kernel holds the limit.

The proof under systemd itself (the agent run by the unit) is the next issue's.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.system.xfsquota import get_quota
from tests.syscallfilter import UNIT, allowed_by

from . import kit

pytestmark = pytest.mark.kernel(group="lifecycle", weight=0.2)

RUNNER = Path(__file__).with_name("seccomp_runner.py")
#: The unit's filter before issue 35.
OLD_FILTER = "SystemCallFilter=@system-service @mount @module\n"
LIMIT = 64 << 20


def quota_call(mount: Path, projid: int, allowed: set[str] | None) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, str(RUNNER), str(mount), str(projid), str(LIMIT)],
        input=json.dumps(None if allowed is None else sorted(allowed)), capture_output=True,
        text=True, timeout=120, check=False, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_project_quota_calls_under_the_units_seccomp_filter(nullb, tmp_path: Path) -> None:
    device = nullb(320)
    kit.sh("mkfs.xfs", "-q", "-f", device, timeout=120)
    mount = tmp_path / "mnt"
    mount.mkdir()
    kit.sh("mount", "-o", "prjquota", device, str(mount))
    try:
        old, new = allowed_by(OLD_FILTER), allowed_by(UNIT.read_text())
        assert "quotactl_fd" not in old and "quotactl_fd" in new

        assert quota_call(mount, 101, None) == {"ok": True, "hard": LIMIT}

        refused = quota_call(mount, 102, old)
        assert refused["ok"] is False and refused["errno"] == errno.EPERM, refused
        assert get_quota(str(mount), 102).hard_limit_bytes == 0, "the old filter set a limit"

        assert quota_call(mount, 103, new) == {"ok": True, "hard": LIMIT}
        assert get_quota(str(mount), 103).hard_limit_bytes == LIMIT
        print(f"KVAGENT-CI-LOG: unit filter: project quota under {len(old)} calls of the "
              f"old filter: {refused['error']}; under the unit's {len(new)}: limit set")
    finally:
        kit.sh("umount", str(mount), check=False)

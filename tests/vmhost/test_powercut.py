"""Power cuts: the VM is cut off at three points, booted again on the same drives, and
a plain apply converges with nothing lost.

This test runs on the host (marker ``vmhost``): it boots the test VM four times on the
same three drive images (``scripts/vm --drives-dir``), one phase of
``powercut_guest.py`` a boot. Boots 1-3 end in a power cut (sysrq ``b``: reboot without
sync; the VM is gone and scripts/vm reports 125): during ``lvcreate``, while ``mkfs.xfs``
runs, and right after a record is written. Boots 2-4 each recover with a plain apply,
check that the next apply changes nothing and that data written before reads back.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.vmplugin import GUEST_CPUS

REPO = Path(__file__).resolve().parents[2]
#: Weight: its minutes under TCG alone (four boots); ranks its VM slot among the groups.
#: Long (four boots, 10 VM-minutes): scripts/test runs it with KVAGENT_LONG=1.
pytestmark = [pytest.mark.vmhost(weight=10), pytest.mark.long]
#: scripts/vm's exit status when the guest never finished its command (here: the cut).
CUT = 125


def boot(drives: Path, phase: str, log: Path) -> int:
    python = REPO / ".venv/bin/python"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts/vm"), "--cpus", str(GUEST_CPUS),
         "--drives", "3", "--drive-size", "1G",
         "--drives-dir", str(drives), "--quiet", "--log", str(log), "--timeout", "1200",
         "--", str(python), "tests/kernel/powercut_guest.py", phase],
        cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=1500,
        check=False)
    return proc.returncode


@pytest.mark.usefixtures("vm_slot")  # one of the kernel tier's parallel VM slots
def test_power_cuts_at_three_points(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    for phase, expected in (("1", CUT), ("2", CUT), ("3", CUT), ("4", 0)):
        log = tmp_path / f"boot{phase}.log"
        rc = boot(tmp_path / "drives", phase, log)
        text = log.read_text(errors="replace") if log.exists() else ""
        for line in text.splitlines():
            if line.startswith("KVAGENT-CI-LOG: ") and reporter:
                reporter.write_line(f"[kernel tier] boot {phase}: {line[16:]}")
        assert rc == expected, f"boot {phase}: scripts/vm exit {rc}:\n{text[-6000:]}"
        if expected == CUT:
            assert "armed:" in text, f"boot {phase} ended before arming its cut:\n{text[-6000:]}"
        else:
            assert f"phase {phase} done" in text

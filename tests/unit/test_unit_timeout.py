"""The unit tier's per-test time limit (tests/unit/conftest.py): a test that never ends
fails, and the tests after it still run (issue 35: a mutation once made a unit test loop
for ever instead of failing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_a_test_that_never_ends_fails_after_the_limit_and_the_rest_run(tmp_path: Path) -> None:
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_forever.py").write_text(
        "import time\n\n\ndef test_forever():\n    while True:\n        time.sleep(0.05)\n"
        "\n\ndef test_after():\n    pass\n")
    env = {**os.environ, "KVAGENT_UNIT_TIMEOUT": "2"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED test_forever.py::test_forever - Failed: Timeout (>2.0s)" in proc.stdout
    assert "1 failed, 1 passed" in proc.stdout

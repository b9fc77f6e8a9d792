"""A watchdog kill leaves the agent's stacks in the journal: systemd kills a wedged
``kvagent run`` with SIGABRT (WatchdogSignal's default); the fleet's test saw one with
nothing but "code=killed, status=6/ABRT" to show where the agent was."""

from __future__ import annotations

import signal
import subprocess
import sys


def test_sigabrt_dumps_every_threads_stack_once_run_enabled_it() -> None:
    program = (
        "import os, signal, threading, time\n"
        "from agent.cli.run_cmd import enable_stack_dumps\n"
        "def waiting_in_a_step():\n"
        "    time.sleep(60)\n"
        "threading.Thread(target=waiting_in_a_step, daemon=True).start()\n"
        "enable_stack_dumps()\n"
        "time.sleep(0.2)\n"
        "os.kill(os.getpid(), signal.SIGABRT)\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == -signal.SIGABRT
    assert "Fatal Python error: Aborted" in done.stderr, done.stderr
    assert "in waiting_in_a_step" in done.stderr, done.stderr  # the other thread too

"""Shared pytest setup: the kernel-tier plugin, hypothesis profiles, click 8.1's CliRunner
made to read like click 8.2's and, as root, a temporary directory tree a root kvagent
takes configs from."""

from __future__ import annotations

import contextlib
import inspect
import os
import tempfile
from pathlib import Path

import click.testing
import pytest
from hypothesis import settings

pytest_plugins = ["tests.vmplugin"]

# The guest sees the repository read-only: no example database there.
settings.register_profile("guest", database=None, deadline=None)
settings.register_profile("default", deadline=None)
settings.load_profile("guest" if os.environ.get("KVAGENT_IN_VM") == "1" else "default")

#: Where pytest's temporary directories go as root when the system's temporary directory
#: is writable by others (/tmp: a root kvagent refuses a config below it): the first of
#: these whose directories only root can change. On disk where /var is (the unit tier
#: keeps up to a GB there; pytest keeps the last three sessions), not below a directory
#: named .cache (ansible-lint skips those).
SAFE_TEMP_ROOTS = (Path("/var/cache/kvagent-pytest"), Path("/run/kvagent-pytest"))


def root_only(path: Path) -> bool:
    """Whether ``path`` and every directory above it are root's and writable by nobody
    else: kvagent's own rule for the directories above a config (agent.config)."""
    from agent.config import directory_trust_problem

    return all(directory_trust_problem(os.lstat(p), 0) is None
               for p in (path, *path.parents))


def pytest_configure(config: pytest.Config) -> None:
    if (os.geteuid() != 0 or config.option.basetemp
            or os.environ.get("PYTEST_DEBUG_TEMPROOT")
            or root_only(Path(tempfile.gettempdir()).resolve())):
        return
    for root in SAFE_TEMP_ROOTS:
        with contextlib.suppress(OSError):
            root.mkdir(mode=0o755, parents=True, exist_ok=True)
            if root_only(root):
                # pytest's own variable for its temporary root (xdist's workers inherit it,
                # and pytest keeps its numbered directories below it as in /tmp).
                os.environ["PYTEST_DEBUG_TEMPROOT"] = str(root)
                return


if "mix_stderr" in inspect.signature(click.testing.CliRunner.__init__).parameters:
    # click < 8.2 (Debian 12 has 8.1.3; the unit tier runs against kvagent's dependency
    # floors too, scripts/test-floors). The tests read a result as click 8.2 makes it:
    # ``stdout`` and ``stderr`` apart, ``output`` holding both. click 8.1 mixes them into
    # ``stdout`` unless told not to, and then its ``output`` is stdout alone.
    class _Result(click.testing.Result):
        @property
        def output(self) -> str:
            return self.stdout + self.stderr

    class _CliRunner(click.testing.CliRunner):
        def __init__(self, *args, mix_stderr: bool = False, **kwargs):  # type: ignore[no-untyped-def]
            super().__init__(*args, mix_stderr=mix_stderr, **kwargs)

        def invoke(self, *args, **kwargs) -> click.testing.Result:  # type: ignore[no-untyped-def]
            result = super().invoke(*args, **kwargs)
            if not self.mix_stderr:
                result.__class__ = _Result
            return result

    click.testing.CliRunner = _CliRunner  # type: ignore[misc]

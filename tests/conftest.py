"""Shared pytest setup: the kernel-tier plugin, hypothesis profiles, and click 8.1's
CliRunner made to read like click 8.2's."""

from __future__ import annotations

import inspect
import os

import click.testing
from hypothesis import settings

pytest_plugins = ["tests.vmplugin"]

# The guest sees the repository read-only: no example database there.
settings.register_profile("guest", database=None, deadline=None)
settings.register_profile("default", deadline=None)
settings.load_profile("guest" if os.environ.get("KVAGENT_IN_VM") == "1" else "default")


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

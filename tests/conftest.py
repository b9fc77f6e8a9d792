"""Shared pytest setup: the kernel-tier plugin and hypothesis profiles."""

from __future__ import annotations

import os

from hypothesis import settings

pytest_plugins = ["tests.vmplugin"]

# The guest sees the repository read-only: no example database there.
settings.register_profile("guest", database=None, deadline=None)
settings.register_profile("default", deadline=None)
settings.load_profile("guest" if os.environ.get("KVAGENT_IN_VM") == "1" else "default")

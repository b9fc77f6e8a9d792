"""Fixtures of the storage-side unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import Target


@pytest.fixture
def target(tmp_path: Path) -> Target:
    """A kernel-like fake configfs and a fake runner for one storage host."""
    return Target(tmp_path)

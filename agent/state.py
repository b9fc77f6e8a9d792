"""kvagent's own records on disk (JSON files under node.state_dir), written atomically.

These records are how kvagent proves ownership of things it cannot tag
(whole devices it exported, nvmet ports and hosts it created, files it made).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from . import failpoints
from .errors import KvagentError


class StateError(KvagentError):
    """A state file exists but cannot be read: never treated as empty."""


def read_json(path: Path, default: Any) -> Any:
    """Read a JSON record; ``default`` only when the file does not exist."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return default
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise StateError(f"{path} is corrupt ({exc}); kvagent will not guess what it owns",
                         "restore it from backup or inspect it; it is kvagent's record of "
                         "what it created") from None


def write_json(path: Path, data: Any) -> None:
    """Write a JSON record atomically (temp file in the same directory, fsync, rename,
    fsync of the directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    failpoints.step("record", str(path))


def fsync_dir(directory: Path) -> None:
    """Make a rename or create in ``directory`` durable (fsync of the directory itself)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

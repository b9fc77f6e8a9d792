#!/usr/bin/env python3
"""Pack a kvagent checkout into a reproducible tar that pip can install.

Usage: pack_source.py SOURCE_DIR OUTPUT_TAR PATH...

Only the named PATHs (relative to SOURCE_DIR) go in, without caches, build
output or dot-files, in sorted order, owned by root:root, with the files'
own modification times. The same checkout always gives the same bytes (every
entry gets one fixed mtime), so the role's copy task reports a change only
when the sources changed.
Runs on the Ansible controller with the controller's Python.
"""

from __future__ import annotations

import os
import sys
import tarfile

SKIP_DIRS = {"__pycache__", "build", "dist"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".egg-info")
#: 1980-01-01: the oldest time a wheel (zip) can hold.
FIXED_MTIME = 315532800


def _skipped(name: str) -> bool:
    return name.startswith(".") or name in SKIP_DIRS or name.endswith(SKIP_SUFFIXES)


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = FIXED_MTIME
    info.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
    return info


def _members(source: str, path: str) -> list[str]:
    full = os.path.join(source, path)
    if not os.path.isdir(full):
        return [path]
    found = [path]
    for root, dirs, files in os.walk(full):
        dirs[:] = sorted(d for d in dirs if not _skipped(d))
        rel = os.path.relpath(root, source)
        found += [os.path.join(rel, d) for d in dirs]
        found += [os.path.join(rel, f) for f in sorted(files) if not _skipped(f)]
    return sorted(found)


def main(argv: list[str]) -> int:
    """Write OUTPUT_TAR; exit 2 when a named path is missing."""
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    source, output, paths = argv[0], argv[1], argv[2:]
    missing = [p for p in paths if not os.path.exists(os.path.join(source, p))]
    if missing:
        print(f"pack_source: not in {source}: {', '.join(missing)}", file=sys.stderr)
        return 2
    with tarfile.open(output, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in paths:
            for member in _members(source, path):
                info = _normalise(tar.gettarinfo(os.path.join(source, member), member))
                if info.isreg():
                    with open(os.path.join(source, member), "rb") as f:
                        tar.addfile(info, f)
                elif info.isdir():
                    tar.addfile(info)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Helpers for engine tests: probe results as data, and parsers for rendered files."""

from __future__ import annotations

import errno
import re

from agent.system.probes import (
    DioAlign,
    FallocateResult,
    ODirectResult,
    ProbeResult,
    StepFailure,
)


def probe(path: str, *, odirect: bool = True, fallocate: bool = True,
          fallocate_errno: int | None = errno.EOPNOTSUPP) -> ProbeResult:
    """A ProbeResult for ``path`` with the given verdicts (what probe_mount would record)."""
    od = (ODirectResult(True, 4 << 20, 4096, None) if odirect else
          ODirectResult(False, 4 << 20, 4096,
                        StepFailure("open", errno.EINVAL, "EINVAL: Invalid argument")))
    if fallocate:
        fa = FallocateResult(True, 64 << 20, 64 << 20, "fallocate")
    elif fallocate_errno is None:
        fa = FallocateResult(False, 64 << 20, 0, "fallocate", StepFailure(
            "reserve", None, "fallocate returned success but st_blocks grew by 0"))
    else:
        fa = FallocateResult(False, 64 << 20, None, None, StepFailure(
            "fallocate", fallocate_errno, errno.errorcode[fallocate_errno]))
    return ProbeResult(
        path=path, transport="tcp", started_at="2026-01-01T00:00:00Z",
        finished_at="2026-01-01T00:00:01Z", odirect_ok=odirect, fallocate_ok=fallocate,
        odirect=od, fallocate=fa, dio_align=DioAlign(512, 512), device="259:1",
        logical_block_size=512, total_bytes=10**12, free_bytes=10**12)


def parse_env(text: str) -> dict[str, str]:
    """Parse an env file the way systemd's EnvironmentFile does for our subset.

    Comments and blank lines are skipped; values are bare or double-quoted with
    backslash escapes. Anything else fails the test.
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.fullmatch(r'([A-Za-z_][A-Za-z0-9_]*)=(?:"((?:[^"\\]|\\.)*)"|([^"\s]*))', line)
        assert m, f"not an env line: {line!r}"
        key, quoted, bare = m.groups()
        assert key not in out, f"{key} set twice"
        out[key] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
    return out

"""scripts/test's verdict (its last line, less the timings), from the kernel tier's
summary (written by tests/vmplugin.py under ``KVAGENT_TIER_SUMMARY``): what it left out
first, then what passed; "all passed" only when it left nothing out.

``python -m tests.tiersummary SUMMARY [--second-kernel-off] [--long-off] [-- PYTEST_ARGS...]``
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SECOND_KERNEL_OFF = "KVAGENT_SECOND_KERNEL=0"
LONG_OFF = "long: KVAGENT_LONG=1 runs them"


def read(path: str) -> dict[str, Any] | None:
    """The summary, or None where the kernel tier wrote none (or half of one)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def left_out(summary: dict[str, Any] | None, second_kernel_off: bool,
             args: Sequence[str], long_off: bool = False) -> str:
    """Which kernel groups (whole, or some of their tests) and vmhost tests were left out,
    and why: ``KVAGENT_SECOND_KERNEL=0`` for the second_kernel tests it deselected, the
    long tests scripts/test leaves out unless ``KVAGENT_LONG=1``, else the pytest
    arguments (or -m/-k)."""
    if summary is None:
        return "left out: unknown (the kernel tier wrote no summary)"
    by_reason: dict[str, Counter[str | None]] = {}
    for test in summary["left_out"]:
        if second_kernel_off and test["second_kernel"]:
            reason = SECOND_KERNEL_OFF
        elif long_off and test.get("long"):
            reason = LONG_OFF
        else:
            reason = f"arguments: {shlex.join(args)}" if args else "-m/-k"
        by_reason.setdefault(reason, Counter())[test["group"]] += 1
    if not by_reason:
        return "left out: none"
    left_total = Counter(t["group"] for t in summary["left_out"])
    return "left out: " + ", ".join(
        f"{_parts(counts, summary, left_total)} ({reason})"
        for reason, counts in sorted(by_reason.items(), key=lambda rc: (
            rc[0] not in (SECOND_KERNEL_OFF, LONG_OFF), rc[0])))


def _parts(counts: Counter[str | None], summary: dict[str, Any],
           left_total: Counter[str | None]) -> str:
    whole = [g for g in sorted(c for c in counts if c is not None)
             if g not in summary["booted"] and counts[g] == left_total[g]]
    parts = [("groups " if len(whole) > 1 else "group ") + ", ".join(map(repr, whole))
             ] if whole else []
    for group in sorted(g for g in counts if g is not None and g not in whole):
        total = summary["booted"].get(group, 0) + left_total[group]
        parts.append(f"{counts[group]} of {total} tests of group {group!r}")
    if None in counts:
        total = summary["vmhost"] + left_total[None]
        parts.append(f"{counts[None]} of {total} host-side vmhost tests")
    return ", ".join(parts)


def verdict(summary: dict[str, Any] | None, second_kernel_off: bool, args: Sequence[str],
            long_off: bool = False) -> str:
    """``left out: ...; passed: ...`` (the left-out part of :func:`left_out` first), or
    ``all passed: ...`` when nothing was left out. What passed: lint, the unit tier (with
    the pytest arguments it ran under) and the kernel tier's groups and tests as booted."""
    ran = ["lint", f"unit tier (arguments: {shlex.join(args)})" if args else "unit tier"]
    if summary is None:
        ran.append("kernel tier (what it ran is unknown)")
    else:
        kernel = [_count(len(summary["booted"]), "group"),
                  _count(sum(summary["booted"].values()), "test")]
        if summary["vmhost"]:
            kernel.append(_count(summary["vmhost"], "host-side vmhost test"))
        ran.append(f"kernel tier ({', '.join(kernel)})")
    gone = left_out(summary, second_kernel_off, args, long_off)
    if gone == "left out: none":
        return "all passed: " + ", ".join(ran)
    return f"{gone}; passed: {', '.join(ran)}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def main(argv: Sequence[str]) -> None:
    """``SUMMARY [--second-kernel-off] [--long-off] [-- PYTEST_ARGS...]``: prints the
    verdict."""
    own, args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m tests.tiersummary")
    parser.add_argument("summary")
    parser.add_argument("--second-kernel-off", action="store_true")
    parser.add_argument("--long-off", action="store_true")
    ns = parser.parse_args(own)
    print(verdict(read(ns.summary), ns.second_kernel_off, args, ns.long_off))


if __name__ == "__main__":
    main(sys.argv[1:])

"""Plain-text rendering shared by every layer (the CLI, status, reports)."""

from __future__ import annotations


def table(rows: list[list[str]], header: list[str]) -> str:
    """A plain left-aligned text table."""
    cells = [header, *rows]
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in cells]
    return "\n".join(lines)

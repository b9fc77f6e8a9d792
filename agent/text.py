"""Plain-text rendering shared by every layer (the CLI, status, reports)."""

from __future__ import annotations

import reprlib

#: Characters of a value that a message echoes (an error names what it refused, never
#: all of it: a few bytes of YAML aliases expand to megabytes).
ECHO_CHARS = 80


class _Echo(reprlib.Repr):
    """reprlib's bounded repr, also for subclasses of the built-in containers and strings
    (reprlib would build their whole repr first)."""

    def repr1(self, x: object, level: int) -> str:
        for base in (str, int, list, tuple, dict, set, frozenset):
            if isinstance(x, base) and type(x) is not base:
                return str(getattr(self, f"repr_{base.__name__}")(x, level))
        return super().repr1(x, level)

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 4 * ECHO_CHARS:  # (Python refuses repr() past 4300 digits)
            return f"<an integer of {x.bit_length()} bits>"
        return str(super().repr_int(x, level))


_ECHO = _Echo()
_ECHO.maxlevel = 2
_ECHO.maxstring = _ECHO.maxother = ECHO_CHARS
_ECHO.maxlist = _ECHO.maxtuple = _ECHO.maxdict = _ECHO.maxset = 4
_ECHO.maxlong = ECHO_CHARS


def shown(value: object) -> str:
    """``repr(value)`` cut to a few dozen characters however large the value (never built
    whole: a nested list of a million items costs what its first items do)."""
    return _ECHO.repr(value)


def clip(text: str, limit: int) -> str:
    """``text`` itself when at most ``limit`` characters, else its head and tail with how
    much was left out between them."""
    if len(text) <= limit:
        return text
    cut = f" …[{len(text) - limit} characters left out]… "
    keep = max(0, limit - len(cut))
    return text[: keep - keep // 3] + cut + text[len(text) - keep // 3:]


def table(rows: list[list[str]], header: list[str]) -> str:
    """A plain left-aligned text table."""
    cells = [header, *rows]
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in cells]
    return "\n".join(lines)

"""What nvme-cli prints, read tolerantly: the first JSON value of its output, keys looked
up case-insensitively, values taken only where they make sense.

nvme-cli's JSON changed shape across releases (fixtures of several versions under
tests/unit/initiator/fixtures/, with their sources in its README); the parser of
``nvme discover`` (:mod:`.discovery`) ignores fields it does not know and skips entries
it cannot make sense of, so a new nvme-cli degrades to "less information", not to a
crash.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ...errors import KvagentError

#: The nvme-cli program (found on PATH).
NVME = "nvme"


class NvmeCliError(KvagentError):
    """nvme-cli failed in a way that is not a connect classification (bad output, ...)."""


def extract_json(text: str) -> Any:
    """The first JSON value in ``text`` (nvme-cli may print warnings before it)."""
    decoder = json.JSONDecoder()
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    for start in sorted(starts):
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        return value
    raise NvmeCliError("nvme-cli printed no JSON", "run the command by hand with -o json")


def get(obj: Any, *names: str) -> Any:
    """``obj[name]`` for the first of ``names`` present, keys compared case-insensitively."""
    if not isinstance(obj, Mapping):
        return None
    lowered = {str(k).lower(): v for k, v in obj.items()}
    for name in names:
        if name.lower() in lowered:
            return lowered[name.lower()]
    return None


def text_of(value: Any) -> str | None:
    """``value`` as stripped text (None: missing or empty)."""
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def int_of(value: Any) -> int | None:
    """``value`` as an int (decimal or 0x hex text; None: anything else)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip(), 0)
    except (TypeError, ValueError):
        return None


def list_of(value: Any) -> list[Any]:
    """``value`` when it is a list, else ``[]``."""
    return value if isinstance(value, list) else []


"""A controller's active namespaces, as nvme-cli lists them (``nvme list-ns``)."""

from __future__ import annotations

import json
import re

from ...system.run import Runner
from .output import NVME

#: Seconds nvme-cli may take to list (or disconnect).
LIST_TIMEOUT = 30.0


def parse_list_ns(text: str) -> list[int]:
    """nsids from ``nvme list-ns`` text output (``[   0]:0x1`` per line) or its JSON form."""
    stripped = text.strip()
    if stripped.startswith("{"):
        data = json.loads(stripped)
        return sorted(int(e["nsid"]) for e in data.get("nsid_list", []))
    return sorted(int(m.group(1), 16) for m in re.finditer(r"\]\s*:\s*0x([0-9a-fA-F]+)", text))


def list_ns(run: Runner, controller: str, timeout: float = LIST_TIMEOUT) -> list[int]:
    """Active namespace ids of a controller (Identify active NS list), e.g. ``nvme2``."""
    result = run([NVME, "list-ns", f"/dev/{controller}"], timeout=timeout)
    return parse_list_ns(result.stdout)

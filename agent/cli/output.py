"""Printing results: text for people, JSON for scripts (``-o json``). Results go to stdout."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from typing import Any

import click

from ..text import table

__all__ = ["emit", "output_format", "table", "to_jsonable"]


def to_jsonable(value: Any) -> Any:
    """Dataclasses, tuples, sets and paths turned into plain JSON values."""
    if is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [to_jsonable(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def emit(data: Any, text: Callable[[Any], str] | str | None = None) -> None:
    """Print ``data`` as JSON when the output format is json, else ``text(data)``."""
    ctx = click.get_current_context()
    fmt = (ctx.find_root().obj or {}).get("output", "text")
    if fmt == "json":
        sys.stdout.write(json.dumps(to_jsonable(data), indent=2, sort_keys=False) + "\n")
        return
    rendered = text(data) if callable(text) else text
    if rendered is None:
        rendered = json.dumps(to_jsonable(data), indent=2)
    if rendered:
        sys.stdout.write(rendered if rendered.endswith("\n") else rendered + "\n")


def output_format() -> str:
    """``text`` or ``json``, as chosen with ``-o``."""
    ctx = click.get_current_context()
    return (ctx.find_root().obj or {}).get("output", "text")

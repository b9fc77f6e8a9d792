"""Generate the configuration reference (docs/configuration.md's generated part) from the model."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal, Union

from .build import format_path
from .model import Config
from .types import (
    NQN,
    AbsPath,
    AccountName,
    BlankDevice,
    DeviceId,
    Duration,
    FileMode,
    IPAddress,
    ListenAddress,
    Name,
    NQNPrefix,
    Percent,
    Size,
    VolumeGroupName,
)

BEGIN = "<!-- BEGIN GENERATED REFERENCE (kvagent config reference) -->"
END = "<!-- END GENERATED REFERENCE -->"

_TYPE_NAMES: dict[Any, str] = {
    Name: "name", NQN: "NQN", NQNPrefix: "NQN prefix", AbsPath: "absolute path",
    DeviceId: "/dev/disk/by-id path", BlankDevice: "device path", IPAddress: "IP address",
    ListenAddress: "host:port", Size: "size (512GiB, 1.5TB)", Duration: "duration (30s, 5m)",
    Percent: "percent (45%)", FileMode: "octal mode (\"0750\")", AccountName: "user/group",
    VolumeGroupName: "VG name", bool: "bool", int: "integer", str: "string",
}


def _type_text(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(tp))
    if origin is tuple:
        return f"list of {_type_text(typing.get_args(tp)[0])}"
    if origin in (Union, getattr(__import__("types"), "UnionType", None)):
        return " or ".join(_type_text(a) for a in typing.get_args(tp) if a is not type(None))
    if dataclasses.is_dataclass(tp):
        return f"[{tp.__name__}](#{tp.__name__.lower()})"
    return _TYPE_NAMES.get(tp, getattr(tp, "__name__", str(tp)))


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
        if value is None:
            return "—"
        if isinstance(value, tuple):
            return "`[]`" if not value else "`[" + ", ".join(map(str, value)) + "]`"
        if isinstance(value, bool):
            return f"`{str(value).lower()}`"
        return f"`{value}`"
    if f.default_factory is not dataclasses.MISSING:
        return "see section" if dataclasses.is_dataclass(f.type) or "Config" in str(f.type) \
            else "computed"
    return "**required**"


def _classes() -> list[tuple[type, tuple[str | int, ...]]]:
    """Every config dataclass with the path where it first appears, in document order."""
    seen: dict[type, tuple[str | int, ...]] = {}

    def visit(cls: type, path: tuple[str | int, ...]) -> None:
        if cls in seen:
            return
        seen[cls] = path
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            for inner in _dataclasses_in(hints[f.name]):
                sub = (*path, f.name, 0) if typing.get_origin(hints[f.name]) is tuple \
                    else (*path, f.name)
                visit(inner, sub)

    visit(Config, ())
    return list(seen.items())


def _dataclasses_in(tp: Any) -> list[type]:
    if dataclasses.is_dataclass(tp):
        return [tp]
    return [c for a in typing.get_args(tp) for c in _dataclasses_in(a)]


def render_reference() -> str:
    """Markdown for every section and field of the config model."""
    out = [BEGIN, ""]
    for cls, path in _classes():
        where = format_path(path).replace("[0]", "[]") if path else "(top level)"
        out.append(f"### {cls.__name__}")
        out.append("")
        out.append(f"At `{where}`. {(cls.__doc__ or '').strip()}")
        out.append("")
        out.append("| key | type | default | meaning |")
        out.append("|---|---|---|---|")
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"`{f.name}`"
            if f.metadata.get("alias"):
                key += f" (or `{f.metadata['alias']}`)"
            doc = f.metadata.get("doc", "")
            lo, hi = f.metadata.get("min"), f.metadata.get("max")
            if lo is not None and hi is not None:
                doc += f" Range {lo}–{hi}."
            out.append(f"| {key} | {_type_text(hints[f.name])} | {_default_text(f)} | {doc} |")
        out.append("")
    out.append(END)
    return "\n".join(out)


def splice(document: str, reference: str) -> str:
    """Replace the generated part of ``document`` with ``reference``."""
    head, _, rest = document.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + reference + tail


def main(argv: list[str] | None = None) -> int:
    """``python -m agent.config.reference FILE``: rewrite FILE's generated part in place."""
    import sys
    from pathlib import Path

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m agent.config.reference docs/configuration.md", file=sys.stderr)
        return 2
    path = Path(args[0])
    text = path.read_text()
    if BEGIN not in text:
        text = text.rstrip("\n") + "\n\n" + BEGIN + "\n" + END + "\n"
    path.write_text(splice(text, render_reference()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

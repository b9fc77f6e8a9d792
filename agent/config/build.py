"""Generic construction of frozen config dataclasses from YAML data, with field paths.

``build(cls, raw)`` walks the dataclass' type hints: unknown keys, missing
required keys and wrong types become :class:`Problem` entries carrying the
field path, so every error names exactly the field that is wrong.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

from ..text import shown

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: where (field path) and what."""

    path: Path
    message: str


def format_path(path: Sequence[str | int]) -> str:
    """``("target", "pools", 0, "ports")`` → ``target.pools[0].ports``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def doc_field(doc: str, default: Any = dataclasses.MISSING, *, minimum: int | None = None,
              maximum: int | None = None, default_factory: Any = dataclasses.MISSING,
              alias: str | None = None) -> Any:
    """A dataclass field with reference documentation and optional integer bounds."""
    meta = {"doc": doc, "min": minimum, "max": maximum, "alias": alias}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class _Invalid(Exception):
    """Internal: conversion of one value failed; problems already recorded."""


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (tuple, list):
        return "a list"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {bool: "true or false", int: "an integer", str: "a string", float: "a number"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


class Builder:
    """Builds dataclasses and records every problem found along the way."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def problem(self, path: Path, message: str) -> None:
        self.problems.append(Problem(path, message))

    def build(self, cls: type, raw: Any, path: Path = ()) -> Any:
        """Build ``cls`` from ``raw``; on failure return None (problems recorded)."""
        try:
            return self._convert(cls, raw, path, {})
        except _Invalid:
            return None

    def _convert(self, tp: Any, value: Any, path: Path, meta: dict[str, Any]) -> Any:
        origin, args, is_dataclass = _shape(tp)
        if origin in (Union, types.UnionType):
            if value is None and type(None) in args:
                return None
            options = [a for a in args if a is not type(None)]
            if len(options) == 1:
                return self._convert(options[0], value, path, meta)
            if all(dataclasses.is_dataclass(o) for o in options):
                return self._convert_tagged_union(options, value, path)
            return self._convert_first_match(options, value, path, meta)
        if origin is Literal:
            allowed = args
            if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
                self.problem(path,
                             f"{shown(value)} is not one of: {', '.join(map(str, allowed))}")
                raise _Invalid
            return value
        if origin is tuple:
            (item_type, _ellipsis) = args
            if not isinstance(value, list):
                self.problem(path, f"must be a list, got {_describe(value)}")
                raise _Invalid
            items, failed = [], False
            for i, item in enumerate(value):
                try:
                    items.append(self._convert(item_type, item, (*path, i), {}))
                except _Invalid:
                    failed = True
            if failed:
                raise _Invalid
            return tuple(items)
        if is_dataclass:
            return self._convert_dataclass(tp, value, path)
        if tp is bool:
            if not isinstance(value, bool):
                self.problem(path, f"must be true or false, got {_describe(value)}")
                raise _Invalid
            return value
        if tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                self.problem(path, f"must be an integer, got {_describe(value)}")
                raise _Invalid
            lo, hi = meta.get("min"), meta.get("max")
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                self.problem(path, f"{value} is out of range {lo}-{hi}")
                raise _Invalid
            return value
        if tp is str:
            if not isinstance(value, str):
                self.problem(path, f"must be a string, got {_describe(value)}")
                raise _Invalid
            return value
        parse = getattr(tp, "parse", None)
        if parse is not None:
            try:
                return parse(value)
            except ValueError as exc:
                self.problem(path, str(exc))
                raise _Invalid from None
        raise TypeError(f"config builder has no rule for {tp!r} at {format_path(path)}")

    def _convert_first_match(self, options: list[Any], value: Any, path: Path,
                             meta: dict[str, Any]) -> Any:
        messages = []
        for option in options:
            trial = Builder()
            try:
                return trial._convert(option, value, path, meta)
            except _Invalid:
                messages.extend(p.message for p in trial.problems)
        self.problem(path, "; or ".join(dict.fromkeys(messages)))
        raise _Invalid

    def _convert_tagged_union(self, options: list[Any], value: Any, path: Path) -> Any:
        kinds = {typing.get_args(_hints(o)["kind"])[0]: o for o in options}
        if not isinstance(value, dict):
            self.problem(path, f"must be a mapping with 'kind', got {_describe(value)}")
            raise _Invalid
        if "kind" not in value:
            self.problem(path, f"'kind' is required (one of: {', '.join(kinds)})")
            raise _Invalid
        kind = value["kind"]
        if not isinstance(kind, str) or kind not in kinds:
            named = shown(kind) if isinstance(kind, str) else _describe(kind)
            self.problem((*path, "kind"), f"{named} is not one of: {', '.join(kinds)}")
            raise _Invalid
        return self._convert_dataclass(kinds[kind], value, path)

    def _convert_dataclass(self, cls: Any, value: Any, path: Path) -> Any:
        if not isinstance(value, dict):
            self.problem(path, f"must be a mapping, got {_describe(value)}")
            raise _Invalid
        plan = _plan(cls)
        kwargs: dict[str, Any] = {}
        failed = False
        for key in value:
            if key not in plan.known:
                import difflib  # only for a mistake: not on every start

                hint = difflib.get_close_matches(str(key), sorted(plan.known), n=1)
                suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
                self.problem(
                    (*path, key),
                    f"unknown key {shown(key)}{suggestion} "
                    f"(allowed: {', '.join(sorted(plan.fields))})",
                )
                failed = True
        for alias, name in plan.aliases.items():
            if alias in value and name in value:
                self.problem((*path, alias), f"give either {alias!r} or {name!r}, not both")
                failed = True
        for name in plan.fields:
            key = name if name in value else next((a for a, n in plan.aliases.items()
                                                   if n == name and a in value), None)
            if key is None:
                if name in plan.required:
                    self.problem((*path, name), "is required")
                    failed = True
                continue
            raw = value[key]
            if key != name:  # an alias holding a single item of a list field
                raw = [raw]
            try:
                kwargs[name] = self._convert(plan.hints[name], raw, (*path, key),
                                             plan.meta[name])
            except _Invalid:
                failed = True
        if failed:
            raise _Invalid
        obj = cls(**kwargs)
        check = getattr(obj, "check", None)
        if check is not None:
            found = list(check())
            for rel, message in found:
                self.problem((*path, *rel), message)
            if found:
                raise _Invalid
        return obj


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {shown(value)}"


_HINTS_CACHE: dict[type, dict[str, Any]] = {}
_SHAPES: dict[Any, tuple[Any, tuple[Any, ...], bool]] = {}


def _shape(tp: Any) -> tuple[Any, tuple[Any, ...], bool]:
    """``(origin, args, is a dataclass)`` of a field's type, worked out once per type."""
    shape = _SHAPES.get(tp)
    if shape is None:
        shape = _SHAPES[tp] = (typing.get_origin(tp), typing.get_args(tp),
                               dataclasses.is_dataclass(tp))
    return shape


@dataclass(frozen=True)
class _Plan:
    """What building a dataclass needs to know of it, worked out once per class."""

    fields: dict[str, dataclasses.Field[Any]]  # the init fields by name
    aliases: dict[str, str]  # alias -> field name
    known: frozenset[str]  # keys a mapping may have
    required: frozenset[str]  # fields without a default
    hints: dict[str, Any]
    meta: dict[str, dict[str, Any]]  # each field's metadata


_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        aliases = {f.metadata["alias"]: f.name for f in fields.values()
                   if f.metadata.get("alias")}
        plan = _PLANS[cls] = _Plan(
            fields, aliases, frozenset(fields) | frozenset(aliases),
            frozenset(n for n, f in fields.items() if f.default is dataclasses.MISSING
                      and f.default_factory is dataclasses.MISSING),
            _hints(cls), {n: dict(f.metadata) for n, f in fields.items()})
    return plan


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS_CACHE:
        _HINTS_CACHE[cls] = typing.get_type_hints(cls)
    return _HINTS_CACHE[cls]


def duplicates(items: Iterable[tuple[int, Any]]) -> Iterator[tuple[int, Any, int]]:
    """Yield ``(index, value, first_index)`` for each value seen before."""
    seen: dict[Any, int] = {}
    for index, value in items:
        if value in seen:
            yield index, value, seen[value]
        else:
            seen[value] = index


def type_name(tp: Any) -> str:
    """Readable name of a field type, for the generated reference."""
    return _type_name(tp)

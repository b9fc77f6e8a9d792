"""YAML loading that remembers where each key and item came from (for error messages)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from ..text import shown


class MarkedDict(dict):
    """A mapping from YAML that knows the line of each key (1-based)."""

    line: int = 0
    key_lines: dict[Any, int]


class MarkedList(list):
    """A sequence from YAML that knows the line of each item (1-based)."""

    line: int = 0
    item_lines: list[int]


#: libyaml's parser where PyYAML has it (Debian's python3-yaml does): the pure-Python one
#: took 7 of 10 s of ``kvagent status`` at 64 pools under emulation. Its nodes carry the
#: same line marks.
_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_Base):  # type: ignore[misc]
    """SafeLoader that builds MarkedDict/MarkedList and refuses duplicate keys."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> MarkedDict:
    loader.flatten_mapping(node)
    out = MarkedDict()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError as exc:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, "found an unhashable key",
                key_node.start_mark,
            ) from exc
        if key in out:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"found duplicate key {shown(key)}", key_node.start_mark,
            )
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> MarkedList:
    out = MarkedList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


_STR = "tag:yaml.org,2002:str"
_MAP = yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG
_SEQ = yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG


class _Tree:
    """The data of a composed document: strings, mappings and sequences made here (what
    the constructors above give, without the constructor's per-node machinery, which was
    half of a parse), every other tag by the loader. A node reached twice (an alias) gives
    the same object, as the constructor's does; a node inside itself is refused as there."""

    def __init__(self, loader: _Loader) -> None:
        self.loader = loader
        self.made: dict[int, Any] = {}
        self.making: set[int] = set()

    def value(self, node: yaml.Node) -> Any:
        key = id(node)
        if key in self.made:
            return self.made[key]
        tag = node.tag
        if tag == _STR and isinstance(node, yaml.ScalarNode):
            return node.value
        if key in self.making:
            raise yaml.constructor.ConstructorError(
                None, None, "found unconstructable recursive node", node.start_mark)
        if tag == _MAP and isinstance(node, yaml.MappingNode):
            self.making.add(key)
            out: Any = self._mapping(node)
        elif tag == _SEQ and isinstance(node, yaml.SequenceNode):
            self.making.add(key)
            out = MarkedList(self.value(child) for child in node.value)
            out.line = node.start_mark.line + 1
            out.item_lines = [child.start_mark.line + 1 for child in node.value]
        else:
            out = self.loader.construct_object(node, deep=True)
        self.making.discard(key)
        self.made[key] = out
        return out

    def _mapping(self, node: yaml.MappingNode) -> MarkedDict:
        self.loader.flatten_mapping(node)
        out = MarkedDict()
        out.line = node.start_mark.line + 1
        out.key_lines = {}
        for key_node, value_node in node.value:
            key = self.value(key_node)
            try:
                hash(key)
            except TypeError as exc:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, "found an unhashable key",
                    key_node.start_mark,
                ) from exc
            if key in out:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {shown(key)}", key_node.start_mark,
                )
            out[key] = self.value(value_node)
            out.key_lines[key] = key_node.start_mark.line + 1
        return out


def load_yaml(text: str) -> Any:
    """Parse YAML text into plain data whose dicts/lists carry line numbers.

    Raises ``yaml.YAMLError`` (with a ``problem_mark``) on malformed input or a
    duplicate key.
    """
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        return None if node is None else _Tree(loader).value(node)
    finally:
        loader.dispose()


def line_of(data: Any, path: Sequence[str | int]) -> int | None:
    """Best-known line for a field path in marked data: the deepest node the path reaches."""
    line = getattr(data, "line", None)
    node = data
    for part in path:
        if isinstance(node, MarkedDict) and part in node:
            line = node.key_lines.get(part, line)
            node = node[part]
        elif isinstance(node, MarkedList) and isinstance(part, int) and 0 <= part < len(node):
            line = node.item_lines[part]
            node = node[part]
        else:
            break
    return line

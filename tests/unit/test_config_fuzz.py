"""The config loader over mutated valid configs (issue 24's fuzzing): every outcome is a
valid Config or a ConfigError whose every problem names a field (and the file's line
where the loader knows it) — never another exception. Numbers that cannot be real (NaN,
±inf, huge, negative) are among the mutations."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.config import ConfigError, parse_config

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
BASES = [yaml.safe_load(p.read_text()) for p in EXAMPLES]

HOSTILE = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1, 0, 2**64, 10**30, -(2**63), 1e308,
                     "", " ", "..", "/", "a,b=c", "x" * 5000, "\x00", "-1s", "1e999s",
                     "10000000PiB", "nan", "inf", True, None, [], {}, [None], {"kind": []}]),
    st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=8),
                                                         st.integers(), max_size=2),
)


def leaves(node: Any, path: tuple = ()) -> list[tuple]:
    """Every path to a value (mappings and lists walked) in ``node``."""
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += leaves(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += leaves(v, (*path, i))
    return out


def replaced(node: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    copy = dict(node) if isinstance(node, dict) else list(node)
    copy[head] = replaced(node[head], rest, value)
    return copy


@st.composite
def mutated(draw: st.DrawFn) -> str:
    base = draw(st.sampled_from(BASES))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(leaves(base)[1:]))
        base = replaced(base, path, draw(HOSTILE))
    return yaml.safe_dump(base, sort_keys=False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_configs_are_valid_or_refused_with_their_field(text: str) -> None:
    try:
        config = parse_config(text, "k.yaml")
    except ConfigError as err:
        assert err.problems
        for p in err.problems:
            assert p.field and p.message, p
            assert p.file == "k.yaml"
        return
    for value in numbers(config):  # what was taken is a number the kernel can hold
        assert math.isfinite(value) and 0 <= value < 2**63, value


def numbers(node: Any) -> list[float]:
    """Every int and float in a parsed config (dataclasses and tuples walked)."""
    if isinstance(node, bool) or node is None or isinstance(node, str):
        return []
    if isinstance(node, (int, float)):
        return [node]
    if dataclasses.is_dataclass(node):
        return [n for f in dataclasses.fields(node) for n in numbers(getattr(node, f.name))]
    if isinstance(node, (tuple, list)):
        return [n for v in node for n in numbers(v)]
    return []

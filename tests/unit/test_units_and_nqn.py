"""Sizes, durations and NQN syntax."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.config.units import parse_duration, parse_size
from nvmet.nqn import InvalidNQN, validate_nqn, validate_nqn_prefix


@pytest.mark.parametrize(("text", "expected"), [
    ("512GiB", 512 * 2**30), ("1.5TB", 1_500_000_000_000), ("4096", 4096), (8192, 8192),
    ("1 MiB", 2**20), ("2kb", 2000), ("0.5KiB", 512), ("3TiB", 3 * 2**40),
])
def test_parse_size(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "1.5", "-1", "1e3", "12 bananas", "0.3B", True])
def test_parse_size_rejects(text: object) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize(("text", "expected"), [
    ("30s", 30), ("5m", 300), ("1.5h", 5400), ("250ms", 0.25), (10, 10), ("2", 2), ("1d", 86400),
])
def test_parse_duration(text: object, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["soon", "5 min", "-3", "m", False])
def test_parse_duration_rejects(text: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@given(st.integers(min_value=0, max_value=2**50), st.sampled_from(["KiB", "MiB", "GiB"]))
def test_binary_units_are_exact(n: int, unit: str) -> None:
    factor = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
    if n * factor > 2**63 - 1:  # past loff_t: refused (test_config's size-over-loff-t)
        with pytest.raises(ValueError, match="largest size"):
            parse_size(f"{n}{unit}")
    else:
        assert parse_size(f"{n}{unit}") == n * factor


@pytest.mark.parametrize("nqn", [
    "nqn.2014-08.org.nvmexpress:uuid:7655a38e-e173-4d42-875a-c7e065e83747",
    "nqn.2014-08.org.nvmexpress.discovery",
    "nqn.2026-11.io.kvagent:stor-01:llama70b:gpu-01",
    "nqn.1992-05.com.example:any.thing_goes-here",
])
def test_valid_nqns(nqn: str) -> None:
    assert validate_nqn(nqn) == nqn


@pytest.mark.parametrize(("nqn", "why"), [
    ("", "empty"), ("iqn.2014-08.org:x", "look like"), ("nqn.2014-08.org", "identifier"),
    ("nqn.2014-8.org:x", "look like"), ("nqn.2014-00.org:x", "month"),
    ("nqn.2014-08.org:a/b", "'/'"), ("nqn.2014-08.org:a\tb", "whitespace"),
    ("nqn.2014-08.org:" + "x" * 220, "223"), ("nqn.2014-08.-org:x", "look like"),
])
def test_invalid_nqns(nqn: str, why: str) -> None:
    with pytest.raises(InvalidNQN, match=why):
        validate_nqn(nqn)


def test_prefix() -> None:
    assert validate_nqn_prefix("nqn.2026-11.io.kvagent") == "nqn.2026-11.io.kvagent"
    with pytest.raises(InvalidNQN):
        validate_nqn_prefix("nqn.2026-11.io.kvagent:")


@given(st.text(max_size=300))
def test_validate_nqn_never_crashes(text: str) -> None:
    try:
        validate_nqn(text)
    except InvalidNQN:
        pass
    else:
        assert len(text.encode()) <= 223 and "/" not in text

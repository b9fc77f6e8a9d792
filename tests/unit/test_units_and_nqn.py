"""Sizes, durations and NQN syntax."""

from __future__ import annotations

from fractions import Fraction

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


_NUMERALS = st.tuples(st.integers(0, 10**15), st.text("0123456789", max_size=12)).map(
    lambda t: f"{t[0]}.{t[1]}" if t[1] else str(t[0]))


@given(_NUMERALS, st.sampled_from(["ms", "s", "m", "h", "d", ""]))
def test_a_duration_is_the_correctly_rounded_exact_value(number: str, unit: str) -> None:
    exact = Fraction(number) * {"ms": Fraction(1, 1000), "s": 1, "m": 60, "h": 3600,
                                "d": 86400, "": 1}[unit]
    if exact > 2**31 - 1:
        with pytest.raises(ValueError, match="longest timeout"):
            parse_duration(number + unit)
    else:
        assert parse_duration(number + unit) == float(exact)


@given(_NUMERALS, st.sampled_from(["B", "kB", "GB", "KiB", "TiB"]))
def test_a_size_is_the_exact_value_or_refused(number: str, unit: str) -> None:
    exact = Fraction(number) * {"B": 1, "kB": 1000, "GB": 1000**3, "KiB": 1024,
                                "TiB": 1024**4}[unit]
    if exact.denominator != 1:
        with pytest.raises(ValueError, match="whole number of bytes"):
            parse_size(number + unit)
    elif exact > 2**63 - 1:
        with pytest.raises(ValueError, match="largest size"):
            parse_size(number + unit)
    else:
        assert parse_size(number + unit) == exact


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
    ("nqn.2014-08.org:a,b", "','"), ("nqn.2014-08.org:a=b", "'='"),
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

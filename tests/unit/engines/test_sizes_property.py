"""Size properties of every renderer, swept over pools (hypothesis): directory caps
(uneven namespaces from 10 MB to ~10 TB, one to three), the engines sharing the pool,
tensor and data parallelism, SGLang's backends and vLLM's two tiers.

For every case, read back from the files as the engine reads them (sweep.allocations):
- no tier is switched off silently: either the render is refused (TierOff) and some
  directory's share is below the engine's unit, or every process gets more than 0;
- each directory's processes together stay within that directory's own cap;
- each file is sized from its own directory's cap (the issue: Dynamo's files all got the
  smallest directory's size), except LMCache, whose one size for every worker is the
  smallest directory's share by the engine's design;
- every directory is used.
The engines' own code judges a sample of the same sweep in contract/test_sweep.py.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.engines import KINDS, render
from agent.engines.base import TierOff

from .sweep import Case, allocations, cases, own_size, processes, used_directories

GB = 1000**3


def off_directories(case: Case) -> list[int]:
    """The directories whose share is below the engine's unit: the tier would be off."""
    ctx = case.context()
    if case.kind == "vllm" and case.cpu:
        return []  # the fs tier has no size
    return [i for i, cap in enumerate(ctx.caps())
            if own_size(case, cap, processes(case, ctx, i)) <= 0]


def check(case: Case) -> None:
    ctx = case.context()
    off = off_directories(case)
    try:
        r = render(case.kind, ctx)
    except TierOff as exc:
        assert off, f"refused although every directory has a share: {exc.message}"
        for i in off:
            assert f"{ctx.directories[i]} (quota {ctx.caps()[i]} bytes)" in exc.message
        return
    assert not off, f"rendered although {[ctx.directories[i] for i in off]} get nothing"
    assert used_directories(case, ctx, r) == set(ctx.directories)
    got = allocations(case, ctx, r)
    caps = dict(zip(ctx.directories, ctx.caps(), strict=True))
    assert all(size > 0 for _, size in got), got
    totals = Counter()
    for d, size in got:
        totals[d] += size
    for d, total in totals.items():
        assert total <= caps[d], (d, total, caps[d])
    for i, d in enumerate(ctx.directories):
        sizes = {size for dd, size in got if dd == d}
        if not sizes:
            continue  # the fs tier (no size), or LMCache with no worker on it
        if case.kind == "lmcache":
            smallest = min(own_size(case, c, processes(case, ctx, j))
                           for j, c in enumerate(ctx.caps()) if processes(case, ctx, j))
            assert sizes == {smallest}, (d, sizes, smallest)
        else:
            assert sizes == {own_size(case, caps[d], processes(case, ctx, i))}, (d, sizes)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=150)
@given(data=st.data())
def test_sizes_within_each_directorys_own_cap(kind: str, data: st.DataObject) -> None:
    check(data.draw(cases(kind), label="case"))


@pytest.mark.parametrize("case", [
    Case("dynamo", (1000 * GB, 500 * GB), 4, 1, 1),  # the issue: 87 of 180 GB before
    Case("dynamo", (7680 * GB, 20 * GB), 4, 1, 4),  # the issue: 0 in both files before
    Case("lmcache", (7680 * GB, 10**7), 0, 8, 4),
    Case("sglang", (10**12, 10**7), 4, 8, 4),
    Case("sglang", (10**12, 10**7), 4, 8, 4, backend="mooncake"),
    Case("mooncake", (10**12, 10**7), 4, 8, 4),
    Case("vllm", (10**12, 10**7), 4, 8, 4),
    Case("vllm", (10**12, 500 * GB), 4, 4, 2, cpu=True),
], ids=lambda c: f"{c.kind}-{c.sizes}-tp{c.tp}-dp{c.dp}")
def test_cases_at_the_edges(case: Case) -> None:
    """The issue's two Dynamo examples and, per engine, a directory whose share is at the
    edge of the engine's unit (tiny next to a large one)."""
    check(case)


def test_which_edges_switch_a_tier_off() -> None:
    """Not vacuous: Dynamo's second example and LMCache's tiny directory are below their
    units (GB, 0.01 GiB) and refused; the byte-sized engines still give each of 32
    processes a few KiB of a 10 MB namespace (a quota is a whole number of 64 KiB, so a
    share of 0 bytes needs a cap below the process count: test_render_<kind>.py)."""
    assert off_directories(Case("dynamo", (7680 * GB, 20 * GB), 4, 1, 4)) == [1]
    assert off_directories(Case("dynamo", (1000 * GB, 500 * GB), 4, 1, 1)) == []
    assert off_directories(Case("lmcache", (7680 * GB, 10**7), 0, 8, 4)) == [1]
    for kind in ("sglang", "mooncake", "vllm"):
        assert off_directories(Case(kind, (10**12, 10**7), 4, 8, 4)) == [], kind

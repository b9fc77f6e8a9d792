"""Each engine's own code judges a sweep of kvagent's renders (the property sweep of
test_sizes_property.py, drawn by hypothesis, judged here): pools of one to three uneven
namespaces, up to four other engines, tensor_parallel 1-8 x data_parallel 1-4, SGLang's
file and Mooncake backends, vLLM's disk backend and fs tier.

Hypothesis draws the cases (derandomized: the same cases every run); each engine's
checker judges all of its renders in one process (``checkkit.run``'s batch mode) and
must accept every one. Renders kvagent refuses (TierOff: a directory's share below the
engine's unit) are not judged; test_sizes_property.py holds that refusal to the sweep.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from agent.engines import render
from agent.engines.base import TierOff
from tests.unit.engines.sweep import Case, cases

from .kit import judge_batch

#: Cases drawn per engine (each judged by the engine's code).
DRAWS = 40
DISTS = {"lmcache": ("lmcache",), "vllm": ("vllm",), "dynamo": ("kvbm",),
         "sglang": ("sglang", "mooncake-transfer-engine"),
         "mooncake": ("mooncake-transfer-engine",)}


def draw(kind: str) -> list[Case]:
    """DRAWS cases of ``kind`` from the property sweep's strategy, the same every run."""
    drawn: list[Case] = []

    @settings(max_examples=DRAWS, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate])
    @given(st.data())
    def collect(data: st.DataObject) -> None:
        drawn.append(data.draw(cases(kind)))

    collect()
    return drawn


@pytest.mark.parametrize("kind", list(DISTS))
def test_every_render_of_the_sweep_is_accepted(tmp_path: Path, kind: str) -> None:
    judged, refused = [], 0
    for i, case in enumerate(draw(kind)):
        ctx = case.context(str(tmp_path / f"case{i}"))
        for d in ctx.directories:
            Path(d).mkdir(parents=True)
        try:
            judged.append((case, ctx, render(kind, ctx)))
        except TierOff:
            refused += 1
    assert len(judged) >= DRAWS // 2, f"only {len(judged)} of {DRAWS} rendered"
    verdicts = judge_batch([(ctx, r) for _, ctx, r in judged], *DISTS[kind])
    bad = [(case, v.problems) for (case, _, _), v in zip(judged, verdicts, strict=True)
           if v.verdict != "accepted"]
    assert not bad, bad
    print(f"[figure] {kind}: {len(judged)} renders accepted by its own code "
          f"({verdicts[0].engine_version}), {refused} refused by kvagent (a tier off)")

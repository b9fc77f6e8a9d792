"""What every engine is sized by is the hard cap the kernel enforces on each directory.

A pool whose namespaces differ in size (1 TB and 0.5 TB) is attached by a real apply
pass over the fake GPU host; the caps kvagent hands each renderer for a directory must be
exactly the xfs project quota the same pass set on that directory's mount (the issue's
defect: an even split of the pool, 135 GB told for a directory whose quota is 90 GB).
The engines' own checkers then hold each engine's size to those caps
(test_<engine>.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.engines import KINDS
from agent.engines.quota import project_id

from .kit import GB, apply_pool

EXTRA = {"vllm": ", cpu_cache: 8GiB", "dynamo": ", gds: trust"}


@pytest.mark.parametrize("kind", KINDS)
def test_each_directory_is_sized_by_its_own_quota(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  kind: str) -> None:
    applied = apply_pool(tmp_path, monkeypatch,
                         [f"kind: {kind}, tensor_parallel: 2{EXTRA.get(kind, '')}",
                          "kind: lmcache" if kind != "lmcache" else "kind: sglang"],
                         sizes=(1000 * GB, 500 * GB))
    assert applied.result.ok, applied.result.errors
    quotas = tuple(applied.quota.limits[(m, project_id(kind))] for m in applied.mounts)
    ctx = applied.context(kind)
    assert ctx.caps() == quotas
    assert quotas[1] < quotas[0] and quotas[0] + quotas[1] <= ctx.capacity_bytes
    assert ctx.ranks == 2

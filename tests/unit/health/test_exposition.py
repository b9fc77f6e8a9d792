"""The /metrics body formatted once per object: exactly what prometheus_client formats
from the same snapshot, in both encodings; an unchanged object is not formatted again;
a changed one is (nothing stale)."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

from agent.health import exposition
from agent.health.exposition import MetricsBody
from agent.health.metrics import build_registry
from agent.health.snapshot import PathAna, Snapshot

from . import samples

ENCODERS = [generate_latest, openmetrics]


def many(pools: int = 6, paths: int = 3) -> Snapshot:
    """Pools on both roles (the first two degraded), a controller per pool with paths,
    drives; families appear first in a later object than the first one."""
    ps, cs = [], []
    for i in range(pools):
        name = f"kv{i}"
        state = "degraded" if i < 2 else "ok"
        ps += [samples.target_pool(name=name, state=state, ready=i >= 2),
               samples.initiator_pool(name=name, probe=None if i % 2 else {"odirect": True})]
        c = samples.controllers()[i % 2]
        cs.append(dataclasses.replace(c, name=f"nvme{i + 1}", pool=name, paths=tuple(
            PathAna(f"nvme{i}c{i + 1}n{k}", "optimized" if k % 2 else "inaccessible", k)
            for k in range(1, paths + 1))))
    return dataclasses.replace(samples.healthy(), pools=tuple(ps), controllers=tuple(cs),
                               drives=(samples.drive(), samples.drive(device="/dev/nvme9",
                                                                       temperature_celsius=None)))


SNAPSHOTS = {"none": None, "healthy": samples.healthy(), "degraded": samples.degraded(),
             "many": many()}


@pytest.mark.parametrize("encoder", ENCODERS, ids=["text", "openmetrics"])
@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_the_body_is_what_prometheus_client_formats(encoder, name: str) -> None:
    snap = SNAPSHOTS[name]
    body = MetricsBody(lambda: snap, process=False)
    want = encoder(build_registry(lambda: snap))
    assert body.render(encoder) == want
    assert body.render(encoder) == want  # from memory


def test_objects_are_formatted_once_and_changes_show(monkeypatch: pytest.MonkeyPatch) -> None:
    current = [many()]
    body = MetricsBody(lambda: current[0], process=False)
    formatted: list[int] = []
    real = exposition._encode
    monkeypatch.setattr(exposition, "_encode",
                        lambda enc, fams: formatted.append(len(fams)) or real(enc, fams))
    body.warm([generate_latest])
    objects = len(current[0].pools) + len(current[0].controllers) + len(current[0].drives)
    assert len(formatted) == objects  # the loop formatted every object once
    formatted.clear()
    body.render(generate_latest)  # a scrape: only the loop's own series
    assert len(formatted) == 1
    # A tick (same objects) and a new collect with equal objects: nothing formatted again.
    current[0] = dataclasses.replace(current[0], taken_at=current[0].taken_at + 30)
    body.render(generate_latest)
    again = dataclasses.replace(current[0], controllers=tuple(
        dataclasses.replace(c) for c in current[0].controllers))
    current[0] = again
    body.warm()
    assert len(formatted) == 2
    # A path's ANA state changes: that controller alone is formatted, and it shows.
    formatted.clear()
    c = again.controllers[3]
    changed = dataclasses.replace(c, paths=(dataclasses.replace(c.paths[0], state="change"),
                                            *c.paths[1:]))
    current[0] = dataclasses.replace(again, controllers=(
        *again.controllers[:3], changed, *again.controllers[4:]))
    text = body.render(generate_latest)
    assert len(formatted) == 2  # the loop's series and the changed controller
    assert text == generate_latest(build_registry(lambda: current[0]))
    assert f'path="{c.paths[0].path}",pool="{c.pool}",state="change"}} 1.0' in text.decode()

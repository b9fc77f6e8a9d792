"""The /metrics body made once per snapshot and format (its objects once per value) and
gzip-compressed once: exactly what prometheus_client formats from the same snapshot, in
both encodings, and its gzip form decompresses to the same bytes; an unchanged object is
not formatted again, a changed one is (nothing stale); a loop tick formats and deflates
only the head and the tail."""

from __future__ import annotations

import dataclasses
import gzip
import subprocess
import zlib
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

from agent.health import exposition
from agent.health.exposition import MAX_FORMATS, MetricsBody
from agent.health.metrics import build_registry
from agent.health.snapshot import PathAna, Snapshot

from . import samples

ENCODERS = [generate_latest, openmetrics]
#: What Prometheus 3 sends: OpenMetrics first (choose_encoder makes a new encoder per call).
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
                     "application/openmetrics-text;version=0.0.1;q=0.5,"
                     "text/plain;version=0.0.4;q=0.3,*/*;q=0.2")


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
    assert gzip.decompress(body.gzipped(encoder)) == want


def test_objects_are_formatted_once_and_changes_show(monkeypatch: pytest.MonkeyPatch) -> None:
    current = [many()]
    body = MetricsBody(lambda: current[0], process=False)
    formatted: list[int] = []
    real = exposition._encode
    monkeypatch.setattr(exposition, "_encode",
                        lambda enc, fams: formatted.append(len(fams)) or real(enc, fams))
    body.warm([generate_latest])
    objects = len(current[0].pools) + len(current[0].controllers) + len(current[0].drives)
    assert len(formatted) == objects + 1  # every object once, and the loop's other series
    formatted.clear()
    body.render(generate_latest)  # the first scrape: only the head (build, node, tick)
    assert len(formatted) == 1
    # A tick (same objects): the head again; a new collect with equal objects: the loop's
    # other series again, no object.
    current[0] = current[0].ticked(taken_at=current[0].taken_at + 30, tick_at=1030.0)
    body.render(generate_latest)
    again = dataclasses.replace(current[0], controllers=tuple(
        dataclasses.replace(c) for c in current[0].controllers))
    current[0] = again
    body.warm()
    assert len(formatted) == 3
    # A path's ANA state changes: that controller alone is formatted, and it shows.
    formatted.clear()
    c = again.controllers[3]
    changed = dataclasses.replace(c, paths=(dataclasses.replace(c.paths[0], state="change"),
                                            *c.paths[1:]))
    current[0] = dataclasses.replace(again, controllers=(
        *again.controllers[:3], changed, *again.controllers[4:]))
    text = body.render(generate_latest)
    assert len(formatted) == 3  # the head, the loop's other series, the changed controller
    assert text == generate_latest(build_registry(lambda: current[0]))
    assert f'path="{c.paths[0].path}",pool="{c.pool}",state="change"}} 1.0' in text.decode()


class Counted:
    """Counts bodies made, gzip members made and the bytes given to deflate."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bodies = 0
        self.members = 0
        self.deflated: list[int] = []
        real_body, real_deflate = exposition._Body, exposition.deflate_part
        real_member = exposition.gzip_member

        def body(*args: Any) -> Any:
            self.bodies += 1
            return real_body(*args)

        def deflate(data: bytes) -> bytes:
            self.deflated.append(len(data))
            return real_deflate(data)

        def member(parts: Any) -> bytes:
            self.members += 1
            return real_member(parts)

        monkeypatch.setattr(exposition, "_Body", body)
        monkeypatch.setattr(exposition, "deflate_part", deflate)
        monkeypatch.setattr(exposition, "gzip_member", member)


@pytest.mark.parametrize("accept", ["", PROMETHEUS_ACCEPT], ids=["text", "openmetrics"])
def test_many_scrapes_of_one_snapshot_render_and_compress_once(
        monkeypatch: pytest.MonkeyPatch, accept: str) -> None:
    snap = many()
    body = MetricsBody(lambda: snap)  # with the process's series, as served
    counted = Counted(monkeypatch)
    plain, packed = set(), set()
    for _ in range(200):
        encoder, content_type = choose_encoder(accept)  # a new encoder object each time
        plain.add(body.render(encoder, content_type))
        packed.add(body.gzipped(encoder, content_type))
    assert len(plain) == 1 and len(packed) == 1  # the same bytes every time
    (text,), (zipped,) = plain, packed
    assert counted.bodies == 1 and counted.members == 1
    assert sum(counted.deflated) == len(text)  # every byte deflated once
    assert gzip.decompress(zipped) == text
    assert len(body._formats) == 1


def test_a_tick_formats_and_deflates_only_the_head_and_the_tail(
        monkeypatch: pytest.MonkeyPatch) -> None:
    current = [many()]
    body = MetricsBody(lambda: current[0])
    body.render(openmetrics)
    body.gzipped(openmetrics)
    counted = Counted(monkeypatch)
    formatted: list[int] = []
    real = exposition._encode
    monkeypatch.setattr(exposition, "_encode",
                        lambda enc, fams: formatted.append(len(fams)) or real(enc, fams))
    current[0] = current[0].ticked(taken_at=samples.T0 + 10, tick_at=1010.0)
    text = body.render(openmetrics)
    zipped = body.gzipped(openmetrics)
    assert counted.bodies == 1 and counted.members == 1
    assert formatted == [3]  # build, node and tick: no object, no other loop series
    assert b"kvagent_loop_last_tick_timestamp_seconds 1.76722561e+09" in text
    head_and_tail = sum(counted.deflated)
    assert len(counted.deflated) == 2 and head_and_tail < len(text) // 10
    assert gzip.decompress(zipped) == text
    without_process = MetricsBody(lambda: current[0], process=False).render(openmetrics)
    assert without_process == openmetrics(build_registry(lambda: current[0]))


def test_the_loop_warms_the_collected_part_and_its_deflate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    current = [many()]
    body = MetricsBody(lambda: current[0], process=False)
    body.gzipped(generate_latest)  # a scraper asked for gzip once
    current[0] = dataclasses.replace(many(pools=7), taken_at=samples.T0 + 30)  # a collect
    body.warm()
    counted = Counted(monkeypatch)
    zipped = body.gzipped(generate_latest)
    text = body.render(generate_latest)
    assert gzip.decompress(zipped) == text == generate_latest(
        build_registry(lambda: current[0]))
    assert sum(counted.deflated) < len(text) // 10  # the scrape deflated head and tail only


def test_gzip_is_one_member_any_decoder_reads() -> None:
    snap = many(pools=12)
    body = MetricsBody(lambda: snap)  # one snapshot: one body, with the process's series
    text, zipped = body.render(openmetrics), body.gzipped(openmetrics)
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    assert d.decompress(zipped) == text and d.eof and d.unused_data == b""
    proc = subprocess.run(["gzip", "-dc"], input=zipped, capture_output=True, check=True,
                          timeout=60)
    assert proc.stdout == text


def test_formats_are_bounded() -> None:
    body = MetricsBody(lambda: samples.healthy(), process=False)
    for n in range(MAX_FORMATS + 3):
        body.render(generate_latest, f"format {n}")
    assert len(body._formats) == MAX_FORMATS
    assert list(body._formats)[-1] == f"format {MAX_FORMATS + 2}"

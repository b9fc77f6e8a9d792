"""The ``/metrics`` body, formatted once per collected snapshot and served from memory.

prometheus_client formats every sample on every scrape: with 64 pools on both roles
(1,024 namespace paths, ~7,700 series) that is 75 ms on a laptop and seconds under
emulation, and a scrape that lands while the loop runs a pass waits for it too. Here
the series of each pool, controller and drive are formatted by prometheus_client once
per object *value* and kept while an equal object comes back in the next snapshot; the
joined body is kept while the loop's later snapshots share the same pools, controllers
and drives (a tick only renews the loop's own series). A scrape formats the loop's and
the process's few series and joins. The loop warms the body after each collect
(:meth:`MetricsBody.warm`), so scrapes do not format the objects themselves.

Nothing is stale: the body is a function of the stored snapshot, which is exactly what
prometheus_client would format (a unit test compares them byte for byte).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from .metrics import (
    SnapshotSource,
    _Families,
    controller_families,
    drive_families,
    loop_families,
    pool_families,
)
from .snapshot import Snapshot

Encoder = Callable[[CollectorRegistry], bytes]
EOF_LINE = "# EOF\n"
#: Family name -> (its HELP/TYPE lines, its sample lines) in one object's exposition.
Fragment = dict[str, tuple[str, str]]


class _Fixed(Collector):
    """Yields the families it is given (a registry for one encoding of one object)."""

    def __init__(self, families: list[Metric]):
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families

    def describe(self) -> Iterable[Metric]:
        return []


def _encode(encoder: Encoder, families: list[Metric]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families))
    return encoder(registry).decode()


def _split(text: str) -> Fragment:
    """An exposition split into its families (``# EOF`` dropped)."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines(keepends=True):
        if line.startswith("# HELP "):
            current = out.setdefault(line.split(" ", 3)[2], ["", ""])
            current[0] += line
        elif line == EOF_LINE or current is None:
            continue
        elif line.startswith("#"):
            current[0] += line
        else:
            current[1] += line
    return {name: (head, samples) for name, (head, samples) in out.items()}


def _key(obj: object) -> object:
    """``obj`` by value: itself when hashable (frozen dataclasses), else its repr."""
    try:
        hash(obj)
    except TypeError:
        return (type(obj).__name__, repr(obj))
    return obj


class MetricsBody:
    """Formats the snapshot ``source()`` returns, per object once (see the module doc)."""

    def __init__(self, source: SnapshotSource, *, process: bool = True):
        self._source = source
        self._lock = threading.Lock()
        self._process = CollectorRegistry(auto_describe=False)
        if process:
            ProcessCollector(registry=self._process)
        #: per encoding: formatted objects of the last body, and that body
        self._fragments: dict[Encoder, dict[object, Fragment]] = {}
        self._bodies: dict[Encoder, tuple[tuple[Any, ...], str]] = {}

    def render(self, encoder: Encoder, snapshot: Snapshot | None = None) -> bytes:
        """The exposition of ``snapshot`` (default: ``source()``) in ``encoder``'s format,
        with this process's metrics."""
        snap = self._source() if snapshot is None else snapshot
        f = _Families()
        loop_families(f, snap)
        loop = _encode(encoder, list(f))
        objects = self._objects(encoder, snap) if snap is not None else ""
        process = encoder(self._process).decode()
        eof = loop.endswith(EOF_LINE)
        text = (loop.removesuffix(EOF_LINE) + objects + process.removesuffix(EOF_LINE)
                + (EOF_LINE if eof else ""))
        return text.encode()

    def warm(self, encoders: Iterable[Encoder] = ()) -> None:
        """Format the current snapshot's objects now (the loop calls this after a collect),
        for ``encoders`` and every encoding served before."""
        snap = self._source()
        if snap is None:
            return
        with self._lock:
            wanted = set(self._bodies) | set(encoders)
        for encoder in wanted:
            self._objects(encoder, snap)

    def _objects(self, encoder: Encoder, snap: Snapshot) -> str:
        ident = (snap.pools, snap.controllers, snap.drives)
        with self._lock:
            last = self._bodies.get(encoder)
            if last is not None and all(a is b for a, b in zip(last[0], ident, strict=True)):
                return last[1]
            memo = self._fragments.get(encoder, {})
        used: dict[object, Fragment] = {}
        heads: dict[str, str] = {}
        samples: dict[str, list[str]] = {}
        kinds = ((snap.pools, pool_families), (snap.controllers, controller_families),
                 (snap.drives, drive_families))
        for objs, families in kinds:
            for obj in objs:
                key = _key(obj)
                frag = used.get(key) or memo.get(key)
                if frag is None:
                    f = _Families()
                    families(f, obj)  # type: ignore[operator]
                    frag = _split(_encode(encoder, list(f)))
                used[key] = frag
                for name, (head, lines) in frag.items():
                    if name not in heads:
                        heads[name] = head
                        samples[name] = []
                    samples[name].append(lines)
        body = "".join(heads[name] + "".join(samples[name]) for name in heads)
        with self._lock:
            self._fragments[encoder] = used
            self._bodies[encoder] = (ident, body)
        return body

"""The ``/metrics`` body: made once per snapshot, gzip-compressed once, served from memory.

prometheus_client formats every sample on every scrape: with 64 pools on both roles
(1,024 namespace paths, ~7,700 series) that is 75 ms on a laptop and seconds under
emulation, and a scrape that lands while the loop runs a pass waits for it too. Here a
body has three parts:

- the **head**: ``kvagent_build_info``, ``kvagent_node_info`` and
  ``kvagent_loop_last_tick_timestamp_seconds``;
- the **collected** part: the loop's other series (last apply, counters, config) and
  every pool's, controller's and drive's, which only a collect (or a pass) changes. Each
  object's series are formatted by prometheus_client once per object *value* and kept
  while an equal object comes back; the part is joined and, once a scraper has asked for
  gzip in that format, deflated once per collect (the loop does both after each collect,
  :meth:`MetricsBody.warm`);
- the **tail**: this process's ``process_*`` series (and OpenMetrics' ``# EOF``).

The loop stores a new snapshot after each collect and, between collects, a re-stamped one
at every tick (at least every 10 s): ``/healthz`` needs it, and so does the body, whose
tick timestamp ``KvagentStale`` and ``kvagent:loop_tick_age:seconds`` read. So a tick
makes a new body, but only its head and tail are formatted again (a few hundred bytes):
the body of a snapshot is made at most once per format, on its first scrape, and its gzip
form at most once per format: the collected part's deflate blocks are reused, the head's
and tail's are deflated alone and the three are joined into one gzip member (each part
ends on a byte boundary with a sync flush and refers to nothing before it; the CRC-32 is
computed over the whole body). Every later scrape of that snapshot writes bytes from
memory. The ``process_*`` values are therefore those of the first scrape after the
loop's last tick, not of each scrape.

Nothing is stale: the body is a function of the stored snapshot, exactly what
prometheus_client would format for it (a unit test compares them byte for byte, and the
gzip form decompresses to the same bytes).
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

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
#: The last family of a body's head: the one series a loop tick changes.
TICK_FAMILY = "kvagent_loop_last_tick_timestamp_seconds"
#: zlib's default: 1/12 of the 16-pool body's size in 2 ms (level 9: 1/13 in 4 ms).
GZIP_LEVEL = 6
#: Formats (content types) kept; the least recently asked for is dropped beyond this.
MAX_FORMATS = 4
#: A gzip member's header: deflate, no name, no mtime (a body's bytes are its snapshot's).
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
#: An empty final deflate block (fixed Huffman codes, end of block at once).
_FINAL_BLOCK = b"\x03\x00"


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


def deflate_part(data: bytes) -> bytes:
    """``data`` as raw deflate blocks that refer to nothing before them and end on a byte
    boundary, not final (a sync flush): parts made so join into one deflate stream."""
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)


def gzip_member(parts: Sequence[tuple[bytes, bytes]]) -> bytes:
    """One gzip member of ``parts``, each (its bytes, :func:`deflate_part` of them)."""
    crc, size = 0, 0
    for plain, _ in parts:
        crc = zlib.crc32(plain, crc)
        size += len(plain)
    return (_GZIP_HEADER + b"".join(deflated for _, deflated in parts) + _FINAL_BLOCK
            + struct.pack("<II", crc, size & 0xFFFFFFFF))


def _loop_parts(snap: Snapshot | None) -> tuple[list[Metric], list[Metric]]:
    """The loop's families: those of the head (up to the tick) and the rest."""
    f = _Families()
    loop_families(f, snap)
    families = list(f)
    names = [m.name for m in families]
    cut = names.index(TICK_FAMILY) + 1 if TICK_FAMILY in names else len(families)
    return families[:cut], families[cut:]


def _collect_key(snap: Snapshot | None) -> tuple[object, ...]:
    """What the collected part is made of (compared by identity: a tick keeps them)."""
    if snap is None:
        return ()
    return (snap.last_apply, snap.counters, snap.config_error, snap.health_error, snap.pools,
            snap.controllers, snap.drives)


@dataclass
class _Collected:
    """One format's collected part for one collect, and its deflate blocks once asked."""

    key: tuple[object, ...]
    text: bytes
    deflated: bytes | None = None

    def made_of(self, key: tuple[object, ...]) -> bool:
        return len(key) == len(self.key) and all(
            a is b for a, b in zip(key, self.key, strict=True))


@dataclass
class _Body:
    """One snapshot's body in one format, and its gzip form once asked."""

    snapshot: Snapshot | None
    head: bytes
    collected: _Collected
    tail: bytes
    plain: bytes
    gzipped: bytes | None = None


@dataclass
class _Format:
    """What is kept for one format (content type)."""

    encoder: Encoder
    fragments: dict[object, Fragment] = field(default_factory=dict)
    collected: _Collected | None = None
    body: _Body | None = None
    gzip_asked: bool = False


class MetricsBody:
    """The body of the snapshot ``source()`` returns, per format (see the module doc).

    ``key`` names a format (the server passes the content type; prometheus_client's
    ``choose_encoder`` returns a new encoder object per call); by default the encoder.
    """

    def __init__(self, source: SnapshotSource, *, process: bool = True):
        self._source = source
        self._lock = threading.Lock()
        self._process = CollectorRegistry(auto_describe=False)
        if process:
            ProcessCollector(registry=self._process)
        self._formats: OrderedDict[Hashable, _Format] = OrderedDict()

    def render(self, encoder: Encoder, key: Hashable | None = None) -> bytes:
        """The exposition of the current snapshot in ``encoder``'s format, with this
        process's metrics."""
        snap = self._source()
        with self._lock:
            return self._body(self._format(encoder, key), snap).plain

    def gzipped(self, encoder: Encoder, key: Hashable | None = None) -> bytes:
        """:meth:`render`'s bytes as one gzip member (``Content-Encoding: gzip``)."""
        snap = self._source()
        with self._lock:
            fmt = self._format(encoder, key)
            fmt.gzip_asked = True
            body = self._body(fmt, snap)
            if body.gzipped is None:
                body.gzipped = self._compress(body)
            return body.gzipped

    def warm(self, encoders: Iterable[Encoder] = ()) -> None:
        """Make the current snapshot's collected part now (the loop calls this after a
        collect), for ``encoders`` and every format served before; deflate it for the
        formats a scraper asked for gzip in."""
        snap = self._source()
        if snap is None:
            return
        with self._lock:
            for encoder in encoders:
                self._format(encoder, None)
            for fmt in self._formats.values():
                collected = self._collected(fmt, snap)
                if fmt.gzip_asked and collected.deflated is None:
                    collected.deflated = deflate_part(collected.text)

    # ----------------------------------------------------- under self._lock
    def _format(self, encoder: Encoder, key: Hashable | None) -> _Format:
        name = encoder if key is None else key
        fmt = self._formats.get(name)
        if fmt is None:
            fmt = self._formats[name] = _Format(encoder)
            while len(self._formats) > MAX_FORMATS:
                self._formats.popitem(last=False)
        else:
            self._formats.move_to_end(name)
        return fmt

    def _body(self, fmt: _Format, snap: Snapshot | None) -> _Body:
        body = fmt.body
        if body is not None and body.snapshot is snap:
            return body
        head_families, _ = _loop_parts(snap)
        head = _encode(fmt.encoder, head_families).removesuffix(EOF_LINE).encode()
        collected = self._collected(fmt, snap)
        tail = fmt.encoder(self._process)  # ends with "# EOF" in OpenMetrics
        body = fmt.body = _Body(snap, head, collected, tail, head + collected.text + tail)
        return body

    def _collected(self, fmt: _Format, snap: Snapshot | None) -> _Collected:
        key = _collect_key(snap)
        if fmt.collected is not None and fmt.collected.made_of(key):
            return fmt.collected
        _, rest = _loop_parts(snap)
        text = _encode(fmt.encoder, rest).removesuffix(EOF_LINE) if rest else ""
        if snap is not None:
            text += self._objects(fmt, snap)
        fmt.collected = _Collected(key, text.encode())
        return fmt.collected

    def _compress(self, body: _Body) -> bytes:
        collected = body.collected
        if collected.deflated is None:
            collected.deflated = deflate_part(collected.text)
        return gzip_member([(body.head, deflate_part(body.head)),
                            (collected.text, collected.deflated),
                            (body.tail, deflate_part(body.tail))])

    def _objects(self, fmt: _Format, snap: Snapshot) -> str:
        """Every pool's, controller's and drive's series, each formatted once per value."""
        memo = fmt.fragments
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
                    frag = _split(_encode(fmt.encoder, list(f)))
                used[key] = frag
                for name, (head, lines) in frag.items():
                    if name not in heads:
                        heads[name] = head
                        samples[name] = []
                    samples[name].append(lines)
        fmt.fragments = used
        return "".join(heads[name] + "".join(samples[name]) for name in heads)

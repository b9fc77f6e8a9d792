"""What a renderer gets (EngineContext) and what it returns (Rendered), plus shared helpers.

Renderers are pure: the same context gives byte-identical files (sorted keys,
no timestamps), so re-rendering is idempotent.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import yaml

from ..config.model import EngineKind
from ..errors import KvagentError, UsageError
from ..system.gds import GdsReadiness
from ..system.probes import ProbeResult

Format = Literal["yaml", "json", "env", "args"]
_SUFFIX_FORMAT: dict[str, Format] = {
    ".yaml": "yaml", ".yml": "yaml", ".json": "json", ".env": "env", ".args": "args",
}
GIB = 1024**3
GB = 1000**3
#: Share of a directory's hard cap an engine's own size setting leaves free. Engines count
#: the bytes they write; the filesystem allocates blocks (each file rounds up to 4 KiB,
#: directories and xattrs take blocks too, a file being replaced exists twice for a
#: moment): an engine told its whole quota meets ENOSPC before its evictor runs.
HEADROOM_PERCENT = 3


def engine_bytes(cap: int, ranks: int = 1) -> int:
    """What one of ``ranks`` engine processes sharing a directory whose hard cap is ``cap``
    may be told to fill: the cap less :data:`HEADROOM_PERCENT`, split evenly."""
    return cap * (100 - HEADROOM_PERCENT) // 100 // ranks


@dataclass(frozen=True)
class EngineContext:
    """One engine's share of one pool, as the caller (apply / the CLI) sees it.

    ``directories`` are the engine's own directories, one per namespace mount
    (``<mount>/<storage node>-ns<nsid>/<kind>``); ``capacity_bytes`` is the engine's cap for all of
    them together (at most 90% of the pool; the caller computes it, see
    ``engines.dirs.engine_capacities``). ``directory_caps`` is each directory's own hard cap
    (its xfs project quota on that mount, which follows the mount's size: namespaces of a
    pool may differ); empty means an even split of ``capacity_bytes``. ``probes`` are the
    probe results of the mounts; each directory uses the probe of the mount that contains
    it. ``tensor_parallel`` is the GPU ranks of one engine instance and ``data_parallel``
    the instances on this host that use one directory: engines whose size is per rank or
    per worker get the directory's cap divided by ``ranks`` (their product), so all of
    them together stay under it. ``cpu_bytes`` is host RAM the engine may pin (vLLM's
    ``cpu_bytes_to_use``, from the engine's ``cpu_cache``: with it vLLM gets a CPU tier and
    an fs tier, without it its disk backend). ``cleaner``: kvagent's cleaner is on for the
    engine (``engines[].cleaner``), so a tier that never evicts is bounded. ``backend`` is the
    engine's storage backend where it has several (SGLang: ``file`` or ``mooncake``). ``gds`` is
    what this host has of GPUDirect Storage, for an engine whose config depends on it
    (``None``: not looked at, the operator vouches for it).
    """

    pool: str
    kind: EngineKind
    directories: tuple[str, ...]
    capacity_bytes: int
    probes: tuple[ProbeResult, ...] = ()
    devices: tuple[str, ...] = ()
    tensor_parallel: int = 1
    data_parallel: int = 1
    cpu_bytes: int | None = None
    gds: GdsReadiness | None = None
    directory_caps: tuple[int, ...] = ()
    backend: str | None = None
    cleaner: bool = False

    @property
    def ranks(self) -> int:
        """GPU worker processes that use one directory (tensor × data parallel)."""
        return self.tensor_parallel * self.data_parallel

    def check(self) -> None:
        """Raise UsageError when the context cannot be rendered."""
        if not self.directories:
            raise UsageError(f"pool {self.pool!r}: engine {self.kind} has no directories")
        for d in self.directories:
            if not os.path.isabs(d) or d != os.path.normpath(d):
                raise UsageError(f"pool {self.pool!r}: engine directory {d!r} must be an "
                                 "absolute, normalised path")
            if "," in d:
                raise UsageError(f"pool {self.pool!r}: engine directory {d!r} contains ','")
        if len(set(self.directories)) != len(self.directories):
            raise UsageError(f"pool {self.pool!r}: engine directories are listed twice")
        if self.capacity_bytes <= 0:
            raise UsageError(f"pool {self.pool!r}: engine {self.kind} has no capacity "
                             f"({self.capacity_bytes} bytes)")
        for name in ("tensor_parallel", "data_parallel"):
            if getattr(self, name) < 1:
                raise UsageError(f"pool {self.pool!r}: {name} must be at least 1, got "
                                 f"{getattr(self, name)}")
        if self.directory_caps and (len(self.directory_caps) != len(self.directories)
                                    or min(self.directory_caps) <= 0):
            raise UsageError(f"pool {self.pool!r}: engine {self.kind} needs one positive cap "
                             f"per directory, got {list(self.directory_caps)}")
        if self.cpu_bytes is not None and self.cpu_bytes <= 0:
            raise UsageError(f"pool {self.pool!r}: cpu_bytes must be positive")

    def probe_for(self, directory: str) -> ProbeResult | None:
        """The probe of the mount that holds ``directory`` (longest matching path)."""
        best: ProbeResult | None = None
        for probe in self.probes:
            root = probe.path.rstrip("/") or "/"
            inside = directory == root or directory.startswith(root.rstrip("/") + "/")
            if inside and (best is None or len(root) > len(best.path.rstrip("/"))):
                best = probe
        return best

    def caps(self) -> tuple[int, ...]:
        """Each directory's hard cap, in the order of ``directories`` (its quota on its
        mount; an even split of ``capacity_bytes`` when the caller gave none)."""
        if self.directory_caps:
            return self.directory_caps
        return (self.capacity_bytes // len(self.directories),) * len(self.directories)

    def cap_of(self, directory: str) -> int:
        """The hard cap of one of the engine's directories."""
        return self.caps()[self.directories.index(directory)]


class TierOff(KvagentError):
    """A render would give the engine a size it reads as "off" (0, or below its unit):
    refused, never written, so the pool's hand-off reports it as an error."""


#: What the operator can change when a directory is too small for the engine's processes.
TIER_OFF_HINT = ("give the engine a larger share of the pool (engines[].capacity), fewer "
                 "processes per directory (engines[].tensor_parallel × data_parallel), or "
                 "larger namespaces")


def refuse_tier_off(ctx: EngineContext, key: str, too_small: Sequence[str]) -> None:
    """Raise :class:`TierOff` when ``too_small`` (one line per directory whose size would
    switch the engine's tier off) is not empty."""
    if too_small:
        raise TierOff(f"pool {ctx.pool!r}: not rendering {ctx.kind}: {key} would switch its "
                      "disk tier off: " + "; ".join(too_small), TIER_OFF_HINT)


@dataclass(frozen=True)
class Rendered:
    """Rendered config files for one engine: ``files`` maps file name to text.

    ``format`` is the engine's main format; each file's own format follows from
    its suffix (``format_of``). ``notes`` tell the operator about fallbacks used,
    keys kvagent could not confirm and settings it leaves to them.
    ``subdirectories`` must each lie inside one of the context's directories.
    """

    files: Mapping[str, str]
    format: Format
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Directories the engine needs to exist before it starts (e.g. one per rank, inside
    #: the engine's directories, so inside its cap): apply makes them with the engine's
    #: owner, group and mode.
    subdirectories: tuple[str, ...] = ()

    def format_of(self, name: str) -> Format:
        """The format of one rendered file, from its suffix."""
        return _SUFFIX_FORMAT[os.path.splitext(name)[1]]


def header(ctx: EngineContext, comment: str = "#") -> str:
    """A deterministic comment line naming the pool and engine (YAML and env files)."""
    return (f"{comment} Rendered by kvagent for pool {ctx.pool!r}, engine {ctx.kind}. "
            "Re-render instead of editing.\n")


def dump_yaml(ctx: EngineContext, data: Mapping[str, object]) -> str:
    return header(ctx) + yaml.safe_dump(dict(data), sort_keys=True, default_flow_style=False)


def dump_json(data: Mapping[str, object]) -> str:
    return json.dumps(data, sort_keys=True, indent=2) + "\n"


_ENV_SAFE = re.compile(r"^[A-Za-z0-9_./:,@%+=-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_value(value: str) -> str:
    """Bare when safe; else double-quoted with \\, ", $ and ` escaped (systemd style)."""
    if _ENV_SAFE.match(value):
        return value
    escaped = re.sub(r'([\\"$`])', r"\\\1", value)
    return f'"{escaped}"'


def dump_env(ctx: EngineContext, env: Mapping[str, str]) -> str:
    """KEY=VALUE lines sorted by key, after the header comment."""
    lines = []
    for key in sorted(env):
        if not _ENV_NAME.match(key):  # pragma: no cover - renderer bug
            raise ValueError(f"bad environment variable name {key!r}")
        lines.append(f"{key}={env_value(env[key])}")
    return header(ctx) + "\n".join(lines) + "\n"


def dump_args(argv: Sequence[str]) -> str:
    """Command-line arguments on one line, shell-quoted (``shlex.split`` reads it back)."""
    import shlex

    return shlex.join(argv) + "\n"


def indexed_names(base: str, suffix: str, count: int) -> list[str]:
    """``base.suffix`` for one directory, ``base-0.suffix``, ``base-1.suffix``... for more."""
    if count == 1:
        return [f"{base}{suffix}"]
    return [f"{base}-{i}{suffix}" for i in range(count)]


def probe_notes(ctx: EngineContext) -> list[str]:
    """A note for each directory that has no probe result."""
    return [f"{d}: no probe result for its mount; kvagent used the engine's defaults there"
            for d in ctx.directories if ctx.probe_for(d) is None]


def odirect_failure(probe: ProbeResult) -> str:
    """Why O_DIRECT failed on a probed mount, in words."""
    f = probe.odirect.failure
    if f is None:
        return "O_DIRECT failed"
    code = f" (errno {f.errno})" if f.errno is not None else ""
    return f"O_DIRECT {f.step} failed on {probe.path}: {f.error}{code}"


def fallocate_failure(probe: ProbeResult) -> str:
    """Why fallocate failed (or reserved nothing) on a probed mount, in words."""
    f = probe.fallocate.failure
    if f is None:
        return "fallocate failed"
    code = f" (errno {f.errno})" if f.errno is not None else ""
    return f"fallocate {f.step} failed on {probe.path}: {f.error}{code}"

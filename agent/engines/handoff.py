"""Handing an attached pool to its inference engines: probe, prepare, cap, clean, render.

The initiator pass attaches a pool (connect, find, filesystem, mount); this step
then probes the mounts (or reuses the recorded probes while nothing was remounted),
prepares each engine's directories, makes each engine's cap a hard limit (its xfs
project quota on every mount with project quotas, :mod:`agent.engines.quota`), runs
the cleaners that are turned on (:mod:`agent.engines.cleaner`) and renders each
engine's config into ``<state_dir>/engines/<pool>/<kind>/``. Caps follow the
filesystems' sizes: they are computed from the probes, which are taken again whenever
something was (re)mounted or grown. It is its own step, above the initiator: the
initiator knows nothing of engines.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import effects, progress
from ..config.model import Config, EngineConfig, InitiatorPool
from ..config.types import Name
from ..errors import KvagentError, UsageError
from ..records import ENGINES_DIR, PROBES_DIR, InitiatorRecords, engine_renders_dir, probes_path
from ..result import ActionRecord, RunResult
from ..state import read_json, write_json
from ..system.gds import GdsReadiness, probe_gds
from ..system.mounts import MOUNTINFO, mounted_at
from ..system.probes import (
    DioAlign,
    FallocateResult,
    ODirectResult,
    ProbeResult,
    StepFailure,
    probe_mount,
)
from ..system.xfsquota import QuotaOps, XfsQuota
from . import EngineContext, Rendered, cleaner, quota
from . import render as render_kind
from .dirs import engine_capacities, engine_dir, prepare, prepare_subdirectories

Prober = Callable[..., ProbeResult]
GdsProbe = Callable[[], GdsReadiness]


def hand_off(cfg: Config, pool: InitiatorPool, mounts: tuple[str, ...] | list[str],
             transport: str | None, remounted: bool, result: RunResult, *,
             probe: Prober = probe_mount, quotas: QuotaOps | None = None,
             gds: GdsProbe | None = None, mountinfo: Path = MOUNTINFO,
             fresh: frozenset[str] | None = None) -> None:
    """Probe (when needed), prepare engine directories, set their hard caps, run the
    cleaners that are on and render engine configs.

    ``remounted``: something was made, (re)mounted or grown in this pass, so the
    recorded probes (and the caps computed from their sizes) no longer describe the
    mounts; ``fresh`` names which mounts (None: all of them), the others keep their
    recorded probes (a new namespace of a pool of many is probed alone). A cap that
    cannot be set, or an engine whose config is refused (Dynamo without GPUDirect
    Storage, a size the engine would read as off), is an error of the pool; the other
    engines go on.
    """
    mounts = list(mounts)
    state_dir = Path(cfg.node.state_dir)
    quotas = quotas or XfsQuota()

    def act(kind: str, subject: str, detail: str = "") -> None:
        result.actions.append(ActionRecord("initiator", pool.name, kind, subject, detail,
                                           "done"))

    def fail(exc: KvagentError | OSError) -> None:
        result.error("initiator", pool.name, getattr(exc, "message", None) or str(exc),
                     getattr(exc, "hint", None))

    probes = _probes(cfg, pool.name, mounts, transport, remounted, probe, fresh)
    out_root = engine_renders_dir(state_dir, pool.name)
    kinds = {e.kind for e in pool.engines}
    if out_root.is_dir():
        for stale in sorted(p for p in out_root.iterdir() if p.name not in kinds):
            effects.remove_tree(stale)
            act("engine.unrender", str(stale))
    if not pool.engines:
        return
    total = sum(p.total_bytes or 0 for p in probes)
    caps = engine_capacities(total, pool.engines)
    for engine in pool.engines:
        for prepared in prepare(mounts, engine):
            if prepared.changes:
                act("engine.dir", prepared.path, ", ".join(prepared.changes))
    sizes = {p.path: p.total_bytes for p in probes}
    try:
        for change in quota.ensure_caps(state_dir, pool.name, mounts, pool.engines, sizes,
                                        quotas, mountinfo):
            act(change.kind, change.subject, change.detail)
    except (KvagentError, OSError) as exc:
        fail(exc)  # the caps stay advisory; health says so
    for engine in pool.engines:
        if engine.cleaner.enabled:
            _clean(state_dir, pool, engine, mounts,
                   directory_caps(pool, engine.kind, mounts, caps[engine.kind], probes),
                   quotas, mountinfo, act, fail)
    readiness = (gds or probe_gds)() if any(e.checks_gds for e in pool.engines) else None
    for engine in pool.engines:
        out_dir = out_root / engine.kind
        try:
            rendered = render_engine(pool, engine, mounts, caps[engine.kind], probes,
                                     gds=readiness if engine.checks_gds else None)
            for prepared in prepare_subdirectories(rendered.subdirectories, mounts, engine):
                if prepared.changes:
                    act("engine.dir", prepared.path, ", ".join(prepared.changes))
        except KvagentError as exc:
            fail(exc)
            if out_dir.is_dir():  # a config the engine refuses or that hangs it must not stay
                effects.remove_tree(out_dir)
                act("engine.unrender", str(out_dir), f"{engine.kind}: refused")
            continue
        for name, text in rendered.files.items():
            path = out_dir / name
            if not path.exists() or path.read_text() != text:
                effects.make_dirs(out_dir)
                effects.write_file(path, text)
                act("engine.render", str(path), engine.kind)
        if out_dir.is_dir():
            for stale in sorted(p for p in out_dir.iterdir() if p.name not in rendered.files):
                effects.unlink(stale)
                act("engine.unrender", str(stale), engine.kind)


def _clean(state_dir: Path, pool: InitiatorPool, engine: EngineConfig, mounts: list[str],
           caps: tuple[int, ...], quotas: QuotaOps, mountinfo: Path,
           act: Callable[..., None], fail: Callable[[KvagentError | OSError], None]) -> None:
    """The engine's cleaner on every mount whose filesystem accounts project quotas;
    ``caps`` is each mount's directory cap (:func:`directory_caps`), the reference where
    the directory's project has no hard limit (it could not be set)."""
    for mount, cap in zip(mounts, caps, strict=True):
        if quota.mount_quota_mode(mount, mountinfo) == "off":
            continue  # no O(1) usage: the cleaner does not walk to find out (health says so)
        directory = engine_dir(mount, engine.kind)
        try:
            run = cleaner.clean(directory, mount, engine, quotas, cap)
        except (KvagentError, OSError) as exc:
            fail(exc)
            continue
        if run is not None:
            cleaner.record_run(state_dir, pool.name, engine.kind, run)
            act("engine.clean", directory, f"{engine.kind}: {run.describe(engine)}")


def forget(cfg: Config, pool: str, result: RunResult, *, dry_run: bool = False) -> None:
    """After a pool is detached: drop its recorded probes and rendered engine configs."""
    state_dir = Path(cfg.node.state_dir)
    renders = engine_renders_dir(state_dir, pool)
    if dry_run:
        return
    effects.unlink(probes_path(state_dir, pool), missing_ok=True, kind="record.remove")
    quota.forget(state_dir, pool)
    cleaner.forget(state_dir, pool)
    if renders.is_dir():
        effects.remove_tree(renders)
        result.actions.append(ActionRecord("initiator", pool, "engine.unrender", str(renders),
                                           "", "done"))


def leftover_pools(cfg: Config, attached: Iterable[str]) -> list[str]:
    """Pools whose probes, rendered engine configs, quota or cleaner records are in the
    state directory although neither the config nor the attachment records name them.

    A pass killed after recording a pool's detach and before :func:`forget` leaves
    them; the next pass no longer knows the pool and forgets these instead. Only
    entries named like a pool count (a stray name is not kvagent's to remove).
    """
    state_dir = Path(cfg.node.state_dir)
    keep = {p.name for p in cfg.initiator.pools} if cfg.initiator else set()
    keep |= set(attached)
    found: set[str] = set()
    renders = state_dir / ENGINES_DIR
    if renders.is_dir() and not renders.is_symlink():
        found |= {e.name for e in os.scandir(renders) if e.is_dir(follow_symlinks=False)}
    for sub in (PROBES_DIR, "quota", "cleaner"):
        d = state_dir / sub
        if d.is_dir() and not d.is_symlink():
            found |= {e.name[:-len(".json")] for e in os.scandir(d)
                      if e.name.endswith(".json")}
    return sorted(n for n in found - keep if _is_name(n))


def _is_name(text: str) -> bool:
    try:
        Name.parse(text)
    except ValueError:
        return False
    return True


def _probes(cfg: Config, pool: str, mounts: list[str], transport: str | None,
            remounted: bool, probe: Prober,
            fresh: frozenset[str] | None = None) -> list[ProbeResult]:
    """The mounts' probe results: recorded ones while nothing was (re)mounted; after a
    (re)mount, the recorded ones of the mounts not in ``fresh`` (None: none kept).

    Probing writes and preallocates real data: a converged pass (every ``kvagent run``
    interval) reuses the record instead of probing again, and a namespace added to a pool
    of many is probed alone (each probe took 0.5 s under TCG: the hand-off of the tenth
    namespace waited 5 s for the other nine).
    """
    record = probes_path(cfg.node.state_dir, pool)
    try:
        recorded = [probe_from_json(p) for p in read_json(record, [])]
    except (KvagentError, KeyError, TypeError, ValueError):
        recorded = []
    if not remounted and [p.path for p in recorded] == list(mounts) and all(
            p.transport == transport for p in recorded):
        return recorded
    keep = {} if not remounted or fresh is None else {
        p.path: p for p in recorded if p.transport == transport and p.path not in fresh}
    probes = [keep.get(m) or probe_bounded(probe, m, transport, cfg.node.sysfs)
              for m in mounts]
    write_json(record, [dataclasses.asdict(p) for p in probes])
    return probes


def probe_bounded(probe: Prober, mount: str, transport: str | None,
                  sysfs: str) -> ProbeResult:
    """``probe`` of one mount as a bounded step (:data:`progress.DEVICE_IO_BOUND`): its
    I/O goes to the pool's device, which the kernel may take that long to fail."""
    with progress.step(f"probing {mount}", bound=progress.DEVICE_IO_BOUND):
        return probe(mount, transport, sysfs=sysfs)


def directory_caps(pool: InitiatorPool, kind: str, mounts: list[str], capacity: int,
                   probes: list[ProbeResult]) -> tuple[int, ...]:
    """Each of the engine's directories' hard cap: its xfs project quota on that mount
    (``quota.mount_caps`` of the mount's size), so an engine is never told more than its
    quota where namespaces differ in size. A mount of unknown size gets an even split of
    ``capacity``."""
    sizes = {p.path: p.total_bytes for p in probes}
    even = capacity // len(mounts) if mounts else 0
    caps = []
    for mount in mounts:
        size = sizes.get(mount)
        caps.append(quota.mount_caps(size, pool.engines)[kind] if size else even)
    return tuple(caps)


def engine_context(pool: InitiatorPool, engine: EngineConfig, mounts: list[str],
                   capacity: int, probes: list[ProbeResult], *,
                   gds: GdsReadiness | None = None) -> EngineContext:
    """What one engine's renderer gets for a mounted pool."""
    return EngineContext(
        pool=pool.name, kind=engine.kind,
        directories=tuple(engine_dir(m, engine.kind) for m in mounts),
        capacity_bytes=capacity, probes=tuple(probes), gds=gds,
        directory_caps=directory_caps(pool, engine.kind, mounts, capacity, probes),
        tensor_parallel=engine.tensor_parallel, data_parallel=engine.data_parallel,
        cpu_bytes=None if engine.cpu_cache is None else int(engine.cpu_cache),
        backend=engine.backend, cleaner=bool(engine.cleaner.enabled))


def render_engine(pool: InitiatorPool, engine: EngineConfig, mounts: list[str], capacity: int,
                  probes: list[ProbeResult], *, gds: GdsReadiness | None = None) -> Rendered:
    """Render one engine's config for a mounted pool (``gds``: this host's GPUDirect
    Storage, for an engine whose config depends on it; None: not checked)."""
    ctx = engine_context(pool, engine, mounts, capacity, probes, gds=gds)
    return render_kind(engine.kind, ctx)


def probe_from_json(data: dict[str, Any]) -> ProbeResult:
    """A :class:`ProbeResult` back from its recorded JSON (``dataclasses.asdict``)."""
    def failure(d: dict[str, Any] | None) -> StepFailure | None:
        return None if d is None else StepFailure(d["step"], d.get("errno"), d["error"])

    od, fa, dio = data["odirect"], data["fallocate"], data["dio_align"]
    return ProbeResult(
        path=data["path"], transport=data.get("transport"), started_at=data["started_at"],
        finished_at=data["finished_at"], odirect_ok=data["odirect_ok"],
        fallocate_ok=data["fallocate_ok"],
        odirect=ODirectResult(od["ok"], od["size_bytes"], od["alignment"],
                              failure(od.get("failure"))),
        fallocate=FallocateResult(fa["ok"], fa["requested_bytes"], fa.get("reserved_bytes"),
                                  fa.get("method"), failure(fa.get("failure"))),
        dio_align=DioAlign(dio.get("mem_align"), dio.get("offset_align"), dio.get("error")),
        device=data.get("device"), logical_block_size=data.get("logical_block_size"),
        total_bytes=data.get("total_bytes"), free_bytes=data.get("free_bytes"),
        errors=tuple(data.get("errors", ())))


@dataclass(frozen=True)
class AttachedRender:
    """One engine's config for an attached pool, as ``kvagent engines render`` shows it."""

    pool: str
    engine: str
    mounts: tuple[str, ...]
    directories: tuple[str, ...]
    capacity_bytes: int
    probes_from: str  # "record" (apply's probes) or "now"
    rendered: Rendered
    context: EngineContext


def render_attached(cfg: Config, pool_name: str, kind: str, *, probe_now: bool = False,
                    probe: Prober = probe_mount, gds: GdsProbe | None = None,
                    mountinfo: Path = MOUNTINFO) -> AttachedRender:
    """Render engine ``kind`` for the attached initiator pool ``pool_name``.

    UsageError (exit 2) for a pool or engine the config does not have;
    KvagentError (exit 1) when the pool is not attached or not mounted.
    Probes come from apply's record unless ``probe_now`` (or no usable record).
    """
    pools = {p.name: p for p in (cfg.initiator.pools if cfg.initiator else ())}
    pool = pools.get(pool_name)
    if pool is None:
        raise UsageError(f"unknown initiator pool {pool_name!r}; this host's config has "
                         f"{', '.join(sorted(pools)) or 'no initiator pools'}")
    engines = [e.kind for e in pool.engines]
    if kind not in engines:
        raise UsageError(f"engine {kind!r} is not configured for pool {pool_name!r} (it has "
                         f"{', '.join(engines) or 'no engines'})",
                         f"add {{kind: {kind}}} to the pool's engines and run kvagent apply")
    state_dir = Path(cfg.node.state_dir)
    record = InitiatorRecords.load(state_dir).get(pool_name)
    if record is None or not record.mounts:
        raise KvagentError(f"pool {pool_name!r} is not attached on this host",
                           "run kvagent apply (kvagent plan shows what it would do)")
    mounts = list(record.mounts)
    missing = [m for m in mounts if mounted_at(m, mountinfo) is None]
    if missing:
        raise KvagentError(f"pool {pool_name!r} is not mounted at {', '.join(missing)}",
                           "run kvagent apply to mount it again")
    dirs = [engine_dir(m, kind) for m in mounts]
    absent = [d for d in dirs if not os.path.isdir(d)]
    if absent:
        raise KvagentError(f"engine directory {', '.join(absent)} does not exist",
                           "run kvagent apply to prepare the engine's directories")
    probes, source = None, "now"
    if not probe_now:
        recorded = read_json(probes_path(state_dir, pool_name), None)
        if recorded is not None:
            loaded = [probe_from_json(p) for p in recorded]
            if [p.path for p in loaded] == mounts:
                probes, source = loaded, "record"
    if probes is None:
        transport = record.subsystems[0].address.transport if record.subsystems else None
        probes = [probe_bounded(probe, m, transport, cfg.node.sysfs) for m in mounts]
    caps = engine_capacities(sum(p.total_bytes or 0 for p in probes), pool.engines)
    engine = next(e for e in pool.engines if e.kind == kind)
    readiness = (gds or probe_gds)() if engine.checks_gds else None
    ctx = engine_context(pool, engine, mounts, caps[kind], probes, gds=readiness)
    rendered = render_kind(kind, ctx)
    return AttachedRender(pool_name, kind, tuple(mounts), tuple(dirs), caps[kind], source,
                          rendered, ctx)

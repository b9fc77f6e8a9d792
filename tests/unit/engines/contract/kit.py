"""The engine contract tests' kit: the pinned engines' files, kvagent's renders of a pool
(from an apply and from ``kvagent engines render``), and the engines' verdicts on them.

The pinned wheels (``pins.txt``) are unpacked by ``scripts/fetch-engine-wheels`` (run by
``scripts/setup``) into a cache outside the checkout. A checker
(``agent/engines/checks/check_<kind>.py``) runs under this venv's Python with the
wheel's files first on ``PYTHONPATH``, and, where an engine module needs GPU libraries
to import, a shim directory of this package (``shims/<kind>``) after them: each test
says which of the engine's code it runs and how.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.main import main
from agent.engines import EngineContext, Rendered
from agent.engines import render as render_kind
from agent.engines.handoff import engine_context, forget, hand_off
from agent.engines.verdict import EngineVerdict, judge
from agent.initiator.reconcile import InitiatorPass
from agent.result import RunResult
from agent.system.gds import GdsReadiness
from tests.unit.engines.fakequota import FakeQuota
from tests.unit.engines.helpers import probe as fake_probe
from tests.unit.initiator.attach_fakes import PREFIX, Export, FakeHost

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
PINS = HERE / "pins.txt"
NQN = f"{PREFIX}:store1:kv:gpu0"
UID, GID = os.getuid(), os.getgid()
GDS = GdsReadiness("/sys/module/nvidia_fs", "/dev/nvidia-fs0", "/usr/lib/libcufile.so.0")
GB = 1000**3


def pins() -> dict[str, str]:
    """Distribution name -> pinned version."""
    out = {}
    for line in PINS.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            dist, _, version = line.partition("==")
            out[dist] = version
    return out


def cache_dir() -> Path:
    """Where scripts/fetch-engine-wheels unpacked the wheels."""
    env = os.environ.get("KVAGENT_ENGINE_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "kvagent" / "engines"


def wheel_files(dist: str) -> Path:
    """The unpacked files of the pinned wheel of ``dist``; fetched on first use."""
    version = pins()[dist]
    path = cache_dir() / f"{dist}-{version}"
    if not (path / ".complete").is_file():
        proc = subprocess.run([str(ROOT / "scripts/fetch-engine-wheels")], capture_output=True,
                              text=True, check=False)
        if proc.returncode != 0 or not (path / ".complete").is_file():
            pytest.fail(f"the pinned wheel {dist}=={version} is not in {cache_dir()} and "
                        f"scripts/fetch-engine-wheels could not fetch it:\n{proc.stderr}")
    return path


def shim_dir(kind: str) -> Path | None:
    """This package's stand-ins for GPU libraries an engine's module imports (None: none)."""
    path = HERE / "shims" / kind
    return path if path.is_dir() else None


def judge_pinned(ctx: EngineContext, rendered: Rendered, dist: str) -> EngineVerdict:
    """The pinned ``dist``'s verdict on ``rendered``: its checker under this Python, the
    wheel's files (then the engine's shims, if any) on PYTHONPATH."""
    path = [str(wheel_files(dist))]
    shims = shim_dir(ctx.kind)
    if shims is not None:
        path.append(str(shims))
    return judge(ctx, rendered, sys.executable, pythonpath=path)


def judge_batch(cases: Sequence[tuple[EngineContext, Rendered]],
                *dists: str) -> list[EngineVerdict]:
    """The pinned ``dists``' verdicts on many renders of one engine, judged by one run of
    its checker (the engine's code imported once; ``checkkit.run``'s batch mode)."""
    import json

    from agent.engines.checks import script
    from agent.engines.verdict import payload

    kinds = {ctx.kind for ctx, _ in cases}
    assert len(kinds) == 1, kinds
    path = [str(wheel_files(dist)) for dist in dists]
    shims = shim_dir(next(iter(kinds)))
    if shims is not None:
        path.append(str(shims))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, str(script(next(iter(kinds))))],
                          input=json.dumps({"batch": [payload(c, r) for c, r in cases]}),
                          text=True, capture_output=True, env=env, timeout=900, check=False)
    found: dict[int, EngineVerdict] = {}
    for line in proc.stdout.splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("batch_index"), int):
            found[data["batch_index"]] = EngineVerdict(
                engine=next(iter(kinds)), verdict=data["verdict"],
                engine_version=data.get("engine_version"), method=data.get("method", ""),
                problems=tuple(data.get("problems", ())),
                messages=tuple(data.get("messages", ())), python=sys.executable)
    assert proc.returncode == 0 and sorted(found) == list(range(len(cases))), (
        proc.returncode, sorted(found), proc.stderr[-3000:])
    return [found[i] for i in range(len(cases))]


def assert_refused(verdict: EngineVerdict, *words: str) -> EngineVerdict:
    """The engine refused, and one of its problems names every one of ``words``."""
    assert verdict.verdict == "refused", (verdict.problems, verdict.messages)
    assert any(all(w in p for w in words) for p in verdict.problems), verdict.problems
    return verdict


# ------------------------------------------------------------------ renders of a pool
@dataclass
class AppliedPool:
    """A pool attached by a real apply pass over the fake GPU host (two namespaces)."""

    host: FakeHost
    result: RunResult
    state: Path
    mounts: list[str]
    quota: FakeQuota

    def files(self, kind: str) -> dict[str, str]:
        """What the apply wrote for engine ``kind`` (file name -> text)."""
        out = self.state / "engines/kv" / kind
        return {p.name: p.read_text() for p in sorted(out.iterdir())} if out.is_dir() else {}

    def context(self, kind: str) -> EngineContext:
        """The render context the apply used for ``kind`` (the same config and probes)."""
        cfg = self.host.config(self._initiator)
        pool = cfg.initiator.pools[0]
        engine = next(e for e in pool.engines if e.kind == kind)
        probes = [self.host.probe(m) for m in self.mounts]
        from agent.engines.dirs import engine_capacities

        caps = engine_capacities(sum(p.total_bytes or 0 for p in probes), pool.engines)
        return engine_context(pool, engine, self.mounts, caps[kind], probes,
                              gds=GDS if kind == "dynamo" else None)

    def rendered(self, kind: str) -> Rendered:
        """The apply's files for ``kind`` as a Rendered (with the subdirectories its render
        asks for), for a checker."""
        fresh = render_kind(kind, self.context(kind))
        assert dict(fresh.files) == self.files(kind), "apply wrote something else"
        return fresh

    def cli_render(self, kind: str) -> dict[str, str]:
        """``kvagent -o json engines render kv --engine KIND``'s files."""
        import json

        config = self.state.parent / "kvagent.yaml"
        config.write_text(self.host.config_text(self._initiator))
        res = CliRunner().invoke(main, ["-c", str(config), "-o", "json", "engines", "render",
                                        "kv", "--engine", kind])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["files"]

    def apply(self) -> RunResult:
        """One apply pass (attach, then the engines' hand-off) over the fake host."""
        cfg = self.host.config(self._initiator)
        result = RunResult(dry_run=False)
        passes = InitiatorPass(cfg, self.host.runner, result, sysfs=self.host.sysfs,
                               cli=self.host.cli, seams=self.host.seams())
        for name in passes.detach_removed():
            forget(cfg, name, result)
        for m in passes.attach_configured():
            hand_off(cfg, m.pool, m.mounts, m.transport, m.remounted, result,
                     probe=self.host.probe, quotas=self.quota, gds=lambda: GDS,
                     mountinfo=self.host.mountinfo)
        return result

    _initiator: str = ""


def apply_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engines: Sequence[str], *,
               sizes: Sequence[int] = (1000 * GB, 1000 * GB),
               quota: FakeQuota | None = None) -> AppliedPool:
    """Attach pool ``kv`` (one namespace per entry of ``sizes``, each mount's filesystem
    that many bytes) through a real apply pass over the fake GPU host, with ``engines``
    (YAML flow mappings without braces, e.g. ``"kind: vllm, cpu_cache: 8GiB"``) and the
    project quotas ``quota`` (default: a fresh fake)."""
    nsids = list(range(1, len(sizes) + 1))
    host = FakeHost(tmp_path, exports=[Export(NQN, nsids)])
    monkeypatch.setattr(os.path, "ismount", lambda p: os.fspath(p) in host.mounts())
    from agent.engines import handoff

    monkeypatch.setattr(handoff, "mounted_at",
                        lambda path, mountinfo=None: object() if path in host.mounts() else None)
    mounts = [str(tmp_path / "mnt/kv" / f"store1-ns{i}") for i in nsids]
    size_of = dict(zip(mounts, sizes, strict=True))

    def probe(path: str, transport: str | None = None, **_: object):
        return dataclasses.replace(fake_probe(path), transport="tcp",
                                   total_bytes=size_of[path], free_bytes=size_of[path])

    host.probe = probe  # type: ignore[method-assign]
    monkeypatch.setattr(handoff, "probe_mount", probe)
    eng = ", ".join(f"{{{e}, owner: '{UID}', group: '{GID}'}}" for e in engines)
    initiator = f"""initiator:
  device_wait: 5s
  pools:
    - name: kv
      target: {{transport: tcp, address: 10.0.0.1, subsystem: '{NQN}'}}
      mount: {tmp_path / 'mnt' / 'kv'}
      engines: [{eng}]
"""
    cfg = host.config(initiator)
    applied = AppliedPool(host, RunResult(dry_run=False), Path(cfg.node.state_dir), mounts,
                          quota or FakeQuota())
    applied._initiator = initiator
    applied.result = applied.apply()
    return applied

"""The whole agent as the host grows (guest side of ``scripts/bench-control-plane --scale``).

One VM with both roles, as ``--end-to-end`` (:mod:`bench_e2e`): file-backed pools of N
namespaces exported over NVMe/TCP on 127.0.0.1, A of them attached on the GPU side as raw
block devices. The sizes are taken in turn in the same boot, each a config that grows
the last (``64x16:16,640x16:160``: 64 pools attaching 16, then 640 attaching 160). At
each size:

  growth      the pass that brings the host from the last size to this one (the new
              pools exported, connected and found): wall, CPU, and wall per new pool
  floor       every file the converged pass reads, lists, stats or follows (traced),
              done once each by a minimal loop
  converged   3 rounds of (floor, converged pass): 0 configfs writes and no change,
              asserted; wall per part (storage side, GPU side), per namespace, and the
              ratio to the floor
  calls       Python function calls of one converged pass (cProfile), per namespace:
              flat across sizes when nothing in the pass grows faster than the host
  daemon      ``kvagent run`` started on the config: its RSS once its first pass is
              done, sampled for :data:`RSS_SECONDS`

A cProfile of the converged pass at the largest size goes to
``profile-scale-<size>.txt``. The VM runs under TCG: only ratios and shapes of curves
carry over.
"""

from __future__ import annotations

import cProfile
import io
import itertools
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bench_e2e
from bench_e2e import WORK, PhaseTimer, ReadTrace, config_text, cpu_now, get, replay

#: Seconds the daemon's RSS is sampled once its first pass is done.
RSS_SECONDS = 40
ROUNDS = 3


def parse(text: str) -> list[tuple[int, int, int]]:
    """``"64x16:16,640x16:160"`` -> ``[(64, 16, 16), (640, 16, 160)]``."""
    return [bench_e2e.parse(item) for item in filter(None, (s.strip() for s in text.split(",")))]


def drive_bytes(sizes: list[tuple[int, int, int]]) -> int:
    """The emulated drive the largest size needs: 4 MiB a namespace, with room for xfs."""
    most = max(p * n for p, n, _ in sizes)
    return (most * 4 * 2**20 * 5) // 4 + 2 * 2**30


def daemon_rss(path: Path) -> dict[str, float]:
    """``kvagent run`` on ``path``: seconds until its first pass is done, then its RSS
    (MiB) sampled every second for :data:`RSS_SECONDS`, and its peak (VmHWM)."""
    log = open(WORK / "agent-scale.log", "w")  # noqa: SIM115
    t0 = time.monotonic()
    agent = subprocess.Popen([*bench_e2e.AGENT, "-c", str(path), "run"], stdout=log,
                             stderr=subprocess.STDOUT)

    def status(field: str) -> float:
        for line in Path(f"/proc/{agent.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
        return 0.0

    try:
        while get("/healthz") != 200:
            if time.monotonic() - t0 > 3600 or agent.poll() is not None:
                print((WORK / "agent-scale.log").read_text()[-3000:])
                raise SystemExit("the agent's first pass did not finish")
            time.sleep(1)
        first = time.monotonic() - t0
        rss = []
        for _ in range(RSS_SECONDS):
            rss.append(status("VmRSS"))
            time.sleep(1)
        return {"first_pass_s": first, "rss_mib": statistics.median(rss),
                "rss_max_mib": max(rss), "hwm_mib": status("VmHWM")}
    finally:
        agent.terminate()
        try:
            agent.wait(timeout=300)
        except subprocess.TimeoutExpired:
            agent.kill()
        log.close()


def run(sizes: list[tuple[int, int, int]], out: Path, drive: str) -> tuple[list[dict], str]:
    """Every size in turn, in one boot; the rows and the text table."""
    from agent.config import parse_config
    from agent.log import configure_logging
    from agent.reconcile import run_pass

    configure_logging(0)
    for mod in ("nvmet", "nvmet-tcp", "nvme-tcp", "nvme-fabrics"):
        subprocess.run(["modprobe", mod], check=True, timeout=120)
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "files").mkdir(exist_ok=True)
    subprocess.run(["mkfs.xfs", "-q", "-f", drive], check=True, timeout=600)
    subprocess.run(["mount", drive, str(WORK / "files")], check=True, timeout=120)
    hostnqn = Path("/etc/nvme/hostnqn").read_text().strip()
    path = WORK / "kvagent.yaml"
    rows: list[dict[str, Any]] = []
    before = (0, 0)
    for pools, per, attach in sizes:
        label = f"{pools}x{per}:{attach}"
        print(f"[{time.strftime('%X')}] scale {label}", flush=True)
        path.write_text(config_text(pools, per, attach, hostnqn))
        cfg = parse_config(path.read_text(), str(path))
        row: dict[str, Any] = {"size": label, "pools": pools, "namespaces": pools * per,
                               "attached_pools": attach, "attached_namespaces": attach * per}
        c0, t0 = cpu_now(), time.perf_counter()
        res = run_pass(cfg, dry_run=False)
        wall, cpu = time.perf_counter() - t0, cpu_now() - c0
        if not res.ok:
            raise SystemExit(f"the growth pass to {label} failed: {res.errors[:3]}")
        row["growth"] = {"wall_s": wall, "cpu_s": cpu, "new_pools": pools - before[0],
                         "new_attached": attach - before[1]}
        before = (pools, attach)
        print(f"  growth pass {wall:.1f} s (CPU {cpu:.1f} s)", flush=True)
        with ReadTrace() as trace:
            run_pass(cfg, dry_run=False)
        row["floor_ops"] = trace.counts()
        replay(trace.ops)
        walls, floors, laps = [], [], []
        for _ in range(ROUNDS):
            floors.append(bench_e2e.timed(lambda: replay(trace.ops)))
            with PhaseTimer() as timer:
                t0 = time.perf_counter()
                res = run_pass(cfg, dry_run=False)
                walls.append(time.perf_counter() - t0)
            laps.append(timer.seconds)
            if not res.ok or res.changed or res.configfs_writes:
                raise SystemExit(f"a converged pass at {label} changed something: "
                                 f"{res.errors[:3]} {list(res.actions)[:5]}")
        row["converged_s"], row["floor_s"] = statistics.median(walls), statistics.median(floors)
        row["converged_floor"] = statistics.median(w / f for w, f in zip(walls, floors,
                                                                          strict=True))
        row["phases_s"] = {k: statistics.median(p.get(k, 0.0) for p in laps) for k in laps[0]}
        prof = cProfile.Profile()
        prof.enable()
        run_pass(cfg, dry_run=False)
        prof.disable()
        stats = pstats.Stats(prof)
        row["calls"] = stats.total_calls  # type: ignore[attr-defined]
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(40)
        (out / f"profile-scale-{pools}x{per}-{attach}.txt").write_text(buf.getvalue())
        print(f"  converged {walls} s, floors {floors}, calls {row['calls']}", flush=True)
        row["daemon"] = daemon_rss(path)
        print(f"  daemon {row['daemon']}", flush=True)
        rows.append(row)
    return rows, table(rows)


def both(row: dict[str, Any]) -> int:
    """Namespaces of both roles at a size: exported, and attached on the GPU side."""
    return row["namespaces"] + row["attached_namespaces"]


def table(rows: list[dict[str, Any]]) -> str:
    """One column per size: seconds, per-namespace costs, ratios, RSS."""
    lines = ["the whole agent as the host grows (both roles on one TCG VM: compare ratios "
             "and per-namespace columns)", ""]

    def line(label: str, values: list[str]) -> None:
        lines.append(f"{label:44}" + "".join(f"{v:>16}" for v in values))

    first = rows[0]
    line("size (pools x namespaces : attached)", [r["size"] for r in rows])
    line("namespaces exported / attached",
         [f"{r['namespaces']}/{r['attached_namespaces']}" for r in rows])
    line("growth pass s (new pools, attached)", [
        f"{r['growth']['wall_s']:.0f} ({r['growth']['new_pools']},"
        f"{r['growth']['new_attached']})" for r in rows])
    line("converged pass s (median of 3)", [f"{r['converged_s']:.2f}" for r in rows])
    for part in first["phases_s"]:
        line(f"  {part} s", [f"{r['phases_s'].get(part, 0.0):.2f}" for r in rows])
    line("read floor s", [f"{r['floor_s']:.2f}" for r in rows])
    line("converged / floor", [f"{r['converged_floor']:.2f}" for r in rows])
    line("converged ms per 1000 namespaces", [
        f"{1e6 * r['converged_s'] / both(r):.0f}" for r in rows])
    line("Python calls per namespace (cProfile)", [f"{r['calls'] / both(r):.0f}" for r in rows])
    line("daemon: first pass s", [f"{r['daemon']['first_pass_s']:.0f}" for r in rows])
    line("daemon: RSS MiB (median; peak)", [
        f"{r['daemon']['rss_mib']:.1f}; {r['daemon']['hwm_mib']:.1f}" for r in rows])
    line("daemon: RSS KiB per namespace added", ["-"] + [
        f"{1024 * (b['daemon']['rss_mib'] - a['daemon']['rss_mib']) / (both(b) - both(a)):.2f}"
        for a, b in itertools.pairwise(rows)])
    line("RSS / first size's (namespaces / first's)", [
        f"{r['daemon']['rss_mib'] / first['daemon']['rss_mib']:.2f} "
        f"({both(r) / both(first):.1f})" for r in rows])
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit("run through scripts/bench-control-plane --scale")

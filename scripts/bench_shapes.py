"""The converged pass at scale, on the nvmet library alone (guest side of
``scripts/bench-control-plane --shapes``).

For each shape ``S x N`` (S subsystems of N namespaces each, on null_blk devices,
one allowed host, one NVMe/TCP port on 127.0.0.1 linking every subsystem) it
measures, in one VM boot:

  cold        read + features + plan + apply from an empty nvmet tree
  converged   the same pass again (median of several): 0 configfs writes, asserted;
              with the planner's read (``nvmet.read(fs, spec=nvmet.read_spec(...))``)
              and with the full read (``nvmet.read(fs)``) kvagent used before
  floor       a minimal loop that opens and reads, once, exactly the attribute files
              the planner needs and lists the link directories (allowed_hosts, the
              port's subsystems); no parsing, no model, no plan
  rebuild     the same config restored the clear-and-rebuild way (nvmetcli restore:
              every object removed, then everything created again)

and a cProfile of one converged pass in each read mode (top functions, and the time
spent inside file-system calls against the rest). It prints ratios against the
baselines measured in the same run; the VM runs under TCG, so only ratios carry over.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nvmet
from nvmet.ids import namespace_nguid, namespace_uuid
from nvmet.model import Host, Namespace, Port, Subsystem, Tree

PREFIX = "nqn.2026-11.io.kvagent.bench"
HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:4b656e63-6800-4000-8000-000000000002"
PORT_ID = 1
NVMET = "/sys/kernel/config/nvmet"
#: Per-namespace files the planner compares or needs for ordering (enable, ana_grpid).
#: kvagent's desired namespaces mention device_path, the ids and enable; ana_grpid is
#: neither mentioned nor needed (the issue's first floor counted it: 5 files).
NS_FILES = ("device_path", "device_uuid", "device_nguid", "enable")
ADDR = {"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "4420"}
#: Goals of issue 16 (ratios, same run).
GOALS = {"converged/cold": 0.3, "converged/rebuild": 1 / 20, "converged/floor": 1.5}
CONVERGED_RUNS = 5
FLOOR_RUNS = 5


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"1x1024,64x16"`` -> ``[(1, 1024), (64, 16)]``."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        subs, _, per = item.partition("x")
        out.append((int(subs), int(per)))
    return out


def nqn(i: int) -> str:
    return f"{PREFIX}:shape:s{i:02d}"


def desired(subs: int, per: int, *, created: bool) -> Tree:
    """The shape as kvagent describes a pool: model and serial only when creating (the
    kernel fixes them once a host has identified the controller), allow_any_host always,
    every namespace's device, ids and enable."""
    subsystems = []
    for i in range(subs):
        name = nqn(i)
        attrs: dict[str, Any] = {"allow_any_host": False}
        if created:
            attrs |= {"model": "kvagent-bench", "serial": f"kvbench{i:04d}"}
        subsystems.append(Subsystem(name, attrs=attrs, allowed_hosts={HOSTNQN}, namespaces=[
            Namespace(n, device_path=f"/dev/nullb{i * per + n - 1}",
                      device_uuid=namespace_uuid(name, n), device_nguid=namespace_nguid(name, n),
                      enable=True)
            for n in range(1, per + 1)]))
    return Tree(hosts=[Host(HOSTNQN)], subsystems=subsystems,
                ports=[Port(PORT_ID, addr=ADDR, subsystems={s.nqn for s in subsystems})])


def floor_plan(want: Tree) -> tuple[list[str], list[str]]:
    """Absolute paths of the attribute files the planner needs, and of the link
    directories it lists, for a converged ``want`` (its names are the live names)."""
    files, link_dirs = [], []
    for name, sub in want.subsystems.items():
        base = f"{NVMET}/subsystems/{name}"
        files += [f"{base}/attr_{a}" for a in sub.attrs]
        link_dirs.append(f"{base}/allowed_hosts")
        for nsid in sub.namespaces:
            files += [f"{base}/namespaces/{nsid}/{f}" for f in NS_FILES]
    for pid, port in want.ports.items():
        files += [f"{NVMET}/ports/{pid}/addr_{a}" for a in port.addr]
        link_dirs.append(f"{NVMET}/ports/{pid}/subsystems")
    return files, link_dirs


def read_floor(files: list[str], link_dirs: list[str]) -> int:
    """One open + read + close per file, one listdir per link directory."""
    n = 0
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        n += len(os.read(fd, 4096))
        os.close(fd)
    for d in link_dirs:
        n += len(os.listdir(d))
    return n


def read_floor_dirfd(files: list[str], link_dirs: list[str]) -> int:
    """The floor with one directory fd per object and openat() of each file in it
    (shorter path walks, two more calls per directory)."""
    by_dir: dict[str, list[str]] = {}
    for path in files:
        d, _, name = path.rpartition("/")
        by_dir.setdefault(d, []).append(name)
    n = 0
    for d, names in by_dir.items():
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for name in names:
                fd = os.open(name, os.O_RDONLY, dir_fd=dfd)
                n += len(os.read(fd, 4096))
                os.close(fd)
        finally:
            os.close(dfd)
    for d in link_dirs:
        n += len(os.listdir(d))
    return n


def read_floor_threads(files: list[str], link_dirs: list[str], workers: int) -> int:
    """The floor split over ``workers`` threads (does parallel reading pay here?)."""
    chunks = [files[i::workers] for i in range(workers)]
    dchunks = [link_dirs[i::workers] for i in range(workers)]
    total = [0] * workers

    def work(i: int) -> None:
        total[i] = read_floor(chunks[i], dchunks[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(total)


def timed(fn: Callable[[], Any], runs: int) -> tuple[float, list[float]]:
    """Median and all timings of ``runs`` calls."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def has_spec_read() -> bool:
    return hasattr(nvmet, "read_spec")


def one_pass(fs: nvmet.RealConfigFS, want: Tree, scope: nvmet.Scope, mode: str
             ) -> nvmet.ApplyResult:
    """kvagent's pass on the library: read, features, plan, apply."""
    feats = nvmet.features(fs)
    spec = nvmet.read_spec(want, feats) if mode == "spec" else None
    live = nvmet.read(fs, spec=spec) if spec is not None else nvmet.read(fs)
    result = nvmet.apply(nvmet.plan(want, live, scope, feats), fs)
    if not result.ok:
        raise SystemExit(f"apply failed: {[(str(a), str(e)) for a, e in result.failed][:3]}")
    return result


def converged(fs: nvmet.RealConfigFS, want: Tree, scope: nvmet.Scope, mode: str) -> None:
    before = fs.writes
    result = one_pass(fs, want, scope, mode)
    if result.done or fs.writes != before:
        raise SystemExit(f"a converged pass ({mode} read) wrote to configfs: "
                         f"{fs.writes - before} writes, {[str(a) for a in result.done][:3]}")


#: cProfile rows that are file-system calls (the kernel's share, plus the call itself).
SYSCALLS = ("posix.open", "posix.read", "posix.close", "posix.scandir", "posix.lstat",
            "posix.stat", "posix.listdir", "posix.readlink", "'stat' of 'posix.DirEntry'",
            "'is_symlink' of 'posix.DirEntry'", "'is_dir' of 'posix.DirEntry'",
            "'__exit__' of 'posix.ScandirIterator'", "'__next__' of 'posix.ScandirIterator'")


def profile(fn: Callable[[], Any]) -> dict[str, Any]:
    """cProfile of one call: total, time in file-system calls (by call), top functions."""
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    st = pstats.Stats(prof)
    total = 0.0
    calls: dict[str, dict[str, float]] = {}
    for (filename, _line, func), (_cc, ncalls, tottime, _ct, _callers) in \
            st.stats.items():  # type: ignore[attr-defined]
        total += tottime
        label = func if filename == "~" else f"{Path(filename).name}:{func}"
        for key in SYSCALLS:
            if key in label:
                calls[key] = {"calls": ncalls, "s": round(tottime, 4)}
    fs_time = sum(v["s"] for v in calls.values())
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
    return {"total_s": round(total, 4), "fs_calls_s": round(fs_time, 4),
            "python_s": round(total - fs_time, 4), "fs_calls": calls,
            "top": out.getvalue()}


def null_blk(count: int) -> None:
    """``count`` null_blk devices /dev/nullb0.. (not memory backed: no data is kept)."""
    subprocess.run(["modprobe", "null_blk", f"nr_devices={count}", "gb=1"], check=True,
                   timeout=600)
    for _ in range(600):
        if os.path.exists(f"/dev/nullb{count - 1}"):
            return
        time.sleep(0.1)
    raise SystemExit(f"/dev/nullb{count - 1} did not appear")


def clear(fs: nvmet.RealConfigFS) -> nvmet.ApplyResult:
    return nvmet.apply(nvmet.plan(Tree(), nvmet.read(fs), nvmet.Scope.everything()), fs)


def bench_shape(fs: nvmet.RealConfigFS, subs: int, per: int, out: Path) -> dict[str, Any]:
    """Every figure for one shape; leaves nvmet empty."""
    scope = nvmet.Scope.owned(subsystem_prefix=PREFIX, port_ids=[PORT_ID], hosts=[HOSTNQN])
    cold_want, want = desired(subs, per, created=True), desired(subs, per, created=False)
    mode = "spec" if has_spec_read() else "full"
    shape = f"{subs}x{per}"
    row: dict[str, Any] = {"shape": shape, "subsystems": subs, "namespaces": subs * per,
                           "read_mode": mode}
    w0 = fs.writes
    t0 = time.perf_counter()
    one_pass(fs, cold_want, scope, mode)
    row["cold_s"] = time.perf_counter() - t0
    row["cold_writes"] = fs.writes - w0
    converged(fs, want, scope, mode)  # warm-up (first-use costs)
    row["converged_s"], row["converged_runs"] = timed(
        lambda: converged(fs, want, scope, mode), CONVERGED_RUNS)
    row["converged_writes"] = 0  # asserted by converged()
    row["converged_full_read_s"], _ = timed(
        lambda: converged(fs, want, scope, "full"), CONVERGED_RUNS)
    t0 = time.perf_counter()
    nvmet.read(fs)
    row["full_read_s"] = time.perf_counter() - t0
    if mode == "spec":
        spec = nvmet.read_spec(want, nvmet.features(fs))
        t0 = time.perf_counter()
        nvmet.read(fs, spec=spec)
        row["spec_read_s"] = time.perf_counter() - t0
    files, link_dirs = floor_plan(want)
    read_floor(files, link_dirs)  # warm-up
    row["floor_files"], row["floor_link_dirs"] = len(files), len(link_dirs)
    row["floor_s"], row["floor_runs"] = timed(lambda: read_floor(files, link_dirs), FLOOR_RUNS)
    row["floor_dirfd_s"], _ = timed(lambda: read_floor_dirfd(files, link_dirs), FLOOR_RUNS)
    row["floor_2_threads_s"], _ = timed(lambda: read_floor_threads(files, link_dirs, 2),
                                         FLOOR_RUNS)
    row["profile"] = {m: profile(lambda m=m: converged(fs, want, scope, m))
                      for m in sorted({mode, "full"})}
    for m, p in row["profile"].items():
        (out / f"profile-{shape}-{m}.txt").write_text(p.pop("top"))
    # The clear-and-rebuild restore of the same config (nvmetcli restore style).
    w0 = fs.writes
    t0 = time.perf_counter()
    cleared = clear(fs)
    rebuilt = nvmet.apply(nvmet.plan(cold_want, nvmet.read(fs), scope, nvmet.features(fs)), fs)
    row["rebuild_s"] = time.perf_counter() - t0
    row["rebuild_writes"] = fs.writes - w0
    if not (cleared.ok and rebuilt.ok):
        raise SystemExit("the clear-and-rebuild baseline failed")
    converged(fs, want, scope, mode)  # the rebuild restored the same config
    row["ratios"] = {
        "converged/cold": row["converged_s"] / row["cold_s"],
        "converged/rebuild": row["converged_s"] / row["rebuild_s"],
        "converged/floor": row["converged_s"] / row["floor_s"],
        "full-read converged/cold": row["converged_full_read_s"] / row["cold_s"],
        "full-read converged/rebuild": row["converged_full_read_s"] / row["rebuild_s"],
        "full-read converged/floor": row["converged_full_read_s"] / row["floor_s"],
        "floor 2 threads/floor": row["floor_2_threads_s"] / row["floor_s"],
        "floor dir fd/floor": row["floor_dirfd_s"] / row["floor_s"],
    }
    if not clear(fs).ok:
        raise SystemExit("teardown failed")
    return row


def run(shapes: list[tuple[int, int]], out: Path) -> tuple[list[dict[str, Any]], str]:
    """Every shape in turn; returns the rows and the text table."""
    subprocess.run(["modprobe", "nvmet"], check=True, timeout=120)
    subprocess.run(["modprobe", "nvmet-tcp"], check=True, timeout=120)
    t0 = time.perf_counter()
    null_blk(max(s * n for s, n in shapes))
    print(f"null_blk devices up in {time.perf_counter() - t0:.1f}s", flush=True)
    fs = nvmet.RealConfigFS(NVMET)
    if not nvmet.read(fs).is_empty():
        raise SystemExit("nvmet is not empty; the shapes bench owns the whole tree")
    rows = []
    for subs, per in shapes:
        row = bench_shape(fs, subs, per, out)
        print({k: v for k, v in row.items() if k != "profile"}, flush=True)
        rows.append(row)
    return rows, table(rows)


def table(rows: list[dict[str, Any]]) -> str:
    """Both shapes side by side: seconds, then the ratios against the issue's goals."""
    cols = [r["shape"] for r in rows]
    lines = ["converged pass at scale (nvmet library, null_blk, TCG VM: compare ratios)", "",
             f"{'':34}" + "".join(f"{c:>14}" for c in cols)]

    def line(label: str, values: list[str]) -> None:
        lines.append(f"{label:34}" + "".join(f"{v:>14}" for v in values))

    line("namespaces", [str(r["namespaces"]) for r in rows])
    line("cold apply s (writes)", [f"{r['cold_s']:.2f} ({r['cold_writes']})" for r in rows])
    line("clear-and-rebuild s (writes)",
         [f"{r['rebuild_s']:.2f} ({r['rebuild_writes']})" for r in rows])
    line("read floor s (files+dirs)",
         [f"{r['floor_s']:.3f} ({r['floor_files']}+{r['floor_link_dirs']})" for r in rows])
    line(f"converged s, {rows[0]['read_mode']} read (0 writes)",
         [f"{r['converged_s']:.3f}" for r in rows])
    line("converged s, full read", [f"{r['converged_full_read_s']:.3f}" for r in rows])
    lines.append("")
    for key, goal in GOALS.items():
        cells = []
        for r in rows:
            v = r["ratios"][key]
            cells.append(f"{v:.3f} {'ok' if v <= goal else 'MISS'}")
        line(f"{key} (goal <= {goal:.3g})", cells)
    for key in ("full-read converged/cold", "full-read converged/rebuild",
                "full-read converged/floor", "floor 2 threads/floor", "floor dir fd/floor"):
        line(key, [f"{r['ratios'][key]:.3f}" for r in rows])
    lines.append("")
    for r in rows:
        for m, p in r["profile"].items():
            lines.append(f"profile {r['shape']} {m} read: {p['total_s']:.3f}s in cProfile, "
                         f"{p['fs_calls_s']:.3f}s in file-system calls, "
                         f"{p['python_s']:.3f}s Python; calls: "
                         + ", ".join(f"{k} {v['calls']}" for k, v in p["fs_calls"].items()))
    return "\n".join(lines)

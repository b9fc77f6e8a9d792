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
#: Rounds of (cold apply or clear-and-rebuild, then PAIRS of (read floor, converged pass)),
#: and pairs of (floor, converged pass with the full read).
ROUNDS = 4
PAIRS = 2
FULL_ROUNDS = 2
#: Files the batched-close floor keeps open at once (its fds are closed with close_range).
CLOSE_BATCH = 64
#: The curve (``--shapes-curve``): per shape one cold apply, one clear-and-rebuild, 4
#: pairs of (floor, converged pass), one converged pass with the full read, the
#: planner's read profiled; no floor variants (the figures a curve needs, in less time).
CURVE = False


def curve() -> None:
    """Bench the shapes as a curve (:data:`CURVE`)."""
    global CURVE, ROUNDS, PAIRS, FULL_ROUNDS
    CURVE, ROUNDS, PAIRS, FULL_ROUNDS = True, 2, 4, 1


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


def read_floor_batched(files: list[str], link_dirs: list[str]) -> int:
    """The floor with the closes batched: open and read up to :data:`CLOSE_BATCH` files,
    then one ``close_range`` per run of consecutive fds (``os.closerange``)."""
    n = 0
    for i in range(0, len(files), CLOSE_BATCH):
        fds = []
        for path in files[i:i + CLOSE_BATCH]:
            fd = os.open(path, os.O_RDONLY)
            fds.append(fd)
            n += len(os.read(fd, 4096))
        close_fds(fds)
    for d in link_dirs:
        n += len(os.listdir(d))
    return n


def close_fds(fds: list[int]) -> None:
    """Close ``fds`` (ascending), one ``close_range`` per run of consecutive numbers."""
    start = prev = fds[0]
    for fd in fds[1:]:
        if fd != prev + 1:
            os.closerange(start, prev + 1)
            start = fd
        prev = fd
    os.closerange(start, prev + 1)


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


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def has_spec_read() -> bool:
    return hasattr(nvmet, "read_spec")


def one_pass(fs: nvmet.RealConfigFS, want: Tree, scope: nvmet.Scope, mode: str
             ) -> dict[str, float | int]:
    """kvagent's pass on the library: features, read, plan, apply; seconds per phase,
    CPU seconds of the whole pass, configfs writes."""
    w0, c0 = fs.writes, time.process_time()
    t0 = time.perf_counter()
    feats = nvmet.features(fs)
    t1 = time.perf_counter()
    spec = nvmet.read_spec(want, feats) if mode == "spec" else None
    live = nvmet.read(fs, spec=spec) if spec is not None else nvmet.read(fs)
    t2 = time.perf_counter()
    actions = nvmet.plan(want, live, scope, feats)
    t3 = time.perf_counter()
    result = nvmet.apply(actions, fs)
    t4 = time.perf_counter()
    if not result.ok:
        raise SystemExit(f"apply failed: {[(str(a), str(e)) for a, e in result.failed][:3]}")
    return {"total_s": t4 - t0, "features_s": t1 - t0, "read_s": t2 - t1, "plan_s": t3 - t2,
            "apply_s": t4 - t3, "cpu_s": time.process_time() - c0, "actions": len(actions),
            "writes": fs.writes - w0}


def converged(fs: nvmet.RealConfigFS, want: Tree, scope: nvmet.Scope, mode: str
              ) -> dict[str, float | int]:
    """One converged pass; exits when it planned anything or wrote to configfs."""
    m = one_pass(fs, want, scope, mode)
    if m["actions"] or m["writes"]:
        raise SystemExit(f"a converged pass ({mode} read) planned {m['actions']} actions and "
                         f"wrote {m['writes']} times to configfs")
    return m


def medians(runs: list[dict[str, float | int]]) -> dict[str, float]:
    return {k: statistics.median(float(r[k]) for r in runs) for k in runs[0]}


#: cProfile rows that are file-system calls (the kernel's share, plus the call itself).
SYSCALLS = ("posix.open", "posix.read", "posix.close", "posix.closerange", "posix.scandir",
            "posix.lstat",
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


def _rss_kib() -> int:
    """This process's resident set (KiB): the bench holds each shape's trees, as the
    agent would."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def null_blk(count: int) -> None:
    """``count`` null_blk devices /dev/nullb0.. (not memory backed: no data is kept)."""
    subprocess.run(["modprobe", "null_blk", f"nr_devices={count}", "gb=1"], check=True,
                   timeout=600)
    for _ in range(6000):  # (10,240 devices take minutes under TCG)
        if os.path.exists(f"/dev/nullb{count - 1}"):
            return
        time.sleep(0.1)
    raise SystemExit(f"/dev/nullb{count - 1} did not appear")


def clear(fs: nvmet.RealConfigFS) -> nvmet.ApplyResult:
    return nvmet.apply(nvmet.plan(Tree(), nvmet.read(fs), nvmet.Scope.everything()), fs)


def bench_shape(fs: nvmet.RealConfigFS, subs: int, per: int, out: Path, *,
                teardown: bool = True) -> dict[str, Any]:
    """Every figure for one shape; leaves nvmet empty (with ``teardown``).

    The VM's speed changes with the host's load, so every ratio comes from figures taken
    close together, and the result is the median over rounds. A round is: a cold apply
    (from an empty tree; after the first round, the create phase of a clear-and-rebuild
    of the same config), one converged pass recorded apart (the kernel may still be busy
    with what the apply set off), then :data:`PAIRS` pairs of (read floor, converged
    pass). Per round: converged/cold and converged/rebuild use the round's median
    converged pass; converged/floor is the median of every pair's ratio.
    """
    scope = nvmet.Scope.owned(subsystem_prefix=PREFIX, port_ids=[PORT_ID], hosts=[HOSTNQN])
    cold_want, want = desired(subs, per, created=True), desired(subs, per, created=False)
    mode = "spec" if has_spec_read() else "full"
    shape = f"{subs}x{per}"
    row: dict[str, Any] = {"shape": shape, "subsystems": subs, "namespaces": subs * per,
                           "read_mode": mode}
    files, link_dirs = floor_plan(want)
    row["floor_files"], row["floor_link_dirs"] = len(files), len(link_dirs)
    rounds: list[dict[str, Any]] = []
    for i in range(ROUNDS):
        rnd: dict[str, Any] = {}
        t0, w0 = time.perf_counter(), fs.writes
        # after the first round: the clear-and-rebuild restore of the same config
        # (nvmetcli restore style)
        if i and not clear(fs).ok:
            raise SystemExit("the clear-and-rebuild baseline failed to clear")
        rnd["cold"] = one_pass(fs, cold_want, scope, mode)
        if i:
            rnd["rebuild_s"] = time.perf_counter() - t0
            rnd["rebuild_writes"] = fs.writes - w0
        rnd["first_converged"] = converged(fs, want, scope, mode)
        if i == 0:
            read_floor(files, link_dirs)  # first-use costs of the floor's loop
        rnd["pairs"] = []
        for _ in range(PAIRS):
            floor = timed(lambda: read_floor(files, link_dirs))
            rnd["pairs"].append({"floor_s": floor, **converged(fs, want, scope, mode)})
        rnd["converged_s"] = statistics.median(p["total_s"] for p in rnd["pairs"])
        rounds.append(rnd)
        print(f"  {shape} round {i + 1}: cold {rnd['cold']['total_s']:.2f}s"
              + (f", rebuild {rnd['rebuild_s']:.2f}s" if i else "")
              + f", converged {rnd['converged_s']:.3f}s, floor "
              f"{statistics.median(p['floor_s'] for p in rnd['pairs']):.3f}s", flush=True)
    row["rounds"] = rounds
    pairs = [p for r in rounds for p in r["pairs"]]
    row["converged"] = medians([{k: v for k, v in p.items() if k != "floor_s"} for p in pairs])
    row["floor_s"] = statistics.median(p["floor_s"] for p in pairs)
    row["cold"] = medians([r["cold"] for r in rounds])
    row["cold_s"] = row["cold"]["total_s"]
    row["cold_writes"] = rounds[0]["cold"]["writes"]
    rebuilds = rounds[1:]
    row["rebuild_s"] = statistics.median(r["rebuild_s"] for r in rebuilds)
    row["rebuild_writes"] = rebuilds[0]["rebuild_writes"]
    row["after_apply"] = [r["first_converged"]["total_s"] for r in rounds]
    full = []
    for _ in range(FULL_ROUNDS if mode != "full" else 0):
        floor = timed(lambda: read_floor(files, link_dirs))
        full.append({"floor_s": floor, **converged(fs, want, scope, "full")})
    full = full or pairs
    row["full_rounds"] = full
    row["converged_full_read"] = medians([{k: v for k, v in r.items() if k != "floor_s"}
                                          for r in full])
    variants = {}
    for name, fn in () if CURVE else (
            ("dir fd", lambda: read_floor_dirfd(files, link_dirs)),
            ("batched close", lambda: read_floor_batched(files, link_dirs)),
            ("2 threads", lambda: read_floor_threads(files, link_dirs, 2))):
        ratios = []
        for _ in range(3):
            floor = timed(lambda: read_floor(files, link_dirs))
            ratios.append(timed(fn) / floor)
        variants[name] = statistics.median(ratios)
    row["floor_variants"] = variants
    row["profile"] = {m: profile(lambda m=m: converged(fs, want, scope, m))
                      for m in sorted({mode} if CURVE else {mode, "full"})}
    row["memory_kib"] = _rss_kib()
    for m, p in row["profile"].items():
        (out / f"profile-{shape}-{m}.txt").write_text(p.pop("top"))

    def spread(values: list[float]) -> dict[str, float]:
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    row["ratios"] = {
        "converged/cold": spread([r["converged_s"] / r["cold"]["total_s"] for r in rounds]),
        "converged/rebuild": spread([r["converged_s"] / r["rebuild_s"] for r in rebuilds]),
        "converged/floor": spread([p["total_s"] / p["floor_s"] for p in pairs]),
        "full-read converged/cold": spread([row["converged_full_read"]["total_s"]
                                            / row["cold_s"]]),
        "full-read converged/rebuild": spread([row["converged_full_read"]["total_s"]
                                               / row["rebuild_s"]]),
        "full-read converged/floor": spread([r["total_s"] / r["floor_s"] for r in full]),
    }
    if teardown and not clear(fs).ok:
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
    for i, (subs, per) in enumerate(shapes):
        row = bench_shape(fs, subs, per, out, teardown=i < len(shapes) - 1)
        print(f"{row['shape']}: cold {row['cold_s']:.2f}s, converged "
              f"{row['converged']['total_s']:.3f}s, floor {row['floor_s']:.3f}s, rebuild "
              f"{row['rebuild_s']:.2f}s", flush=True)
        rows.append(row)
    return rows, table(rows)


def table(rows: list[dict[str, Any]]) -> str:
    """Both shapes side by side: seconds, then the ratios against the issue's goals."""
    lines = ["converged pass at scale (nvmet library, null_blk, TCG VM: compare ratios)",
             f"{ROUNDS} rounds (cold apply or clear-and-rebuild, then {PAIRS} pairs of floor "
             "and converged pass); ratios: median over rounds [min-max]", "",
             f"{'':38}" + "".join(f"{r['shape']:>26}" for r in rows)]

    def line(label: str, values: list[str]) -> None:
        lines.append(f"{label:38}" + "".join(f"{v:>26}" for v in values))

    line("namespaces", [str(r["namespaces"]) for r in rows])
    line(f"cold apply s, median of {ROUNDS} (writes)",
         [f"{r['cold_s']:.2f} ({r['cold_writes']})" for r in rows])
    line(f"clear-and-rebuild s, median of {ROUNDS - 1} (writes)",
         [f"{r['rebuild_s']:.2f} ({r['rebuild_writes']})" for r in rows])
    line("read floor s (files+link dirs)",
         [f"{r['floor_s']:.3f} ({r['floor_files']}+{r['floor_link_dirs']})" for r in rows])
    for key, label in (("converged", f"converged, {rows[0]['read_mode']} read"),
                       ("converged_full_read", "converged, full read")):
        line(f"{label} s (0 writes)", [f"{r[key]['total_s']:.3f}" for r in rows])
        line("  features / read / plan s", [
            f"{r[key]['features_s']:.2f}/{r[key]['read_s']:.2f}/{r[key]['plan_s']:.2f}"
            for r in rows])
        line("  CPU s", [f"{r[key]['cpu_s']:.3f}" for r in rows])
    line("converged right after each apply s", [
        "/".join(f"{s:.2f}" for s in r["after_apply"]) for r in rows])
    lines.append("")

    def ratio(v: dict[str, float]) -> str:
        return f"{v['median']:.3f} [{v['min']:.3f}-{v['max']:.3f}]"

    for key, goal in GOALS.items():
        line(f"{key} (goal <= {goal:.3g})",
             [f"{ratio(r['ratios'][key])} {'ok' if r['ratios'][key]['median'] <= goal else 'MISS'}"
              for r in rows])
    for key in ("full-read converged/cold", "full-read converged/rebuild",
                "full-read converged/floor"):
        if all(key in r["ratios"] for r in rows):
            line(key, [f"{r['ratios'][key]['median']:.3f}" for r in rows])
    for name in rows[0]["floor_variants"]:
        line(f"floor with {name} / floor", [f"{r['floor_variants'][name]:.3f}" for r in rows])
    line("converged ms per 1000 namespaces",
         [f"{1e6 * r['converged']['total_s'] / r['namespaces']:.0f}" for r in rows])
    line("floor ms per 1000 namespaces",
         [f"{1e6 * r['floor_s'] / r['namespaces']:.0f}" for r in rows])
    line("bench process RSS MiB", [f"{r['memory_kib'] / 1024:.1f}" for r in rows])
    lines.append("")
    for r in rows:
        for m, p in r["profile"].items():
            lines.append(f"profile {r['shape']} {m} read: {p['total_s']:.3f}s in cProfile, "
                         f"{p['fs_calls_s']:.3f}s in file-system calls, "
                         f"{p['python_s']:.3f}s Python; calls: "
                         + ", ".join(f"{k} {v['calls']}" for k, v in p["fs_calls"].items()))
    return "\n".join(lines)

"""Kill kvagent right after every step: the next apply finishes the job by itself.

One config with every backing kind (lvm, file, device) on the storage side and a
per-namespace and a striped pool with engines on the GPU side. For each case — a cold
apply of the storage side, a cold attach of the GPU side, and a full teardown (detach
and unexport) — the pass runs in a child process that is SIGKILLed right after its
k-th side effect, for every k; then a plain apply must exit 0, the apply after it must
change nothing (not one configfs write, command or record but the last-apply report),
the whole state (:func:`tests.kernel.crash_state.state_of`: nvmet tree, LVs, pool files,
fabrics controllers and their settings, I/O policies, mounts by identity, engine
configs, project quotas, owner/mode of what is under the mount root, data digests) must
be the one the clean, never killed pass left, data written to the mounts before the
teardown must read back unchanged, and foreign objects (an nvmet subsystem and port, an
LV, an ext4 filesystem) stay untouched. Each killed pass must have taken exactly the
first k steps of the full pass, and each matrix must be at least as big, and take every
kind of step, as its config implies (``*_minimum``).

``scripts/test`` kills after a sample of each matrix's steps (:func:`kills`): the first
step of each kind and every :data:`SAMPLE_EVERY`-th step from an offset that moves with
the day, so that a few days' runs kill after every step; ``KVAGENT_LONG=1`` kills after
every step of every matrix. Either way the clean run, the matrix's size and its kinds
are checked in full, and each run prints which steps it killed after.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.config import Config, load_config
from agent.config.model import InitiatorPool, TargetPool

from . import kit
from .crash import Outcome, child_pass, ci_log
from .crash_state import diff, lines, normalize_step, state_of, summary
from .pools import DRIVES, MIB, Lab, mount_tmpfs, umount_all_under, write_file

#: Three cases, three VMs (they run in parallel with the rest of the kernel tier), all
#: in every scripts/test: the storage side's cold apply, the GPU side's cold attach and a
#: teardown (each 4-8 minutes in a VM of its own under TCG).


#: Every step of each matrix killed after (``KVAGENT_LONG=1``, which the kernel tier
#: passes into its VMs), or a sample of them (:func:`kills`).
FULL = os.environ.get("KVAGENT_LONG") == "1"
#: The sample takes every SAMPLE_EVERY-th step (and the first of each kind): the three
#: matrices took 47 VM-minutes under TCG in full, the longest groups of scripts/test,
#: and 20 sampled (storage 26 of 66 kills, GPU 21 of 46, teardown 20 of 40).
SAMPLE_EVERY = 3
PREFIX = "nqn.2026-11.io.kvagent"
FOREIGN_NQN = "nqn.2014-08.org.example:foreign"
VG = "kvcrash"


def config(lab: Lab, *, storage: bool = True, gpu: bool = True) -> Config:
    hosts = f'[{{name: lab, nqn: "{lab.hostnqn}"}}]'
    pools = f"""
    - {{name: lv, ports: [p], hosts: {hosts}, namespaces: {{count: 1, size: 320MiB}},
       backing: {{kind: lvm, volume_group: {VG}, devices: [{DRIVES[0]}]}}}}
    - {{name: fl, ports: [p], hosts: {hosts}, namespaces: {{count: 2, size: 160MiB}},
       backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}}}
    - {{name: dv, ports: [p], hosts: {hosts},
       backing: {{kind: device, devices: [{{path: {DRIVES[1]}, host: lab}}]}}}}""" \
        if storage else ""
    text = f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports: {"[{name: p, id: 1, transport: tcp, address: 127.0.0.1, service: 4420}]"
          if storage else "[]"}
  pools: {pools or "[]"}
"""
    if gpu:
        target = "{transport: tcp, address: 127.0.0.1, service: 4420}"
        text += f"""
initiator:
  device_wait: 60s
  pools:
    - {{name: lv, target: {target}, mount: {lab.root}/mnt/lv, engines: [{{kind: lmcache}}]}}
    - {{name: fl, target: {target}, mount: {lab.root}/mnt/fl, layout: striped,
       engines: [{{kind: vllm, cpu_cache: 1GiB}}]}}
"""
    return load_config(lab.write(text))


# ------------------------------------------------------------ foreign objects
class Foreign:
    """Objects kvagent does not own, next to everything it does; checked after each run."""

    def __init__(self, root: Path, nullb):  # type: ignore[no-untyped-def]
        self.root = root
        self.backing = nullb(16)
        sub = kit.NVMET / "subsystems" / FOREIGN_NQN
        sub.mkdir()
        kit.write(sub / "attr_allow_any_host", "1")
        (sub / "namespaces/1").mkdir()
        kit.write(sub / "namespaces/1/device_path", self.backing)
        kit.write(sub / "namespaces/1/enable", "1")
        port = kit.NVMET / "ports/9"
        port.mkdir()
        for k, v in (("trtype", "tcp"), ("adrfam", "ipv4"), ("traddr", "127.0.0.1"),
                     ("trsvcid", "4429")):
            kit.write(port / f"addr_{k}", v)
        os.symlink(sub, port / "subsystems" / FOREIGN_NQN)
        kit.modprobe("loop")
        self.loops = []
        for name in ("lvm", "ext4"):
            img = root / f"foreign-{name}.img"
            with open(img, "wb") as f:
                f.truncate(64 * MIB)
            self.loops.append(kit.sh("losetup", "--show", "-f", str(img)).stdout.strip())
        kit.sh("vgcreate", "-y", "kvforeign", self.loops[0], timeout=120)
        kit.sh("lvcreate", "-y", "-n", "keep", "-L", "8m", "kvforeign", timeout=120)
        kit.sh("mkfs.ext4", "-q", self.loops[1])
        self.lv_digest = self._write("/dev/kvforeign/keep")
        self.ext4 = kit.digest_of(self.loops[1], MIB)

    @staticmethod
    def _write(dev: str) -> str:
        data = os.urandom(MIB)
        with open(dev, "r+b") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return kit.digest(data)

    def check(self) -> None:
        sub = kit.NVMET / "subsystems" / FOREIGN_NQN
        assert kit.read(sub / "namespaces/1/enable") == "1"
        assert kit.read(sub / "namespaces/1/device_path") == self.backing
        assert (kit.NVMET / "ports/9/subsystems" / FOREIGN_NQN).is_symlink()
        assert kit.read(kit.NVMET / "ports/9/addr_trsvcid") == "4429"
        assert kit.digest_of("/dev/kvforeign/keep", MIB) == self.lv_digest
        assert kit.digest_of(self.loops[1], MIB) == self.ext4

    def remove(self) -> None:
        sub = kit.NVMET / "subsystems" / FOREIGN_NQN
        (kit.NVMET / "ports/9/subsystems" / FOREIGN_NQN).unlink(missing_ok=True)
        if (kit.NVMET / "ports/9").exists():
            (kit.NVMET / "ports/9").rmdir()
        if sub.exists():
            kit.write(sub / "namespaces/1/enable", "0")
            (sub / "namespaces/1").rmdir()
            sub.rmdir()
        kit.sh("vgremove", "-ff", "-y", "kvforeign", check=False, timeout=120)
        for loop in self.loops:
            kit.sh("losetup", "-d", loop, check=False)


# ---------------------------------------------------------------------- resets
def ours(name: str) -> bool:
    return name.startswith(f"{PREFIX}:")


def clear_our_nvmet() -> None:
    """Remove kvagent's nvmet objects (a reboot would); the foreign ones stay."""
    for port in (kit.NVMET / "ports").iterdir():
        if port.name == "9":
            continue
        for link in (port / "subsystems").iterdir():
            link.unlink()
        port.rmdir()
    for sub in (kit.NVMET / "subsystems").iterdir():
        if not ours(sub.name):
            continue
        for link in (sub / "allowed_hosts").iterdir():
            link.unlink()
        for ns in (sub / "namespaces").iterdir():
            kit.write(ns / "enable", "0")
            ns.rmdir()
        sub.rmdir()
    for host in (kit.NVMET / "hosts").iterdir():
        host.rmdir()


def fabrics() -> list[Path]:
    return [c for c in Path("/sys/class/nvme").glob("nvme*") if kit.read(c / "transport") == "tcp"]


def detach_gpu(lab: Lab) -> None:
    """The GPU side back to nothing: unmounted, deactivated, disconnected, forgotten."""
    if fabrics() or Path("/dev/mapper/kvs_fl-data").exists():
        umount_all_under(lab.root / "mnt")
        kit.sh("vgchange", "-an", "kvs_fl", check=False, timeout=120)
        kit.sh("nvme", "disconnect-all", check=False)
        kit.wait_for(lambda: not fabrics(), 30, what="fabrics controllers to go")
    for p in ("initiator.json", "probes", "engines"):
        kit.sh("rm", "-rf", str(lab.state / p))
    kit.remove_tree(lab.root / "mnt")


def blank_namespaces(lab: Lab) -> None:
    """What the GPU side wrote on the storage goes: its namespaces are blank again."""
    for path in [f"/dev/{VG}/kv_lv_lab_1", *(str(p) for p in
                                             (lab.root / "files/fl").rglob("ns*.img"))]:
        with open(path, "r+b") as f:
            f.write(b"\0" * (4 * MIB))
            f.flush()
            os.fsync(f.fileno())


def reset_storage(lab: Lab) -> None:
    """Nothing of kvagent's on the storage side (and no records)."""
    detach_gpu(lab)
    clear_our_nvmet()
    if Path(f"/dev/{VG}").exists():
        kit.sh("vgremove", "-ff", "-y", VG, check=False, timeout=120)
    # The LVM label and metadata go with the first MiBs (the device pool's drive is
    # never written: claimed, not attached).
    kit.sh("blkdiscard", "-z", "-o", "0", "-l", str(4 * MIB), DRIVES[0], timeout=120)
    for child in (lab.root / "files").iterdir():
        kit.sh("rm", "-rf", str(child))
    kit.sh("rm", "-rf", str(lab.state))


# ----------------------------------------------------------------- the matrix
def side_effects(outcome: Outcome) -> list[str]:
    """Steps other than the report every apply writes (last-apply.json)."""
    return [s for s in outcome.steps if not s.endswith("last-apply.json")]


class Snapshot:
    """The state after the storage steps of a cold apply, restored in a moment.

    After the backings are made (volume group, LV, files, claim and their records) a
    cold apply only writes configfs and records. A pass from this state therefore takes
    exactly the cold pass's remaining steps (checked), so killing it after its j-th step
    is killing the cold pass after step ``first + j``; restoring it is clearing
    kvagent's nvmet objects and putting the records back — no LVM or mkfs per kill.
    """

    def __init__(self, lab: Lab, first: int):
        self.lab, self.first = lab, first
        self.saved = lab.root / "snapshot-state"
        kit.sh("rm", "-rf", str(self.saved))
        kit.sh("cp", "-a", str(lab.state), str(self.saved))

    def restore(self) -> None:
        clear_our_nvmet()
        kit.sh("rm", "-rf", str(self.lab.state))
        kit.sh("cp", "-a", str(self.saved), str(self.lab.state))


def first_configfs_step(steps: tuple[str, ...]) -> int:
    """How many steps come before the first configfs change (the storage steps)."""
    return next(i for i, s in enumerate(steps) if s.startswith("configfs."))


def kind_of(step: str) -> str:
    return step.split("\t", 1)[0]


def normalized(steps: tuple[str, ...] | list[str]) -> list[str]:
    """Steps as two runs of one pass must both take them (kernel names, random ids out)."""
    return [normalize_step(s) for s in steps]


def assert_prefix(name: str, k: int, killed: tuple[str, ...], expected: tuple[str, ...]) -> None:
    """The killed pass took exactly the first steps of the full pass: else the matrix would
    kill at positions it does not name (and leave others untested), silently."""
    if normalized(killed) != normalized(expected):
        raise AssertionError(
            f"{name} k={k}: the killed pass's steps are not the first {len(expected)} of the "
            f"full pass's:\n  killed pass: " + "\n    ".join(killed) +
            "\n  full pass:   " + "\n    ".join(expected))


# ----------------------------------------------------------- the matrix's size
@dataclass(frozen=True)
class Minimum:
    """What a pass of a case must at least take: a step count and the step kinds."""

    steps: int
    kinds: frozenset[str]


def target_shape(pool: TargetPool) -> tuple[int, int]:
    """(subsystems, namespaces) a target pool exports: one subsystem per host it names
    (the device pool: per host of its devices) or a shared one; ``count`` namespaces in
    each (the device pool: one per device)."""
    if pool.backing.kind == "device":
        return len({d.host for d in pool.backing.devices}) or 1, len(pool.backing.devices)
    subsystems = 1 if pool.allow_any_host or not pool.hosts else len(pool.hosts)
    return subsystems, subsystems * (pool.namespaces.count if pool.namespaces else 0)


def storage_minimum(cfg: Config) -> Minimum:
    """A cold apply of the storage side, at least (each a step of its own):

    - per port: its mkdir and the 4 address writes (trtype, adrfam, traddr, trsvcid);
    - per host NQN: its mkdir;
    - per subsystem: its mkdir, model and serial writes (set once, at creation), one link
      per allowed host (none with allow_any_host) and one per port;
    - per namespace: its mkdir, device_path, device_uuid, device_nguid and enable
      writes, plus buffered_io for a file pool that asks for it;
    - lvm: a pvcreate per device, a vgcreate (when it is to make the group) and an
      lvcreate per namespace; file: each namespace's file allocated and renamed into
      place; device: a claim record per device;
    - the last-apply report.
    """
    assert cfg.target is not None
    n = 5 * len(cfg.target.ports)
    n += len({h.nqn for p in cfg.target.pools for h in p.hosts})
    kinds = {"configfs.mkdir", "configfs.write", "configfs.symlink", "record"}
    for pool in cfg.target.pools:
        subsystems, namespaces = target_shape(pool)
        allowed = 0 if pool.allow_any_host else max(1, len(pool.hosts))
        n += subsystems * (3 + len(pool.ports) + allowed)
        n += namespaces * 5
        backing = pool.backing
        if backing.kind == "lvm":
            n += len(backing.devices) + (1 if backing.devices else 0) + namespaces
            kinds.add("command")
        elif backing.kind == "file":
            n += namespaces * (2 + (1 if backing.buffered_io else 0))
            kinds |= {"file.allocate", "file.rename"}
        else:
            n += len(backing.devices)
    return Minimum(n + 1, frozenset(kinds))


def mounts_of(cfg: Config, pool: InitiatorPool) -> int:
    """Filesystems an initiator pool makes: one per namespace of the target pool of its
    name ('per-namespace'), one striped over them all, none for a shared (raw) pool."""
    if pool.shared:
        return 0
    if pool.layout == "striped":
        return 1
    target = next((p for p in (cfg.target.pools if cfg.target else ()) if p.name == pool.name),
                  None)
    return target_shape(target)[1] if target else 1


def quotas_on(pool: InitiatorPool) -> bool:
    """kvagent adds prjquota unless the options turn quotas off."""
    return "noquota" not in pool.mount_options


def gpu_minimum(cfg: Config) -> Minimum:
    """A cold attach of the GPU side (the storage side already exported), at least:

    - per pool: a connect (the /dev/nvme-fabrics writer, a command; one per pool at
      least);
    - per filesystem: its mkfs.xfs and its mount (commands);
    - per striped pool: a vgcreate and an lvcreate over its namespaces;
    - per engine on each filesystem with project quotas: its directory put in its
      project, the quota record of that, and its hard limit;
    - the initiator's record and the last-apply report.
    """
    assert cfg.initiator is not None
    n, kinds = 2, {"command", "record"}
    for pool in cfg.initiator.pools:
        mounts = mounts_of(cfg, pool)
        n += 1 + 2 * mounts + (2 if pool.layout == "striped" and not pool.shared else 0)
        if pool.engines and mounts and quotas_on(pool):
            n += 3 * mounts * len(pool.engines)
            kinds |= {"quota.project", "quota.limit"}
    return Minimum(n, frozenset(kinds))


def teardown_minimum(attached: Config) -> Minimum:
    """A teardown of everything ``attached`` made, at least:

    - per mount: its umount (a command); per striped pool: its volume group deactivated;
      per pool: an nvme disconnect (one at least);
    - per namespace: enable 0 and its rmdir; per subsystem: its links to allowed hosts
      and ports removed and its rmdir; per host NQN and per port: its rmdir;
    - the records that say so (at least one) and the last-apply report.
    (Removing the storage is not counted: how is kvagent's choice.)
    """
    n, kinds = 2, {"record"}
    for pool in attached.initiator.pools if attached.initiator else ():
        n += 1 + mounts_of(attached, pool) + (1 if pool.layout == "striped" else 0)
        kinds.add("command")
    if attached.target:
        n += len(attached.target.ports)
        n += len({h.nqn for p in attached.target.pools for h in p.hosts})
        kinds |= {"configfs.rmdir", "configfs.unlink"}
        for pool in attached.target.pools:
            subsystems, namespaces = target_shape(pool)
            allowed = 0 if pool.allow_any_host else max(1, len(pool.hosts))
            n += subsystems * (1 + len(pool.ports) + allowed) + 2 * namespaces
            if namespaces:
                kinds.add("configfs.write")
    return Minimum(n, frozenset(kinds))


# ----------------------------------------------------------------- the matrix
def read_state(lab: Lab) -> dict[str, Any]:
    return state_of(state_dir=lab.state, files_dir=lab.root / "files",
                    mount_root=lab.root / "mnt")


def kills(steps: tuple[str, ...] | list[str], full: bool = FULL,
          offset: int | None = None) -> list[int]:
    """The steps (1-based) a matrix kills after: all of them (``full``), else the first
    step of each kind and every :data:`SAMPLE_EVERY`-th from ``offset`` (by default the
    day of the year: ``KVAGENT_CRASH_OFFSET`` replays a run's)."""
    n = len(steps)
    if full:
        return list(range(1, n + 1))
    if offset is None:
        offset = int(os.environ.get("KVAGENT_CRASH_OFFSET")
                     or time.gmtime().tm_yday) % SAMPLE_EVERY
    chosen = {k for k in range(1, n + 1) if (k - 1) % SAMPLE_EVERY == offset}
    seen: set[str] = set()
    for k, step in enumerate(steps, 1):
        if kind_of(step) not in seen:
            seen.add(kind_of(step))
            chosen.add(k)
    return sorted(chosen)


def run_case(name: str, lab: Lab, cfg: Config, reset, check, foreign: Foreign,  # type: ignore[no-untyped-def]
             minimum: Minimum, snapshot_after_storage: bool = False,
             shard: tuple[int, int] = (0, 1)) -> int:
    """Kill after step k for every k of ``cfg``'s pass from the state ``reset`` makes.

    After each kill, recovery and converged pass, the whole state (:func:`read_state`)
    must be the one the clean pass (never killed) left, and ``check`` must pass.
    ``shard`` (i, n): this VM kills after every n-th of the steps :func:`kills` names,
    from the i-th (the other shards' VMs take the rest; each checks the whole matrix's
    size).
    """
    reset()
    full = child_pass(cfg)
    assert full.exit_code == 0, f"{name}: the pass itself failed: {full.errors}"
    steps = full.steps
    n = len(steps)
    t0 = time.monotonic()
    clean = read_state(lab)
    kinds = sorted({kind_of(s) for s in steps})
    ci_log(f"crash matrix {name}: {n} steps; the clean run's state read in "
           f"{time.monotonic() - t0:.1f}s ({len(lines(clean))} lines: {summary(clean)})")
    index, shards = shard
    chosen = kills(steps)
    mine = chosen[index::shards]
    ci_log(f"crash matrix size: {name} {n} kills (minimum {minimum.steps}, kinds "
           f"{' '.join(kinds)})" + ("" if FULL else
                                    f"; a sample of {len(chosen)} (the first of each kind "
                                    f"and every {SAMPLE_EVERY}rd; KVAGENT_LONG=1 kills "
                                    f"after all): k={','.join(map(str, chosen))}")
           + (f"; shard {index + 1} of {shards} kills after {len(mine)} of them"
              if shards > 1 else ""))
    snapshot: Snapshot | None = None
    # The storage steps end with the record of intent written just before configfs.
    first = first_configfs_step(steps) - 1 if snapshot_after_storage else n
    if snapshot_after_storage:
        reset()
        assert child_pass(cfg, f"kill-after={first}").killed
        snapshot = Snapshot(lab, first)
        rest = child_pass(cfg)
        assert normalized(rest.steps) == normalized(steps[first:]), (
            f"{name}: from the snapshot the pass takes other steps than the cold pass:\n"
            f"{rest.steps}\n{steps[first:]}")
    started = time.monotonic()
    unlike: list[tuple[int, str]] = []
    for k in mine:
        t0 = time.monotonic()
        spec = f"kill-after={k}"
        if snapshot is not None and k > first:
            snapshot.restore()
            spec = f"kill-after={k - first}"
        else:
            reset()
        t1 = time.monotonic()
        killed = child_pass(cfg, spec)
        assert killed.killed, f"{name} k={k}: the pass ended before step {k}"
        # From the snapshot: the first k - first of its pass's steps, which are the
        # full pass's steps first..k (checked above).
        assert_prefix(name, k, killed.steps, steps[first:k] if k > first else steps[:k])
        t2 = time.monotonic()
        recovered = child_pass(cfg)
        assert recovered.exit_code == 0, (
            f"{name} k={k} ({steps[k - 1]}): recovery failed: {recovered.errors}")
        t3 = time.monotonic()
        again = child_pass(cfg)
        assert again.exit_code == 0 and side_effects(again) == [], (
            f"{name} k={k} ({steps[k - 1]}): not converged: {side_effects(again)} "
            f"{again.errors}")
        t4 = time.monotonic()
        # A state unlike the clean run's is collected, not fatal at once: the matrix goes
        # on (the next kill starts from a reset), so one run shows every position.
        differs = diff(clean, read_state(lab))
        if differs:
            unlike.append((k, f"k={k} (after {steps[k - 1]}):\n{differs}"))
        check()
        foreign.check()
        ci_log(f"crash matrix {name} k={k}/{n} after {steps[k - 1]}: killed; recovered with "
               f"{len(side_effects(recovered))} step(s); then converged"
               f"{'; STATE DIFFERS from the clean run' if differs else ''} "
               f"[reset {t1 - t0:.1f}s killed {t2 - t1:.1f}s recovery {t3 - t2:.1f}s "
               f"again {t4 - t3:.1f}s checks {time.monotonic() - t4:.1f}s]")
    ci_log(f"crash matrix {name}: {len(mine)} kills in {time.monotonic() - started:.0f}s; "
           f"the state differs from the clean run's after "
           f"{', '.join(f'k={k}' for k, _ in unlike) if unlike else 'none of them'}")
    failures = []
    if unlike:
        failures.append(f"{name}: after {len(unlike)} of {len(mine)} kills the state (after "
                        "recovery and a converged pass) is not the one a clean run left:\n"
                        + "\n".join(text for _, text in unlike))
    missing = minimum.kinds - set(kinds)
    if n < minimum.steps or missing:
        failures.append(
            f"{name}: the matrix is too small for its config: {n} kills (the config implies "
            f"at least {minimum.steps}); step kinds missing: {sorted(missing) or 'none'}\n"
            + "\n".join(steps))
    assert not failures, "\n\n".join(failures)
    return n


@contextlib.contextmanager
def foreign_objects(lab: Lab, nullb):  # type: ignore[no-untyped-def]
    foreign = Foreign(lab.root, nullb)
    try:
        yield foreign
    finally:
        reset_storage(lab)
        foreign.remove()


@pytest.mark.kernel(group="crash-storage", weight=11 if FULL else 6)
def test_kill_after_every_step_of_a_cold_apply_storage_side(lab: Lab, nullb) -> None:  # type: ignore[no-untyped-def]
    with foreign_objects(lab, nullb) as foreign:
        cfg = config(lab, gpu=False)
        run_case("storage cold apply", lab, cfg, lambda: reset_storage(lab), lambda: None,
                 foreign, storage_minimum(cfg), snapshot_after_storage=True)


#: The GPU matrix in two VMs (18 minutes in one under TCG): odd and even kills; its
#: sample in one.
GPU_SHARDS = [pytest.param(i, marks=pytest.mark.kernel(group=f"crash-gpu-{i + 1}",
                                                       weight=9.5 if FULL else 9),
                           id=f"shard{i + 1}") for i in range(2 if FULL else 1)]


@pytest.mark.parametrize("shard", GPU_SHARDS)
def test_kill_after_every_step_of_a_cold_attach_gpu_side(lab: Lab, nullb, shard: int) -> None:  # type: ignore[no-untyped-def]
    with foreign_objects(lab, nullb) as foreign:
        storage_only = config(lab, gpu=False)

        def gpu_empty() -> None:
            detach_gpu(lab)
            assert child_pass(storage_only).exit_code == 0
            blank_namespaces(lab)

        def mounted() -> None:
            for pool in ("lv/lab-ns1", "fl"):
                assert os.path.ismount(lab.root / "mnt" / pool)

        cfg = config(lab)
        run_case("gpu cold attach", lab, cfg, gpu_empty, mounted, foreign, gpu_minimum(cfg),
                 shard=(shard, len(GPU_SHARDS)))


@pytest.mark.kernel(group="crash-teardown", weight=13 if FULL else 5)
def test_kill_after_every_step_of_a_teardown(lab: Lab, nullb) -> None:  # type: ignore[no-untyped-def]
    with foreign_objects(lab, nullb) as foreign:
        full = config(lab)
        digests: dict[Path, str] = {}
        assert child_pass(full).exit_code == 0
        for pool in ("lv/lab-ns1", "fl"):
            f = lab.root / "mnt" / pool / "kept.bin"
            digests[f] = write_file(f, 4 * MIB)
        teardown = config(lab, storage=False, gpu=False)

        def attached() -> None:
            assert child_pass(full).exit_code == 0
            kit.write("/proc/sys/vm/drop_caches", "3")
            for f, digest in digests.items():
                assert kit.digest_of(str(f)) == digest, f"{f} changed"

        def nothing_left() -> None:
            assert not (lab.root / "mnt").exists() or not any(
                os.path.ismount(p) for p in (lab.root / "mnt").rglob("*"))
            assert not [s for s in (kit.NVMET / "subsystems").iterdir() if ours(s.name)]

        run_case("teardown", lab, teardown, attached, nothing_left, foreign,
                 teardown_minimum(full))
        attached()  # the data survived every killed teardown


@pytest.fixture
def lab(tmp_path: Path):
    # Loopback NVMe/TCP with transparent huge pages 'always' trips a 6.1 kernel bug that
    # leaves I/O hanging (docs/operations.md, troubleshooting): what the lab does too.
    kit.write("/sys/kernel/mm/transparent_hugepage/enabled", "madvise")
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "512m")
    yield lab
    umount_all_under(tmp_path)
    kit.force_clean()

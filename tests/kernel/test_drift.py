"""Drift healed within one collect (issue 35), on a real kernel.

A storage-side and a GPU-side ``kvagent run`` (both roles in this one VM, a file pool over
NVMe/TCP on 127.0.0.1), each collecting every 2 s with full passes 10 minutes apart:
whatever heals a change here, a collect saw and a targeted pass made. Each kind of drift
is made by hand behind the agents' backs, as an operator or another tool would:

- storage side: the subsystem unlinked from its port, a namespace disabled, the allowed
  host removed, any host allowed (``attr_allow_any_host``), the port removed altogether;
- GPU side: the pool's mount unmounted, its controller disconnected.

Each is healed by the agent that owns it (the configfs object back as it was, the mount
and controller back, the pool ready), counted by kind in ``kvagent_drift_detected_total``
and ``kvagent_drift_heals_total``, with no full pass; the time from the change to healed
is printed for the CI log (``scripts/bench-events`` measures it at default intervals).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from . import kit
from .crash import ci_log
from .pools import Lab
from .test_daemon import free_port, get
from .test_events import cli, gpu_agent, lab, mounted, quiet  # noqa: F401 (the lab fixture)

pytestmark = pytest.mark.kernel(group="lifecycle", weight=2)
PORT_ID = 33


def storage_config(where: Lab, health_port: int) -> Path:
    path = where.root / "storage.yaml"
    path.write_text(f"""
version: 1
node: {{name: lab, state_dir: {where.root}/sstate, run_dir: {where.root}/srun}}
target:
  ports: [{{name: lo, id: {PORT_ID}, transport: tcp, address: 127.0.0.1, service: 4420}}]
  pools:
    - name: kv
      backing: {{kind: file, directory: {where.root}/files, buffered_io: true}}
      namespaces: {{count: 2, size: 320MiB}}
      ports: [lo]
      hosts: [{{name: lab, nqn: "{where.hostnqn}"}}]
health: {{listen: "127.0.0.1:{health_port}", interval: 2s, full_interval: 10m}}
""")
    return path


def gpu_config(where: Lab, health_port: int) -> Path:
    path = where.root / "gpu.yaml"
    path.write_text(f"""
version: 1
node: {{name: lab, state_dir: {where.root}/gstate, run_dir: {where.root}/grun}}
initiator:
  pools:
    - {{name: kv, target: {{transport: tcp, address: 127.0.0.1}}, mount: {where.root}/mnt/kv,
       connect: {{fast_io_fail_tmo: 2s, reconnect_delay: 1s}}}}
health: {{listen: "127.0.0.1:{health_port}", interval: 2s, full_interval: 10m}}
""")
    return path


def live_mounts(where: Lab) -> int:
    """The pool's mounts whose block device exists (not orphaned by a namespace gone)."""
    root = str(where.root / "mnt" / "kv") + "/"
    with open("/proc/self/mountinfo") as f:
        fields = [line.split() for line in f]
    return sum(1 for f in fields if f[4].startswith(root)
               and Path("/sys/dev/block", f[2]).exists())


def series(port: int) -> dict[str, float]:
    """Every sample of /metrics, by its line's name and labels."""
    out = {}
    for line in get(f"http://127.0.0.1:{port}/metrics")[1].splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def drifted(port: int, role: str, kind: str) -> float:
    return series(port).get(
        f'kvagent_drift_detected_total{{kind="{kind}",role="{role}"}}', 0.0)


def heal(port: int, role: str, kind: str, change: Callable[[], None],
         healed: Callable[[], bool], what: str, *, events: bool = False) -> float:
    """Make ``change`` behind the agent's back; wait until ``healed`` and the agent counted
    the drift and a heal; the seconds from the change to healed. ``events``: the change
    also makes udev events, whose attach pass may heal it before the drift's own."""
    before, heals = drifted(port, role, kind), series(port)["kvagent_drift_heals_total"]
    runs = series(port)["kvagent_apply_runs_total"]
    change()
    t0 = time.monotonic()
    kit.wait_for(healed, 60, interval=0.05, what=f"{what} healed by the agent")
    took = time.monotonic() - t0
    # (the snapshot after the healing pass comes a moment after its last write)
    kit.wait_for(lambda: drifted(port, role, kind) > before
                 and (events or series(port)["kvagent_drift_heals_total"] > heals)
                 and series(port)["kvagent_apply_runs_total"] > runs, 30,
                 interval=0.2, what=f"the {kind} drift counted, and the pass that healed it")
    kit.wait_for(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 60,
                 interval=0.2, what=f"the pool ready after {what}")
    ci_log(f"drift: {what}: healed {took:.1f}s after the change (collects every 2 s)")
    return took


def test_each_kind_of_drift_is_healed_by_the_next_collect(lab: Lab) -> None:  # noqa: F811
    sport, gport = free_port(), free_port()
    storage = storage_config(lab, sport)
    gpu = gpu_config(lab, gport)
    nvmet = kit.NVMET
    with gpu_agent(storage, lab.root / "storage-agent.log") as sproc:
        kit.wait_for(lambda: get(f"http://127.0.0.1:{sport}/readyz")[0] == 200, 240,
                     interval=0.3, what="the storage agent's first pass")
        (nqn,) = [p.name for p in (nvmet / "subsystems").iterdir() if ":lab:kv" in p.name]
        sub = nvmet / "subsystems" / nqn
        port = nvmet / "ports" / str(PORT_ID)
        link = port / "subsystems" / nqn
        host = sub / "allowed_hosts" / lab.hostnqn
        enable = sub / "namespaces" / "2" / "enable"
        with gpu_agent(gpu, lab.root / "gpu-agent.log") as gproc:
            kit.wait_for(lambda: get(f"http://127.0.0.1:{gport}/readyz")[0] == 200, 240,
                         interval=0.3, what="the GPU agent's first pass to mount the pool")
            assert len(mounted(lab)) == 2
            times = {}
            times["unlinked from its port"] = heal(
                sport, "target", "port link", link.unlink, link.exists,
                "the subsystem unlinked from its port")
            times["namespace disabled"] = heal(
                sport, "target", "namespace", lambda: kit.write(enable, "0"),
                lambda: kit.read(enable) == "1", "a namespace disabled")
            times["allowed host removed"] = heal(
                sport, "target", "allowed host", host.unlink, host.exists,
                "the allowed host removed")
            allow_any = sub / "attr_allow_any_host"

            def allow_any_host() -> None:  # (nvmet refuses it while hosts are listed)
                host.unlink()
                kit.write(allow_any, "1")

            times["any host allowed"] = heal(
                sport, "target", "allow any host", allow_any_host,
                lambda: kit.read(allow_any) == "0" and host.exists(),
                "any host allowed (the allowed host removed, attr_allow_any_host on)")

            def remove_port() -> None:
                for lnk in (port / "subsystems").iterdir():
                    lnk.unlink()
                port.rmdir()

            times["port removed"] = heal(
                sport, "target", "port", remove_port,
                lambda: link.exists() and kit.read(port / "addr_traddr") == "127.0.0.1",
                "the port removed")
            # The GPU side: its controller reconnects after the port came back.
            kit.wait_for(lambda: get(f"http://127.0.0.1:{gport}/readyz")[0] == 200, 120,
                         interval=0.3, what="the GPU pool ready after the port came back")

            quiet(gport)  # (no pass in flight that would heal the next change unseen)
            (mount,) = sorted(mounted(lab))[:1]
            times["mount gone"] = heal(
                gport, "initiator", "mount", lambda: kit.sh("umount", mount),
                lambda: mount in mounted(lab), "a pool mount unmounted", events=True)
            quiet(gport)
            (ctrl,) = [p.name for p in kit.controllers_for(nqn)]
            times["controller deleted"] = heal(
                gport, "initiator", "controller",
                lambda: kit.sh("nvme", "disconnect", "-d", ctrl),
                lambda: bool(kit.controllers_for(nqn)) and live_mounts(lab) == 2,
                "the pool's controller disconnected", events=True)
            assert gproc.poll() is None and sproc.poll() is None
            # The storage agent's passes never failed (the GPU side's may have, while its
            # storage was unlinked: that is what the drift broke).
            assert series(sport)["kvagent_apply_failures_total"] == 0
    ci_log("drift: healed after " + ", ".join(f"{k} {v:.1f}s" for k, v in times.items()))
    # Teardown: the GPU side first, then the storage side.
    kit.sh("nvme", "disconnect-all", check=False)
    storage.write_text(storage.read_text().split("target:")[0])
    code, _, err = cli(storage, "apply")
    assert code == 0, err

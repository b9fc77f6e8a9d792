"""DH-HMAC-CHAP on Debian 13's 6.12 (the kernel tier's second kernel), storage and GPU
side on the same VM over NVMe/TCP on 127.0.0.1.

- The fake's 6.12 profile matches the running kernel (attribute sets and defaults).
- A pool with two host identities: ours with a host secret and a controller secret
  (bidirectional, SHA-512, ffdhe2048), another with a secret of its own. One apply
  connects with ours, the next changes nothing, data round-trips; the other identity
  with a wrong secret, or none, is refused by the kernel while ours stays live.
- Rotation during O_DIRECT reads: the host secret alone, then the controller secret
  alone: one apply each, the kernel re-authenticates the same controller with the new
  secret, live in every 20 ms sample, 0 read errors. Both at once: never written to a
  live controller (6.12 can hang re-authenticating with one new secret and one old): a
  second controller connects with the new secrets, the old one is disconnected, reads
  through the multipath head carry on (0 errors), nothing re-authenticates.
- A controller reset (a fresh authentication) succeeds with the new secrets.
- Turning auth off for a host with a secret is refused; the connection stays.
- A wrong secret and no secret through kvagent's connect: refused, and it says what to
  check.
"""

from __future__ import annotations

import errno
import io
import mmap
import os
import threading
import time
from pathlib import Path

import pytest

from agent.dhchap import generate, read_secret, write_secret
from agent.initiator.nvme.cli import NvmeCli
from agent.initiator.nvme.failures import ConnectError, PermanentConnectError, TransientConnectError
from agent.initiator.nvme.options import FabricsOptions
from agent.log import configure_logging
from agent.naming import subsystem_nqn
from agent.result import RunResult
from nvmet.fake import KERNEL_6_12, profile_problems

from . import kit
from .capture_profile import capture
from .crash import ci_log
from .pools import Lab, StateWatcher, assert_converged, assert_ok, mount_tmpfs, umount_all_under

pytestmark = [pytest.mark.kernel(group="kernel-6.12", kernel="6.12.117+deb13-amd64"),
              pytest.mark.second_kernel]
PREFIX = "nqn.2026-11.io.kvagent.auth"
NVMET = Path("/sys/kernel/config/nvmet")


@pytest.fixture
def lab(tmp_path: Path):
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "300m")
    yield lab
    umount_all_under(tmp_path)
    kit.force_clean()


OTHER = "nqn.2014-08.org.nvmexpress:uuid:5b9e2f40-8c1d-4e7a-9f3b-2d6c0a1e4b7f"


def write_config(lab: Lab, *, target_auth: str, initiator_auth: str,
                 other_auth: str = "") -> None:
    lab.write(f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports: [{{name: p, id: 1, transport: tcp, address: 127.0.0.1, service: 4420}}]
  pools:
    - name: sec
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: 1, size: 64MiB}}
      ports: [p]
      shared: true
      hosts: [{{name: lab, nqn: "{lab.hostnqn}"{target_auth}}},
              {{name: other, nqn: "{OTHER}"{other_auth}}}]
initiator:
  device_wait: 60s
  pools:
    - name: sec
      target: {{transport: tcp, address: 127.0.0.1, service: 4420}}
      mount: {lab.root}/mnt/sec
      shared: true{initiator_auth}
      connect: {{fast_io_fail_tmo: 'off'}}  # reads wait for a reconnect: what is proven
""")


class Reads:
    """O_DIRECT reads of a device in a thread, 1 MiB at a time, until stopped: counts
    reads and errors (a read that waits for a reconnect is not an error)."""

    def __init__(self, device: str):
        self.device, self.reads, self.errors = device, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        buf = mmap.mmap(-1, 1 << 20)
        fd = os.open(self.device, os.O_RDONLY | os.O_DIRECT)
        try:
            size = os.lseek(fd, 0, os.SEEK_END)
            offset = 0
            while not self._stop.is_set():
                try:
                    os.preadv(fd, [buf], offset)
                    self.reads += 1
                except OSError as exc:
                    self.errors.append(exc.errno)
                offset = (offset + len(buf)) % size
        finally:
            os.close(fd)

    def __enter__(self) -> Reads:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "a read never returned"


def rotate(lab: Lab, ctrl: Path, device: str) -> tuple[RunResult, set[str], Reads, str]:
    """One apply during O_DIRECT reads with the controller's state sampled every 20 ms;
    the apply's log output too."""
    out = io.StringIO()
    configure_logging(0, stream=out)
    try:
        with Reads(device) as reads, StateWatcher([ctrl.name], interval=0.02) as states:
            time.sleep(0.5)
            result = lab.apply()
            kit.wait_for(lambda: kit.read(ctrl / "state") == "live", 60, what="live")
            before = reads.reads
            kit.wait_for(lambda: reads.reads > before + 4, 60, what="reads after the apply")
    finally:
        configure_logging()
    return result, states.seen[ctrl.name], reads, out.getvalue()


def reauths(since: int) -> list[str]:
    """The kernel's re-authentication messages after dmesg line ``since``."""
    lines = kit.sh("dmesg").stdout.splitlines()[since:]
    return [line for line in lines if "re-authenticating" in line or "authenticated" in line]


def dmesg_lines() -> int:
    return len(kit.sh("dmesg").stdout.splitlines())


def test_the_fakes_6_12_profile_is_the_running_kernels() -> None:
    assert kit.read("/proc/sys/kernel/osrelease").startswith("6.12")
    assert profile_problems(KERNEL_6_12, capture()) == []


def test_dhchap_two_identities_rotation_under_reads_and_refusals(lab: Lab) -> None:
    keys = lab.root / "keys"
    keys.mkdir(mode=0o700)
    host_key, ctrl_key, other_key = (str(keys / n) for n in ("host.key", "ctrl.key",
                                                               "other.key"))
    for path in (host_key, ctrl_key, other_key):
        write_secret(path, generate())
    with_auth = dict(
        target_auth=f", auth: {{key_file: {host_key}, ctrl_key_file: {ctrl_key}, "
                    "hash: sha512, dhgroup: ffdhe2048}",
        initiator_auth=f"\n      auth: {{key_file: {host_key}, ctrl_key_file: {ctrl_key}}}",
        other_auth=f", auth: {{key_file: {other_key}}}")
    write_config(lab, **with_auth)
    nqn = subsystem_nqn(PREFIX, "lab", "sec", None)
    host = NVMET / "hosts" / lab.hostnqn

    first = lab.apply()
    assert_ok(first)
    assert kit.read(host / "dhchap_key") == read_secret(host_key).text
    assert kit.read(host / "dhchap_hash") == "hmac(sha512)"
    assert kit.read(NVMET / "hosts" / OTHER / "dhchap_key") == read_secret(other_key).text
    [ctrl] = kit.controllers_for(nqn)
    assert kit.read(ctrl / "state") == "live"
    assert kit.read(ctrl / "dhchap_secret") == read_secret(host_key).text
    assert kit.read(ctrl / "dhchap_ctrl_secret") == read_secret(ctrl_key).text
    device = kit.wait_for(lambda: kit.block_by_uuid(kit.exported_uuid(nqn, 1)), 30,
                          what="the namespace's block device")
    kit.odirect_roundtrip(device)
    assert_converged(lab.apply())
    ci_log(f"auth: bidirectional DH-HMAC-CHAP (sha512, ffdhe2048) connect on "
           f"{kit.read('/proc/sys/kernel/osrelease')}")

    # The other identity: a wrong secret and no secret are refused by the kernel (a wrong
    # secret: EKEYREJECTED, or EIO when the target drops the connection first).
    assert kit.fabrics_connect(OTHER, nqn, generate().text) in (errno.EKEYREJECTED, errno.EIO)
    assert kit.fabrics_connect(OTHER, nqn, None) == errno.ENOKEY
    assert [c.name for c in kit.controllers_for(nqn)] == [ctrl.name]
    assert kit.read(ctrl / "state") == "live"

    # Rotation of one secret at a time during reads: live in every sample, 0 errors.
    for path, attr in ((host_key, "dhchap_secret"), (ctrl_key, "dhchap_ctrl_secret")):
        write_secret(path, generate(), replace=True)
        since = dmesg_lines()
        result, seen, reads, logged = rotate(lab, ctrl, device)
        assert_ok(result)
        assert seen == {"live"}, f"{attr}: states seen {seen}"
        assert reads.errors == [] and reads.reads > 0, reads.errors
        assert kit.read(ctrl / attr) == read_secret(path).text
        assert [c.name for c in kit.controllers_for(nqn)] == [ctrl.name]
        said = reauths(since)
        assert any(f"{ctrl.name}: re-authenticating" in line for line in said), said
        assert any(f"{ctrl.name}: qid 0: controller authenticated" in line
                   for line in said), said
        assert "at once" not in logged and read_secret(path).text not in logged
        ci_log(f"auth: {attr} rotated during O_DIRECT reads: {reads.reads} reads, "
               f"0 errors, states {sorted(seen)} (20 ms samples)")

    # Both at once. A live controller is never given both: on 6.12 the re-authentication
    # that pairs a new secret with an old one can hang it. A second controller is added with
    # the new secrets through /dev/nvme-fabrics, live with a path to the namespace, then the
    # old one is disconnected; the multipath head (what is read, and what a pool mounts)
    # stays, reads carry on, nothing re-authenticates.
    write_secret(host_key, generate(), replace=True)
    write_secret(ctrl_key, generate(), replace=True)
    since = dmesg_lines()
    out = io.StringIO()
    configure_logging(0, stream=out)
    try:
        with Reads(device) as reads:
            time.sleep(0.5)
            result = lab.apply()
            before = reads.reads
            kit.wait_for(lambda: reads.reads > before + 4, 60, what="reads after the apply")
    finally:
        configure_logging()
    assert_ok(result)
    [new] = kit.controllers_for(nqn)
    assert new.name != ctrl.name and not ctrl.exists(), (new, ctrl)
    assert kit.read(new / "state") == "live"
    assert kit.read(new / "dhchap_secret") == read_secret(host_key).text
    assert kit.read(new / "dhchap_ctrl_secret") == read_secret(ctrl_key).text
    assert reads.errors == [] and reads.reads > 0, reads.errors
    logged = out.getvalue()
    assert "both DH-HMAC-CHAP secrets of a host change at once" in logged
    assert f'"old": "{ctrl.name}", "new": "{new.name}"' in logged
    assert read_secret(host_key).text not in logged
    assert not [line for line in reauths(since) if "re-authenticating" in line]
    ctrl = new
    assert_converged(lab.apply())
    ci_log(f"auth: both secrets rotated at once during O_DIRECT reads: a new controller "
           f"with them, then the old one disconnected: {reads.reads} reads, 0 errors")

    # A fresh authentication (controller reset) with the new secrets.
    kit.write(ctrl / "reset_controller", "1")
    kit.wait_for(lambda: kit.read(ctrl / "state") == "live", 60, what="live after a reset")
    kit.odirect_roundtrip(device)
    assert_converged(lab.apply())

    # Turning auth off for this host: refused, nothing changed, still connected.
    write_config(lab, target_auth="", initiator_auth="",
                 other_auth=with_auth["other_auth"])
    off = lab.apply()
    assert any("cannot remove a secret" in e.message for e in off.errors), off.errors
    assert kit.read(host / "dhchap_key") == read_secret(host_key).text
    assert kit.read(ctrl / "state") == "live"

    # A wrong secret and no secret through kvagent's connect: refused and explained.
    kit.sh("nvme", "disconnect", "-n", nqn)
    kit.wait_for(lambda: not kit.controllers_for(nqn), 30, what="the controller to go")
    # A rejected secret whose verdict the host did not read before the target dropped the
    # connection makes the kernel wait for its admin timeout (60 s) past kvagent's connect
    # timeout (seen on 6.12 under load): then kvagent's timeout names the secret too.
    for secret, errno_names, words in ((generate().text, ("EKEYREJECTED", "EIO"),
                                        "must hold the secret"),
                                       (None, ("ENOKEY",), "requires DH-HMAC-CHAP")):
        refused = refused_connect(lab, nqn, secret)
        if isinstance(refused, TransientConnectError):
            assert secret and "timed out" in str(refused), refused
            ci_log("auth: a wrong secret's connect waited for the kernel's admin timeout "
                   "(the target dropped the connection first); kvagent's hint names the secret")
        else:
            assert isinstance(refused, PermanentConnectError), refused
            assert refused.errno_name in errno_names, refused
        assert words in (refused.hint or "")
        if secret:
            assert secret not in str(refused)

    # Detach and unexport: nothing left.
    lab.write_empty(PREFIX)
    assert_ok(lab.apply())
    assert not kit.controllers_for(nqn) and not host.exists()


def refused_connect(lab: Lab, nqn: str, secret: str | None, tries: int = 3) -> ConnectError:
    """kvagent's error for a connect the target must refuse, once no controller is left.
    A connection that went down during the connect (host path error 0x370, seen on 6.12
    under load: the answer was lost, not given) is retried, as the agent's connect retries
    transient failures; a connect that succeeds fails the test."""
    cli = NvmeCli()
    for attempt in range(1, tries + 1):
        try:
            # With this host's hostid: the kernel's default one is its default host NQN's
            # (6.12 refuses that pair with EINVAL, "same hostid but different hostnqn").
            cli.add_controller("tcp", "127.0.0.1", 4420, nqn, hostnqn=lab.hostnqn,
                               hostid=kit.local_hostid(),
                               options=FabricsOptions(ctrl_loss_tmo=None,
                                                      dhchap_secret=secret),
                               duplicate=False)
        except ConnectError as exc:
            # After a timeout the kernel's connect still runs until its own timeout.
            kit.wait_for(lambda: not kit.controllers_for(nqn), 90,
                         what="no controller left by the refused connect")
            dropped = exc.status is not None and exc.status & 0x7FF == 0x370
            if not (dropped and attempt < tries):
                return exc
            assert "dropped during the connect" in (exc.hint or ""), exc
            ci_log(f"auth: connect attempt {attempt} lost its answer (host path error); "
                   "retried")
            continue
        pytest.fail(f"a connect with {'a wrong secret' if secret else 'no secret'} succeeded")
    raise AssertionError("unreachable")



def test_a_host_key_changed_behind_the_agents_back_is_healed_by_the_next_collect(
        lab: Lab) -> None:
    """Drift (issue 35): a storage-side ``kvagent run`` (collects every 2 s, full passes 10
    minutes apart) writes the configured DH-HMAC-CHAP key back when one is changed by
    hand, and counts it as ``host key`` drift."""
    from .test_daemon import free_port, get
    from .test_drift import drifted, series
    from .test_events import gpu_agent

    keys = lab.root / "keys"
    keys.mkdir(mode=0o700)
    host_key = str(keys / "host.key")
    write_secret(host_key, generate())
    port = free_port()
    lab.write(f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports: [{{name: p, id: 1, transport: tcp, address: 127.0.0.1, service: 4420}}]
  pools:
    - name: sec
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: 1, size: 64MiB}}
      ports: [p]
      hosts: [{{name: lab, nqn: "{lab.hostnqn}", auth: {{key_file: {host_key}}}}}]
health: {{listen: "127.0.0.1:{port}", interval: 2s, full_interval: 10m}}
""")
    attr = NVMET / "hosts" / lab.hostnqn / "dhchap_key"
    with gpu_agent(lab.config, lab.root / "agent.log") as proc:
        kit.wait_for(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 240,
                     interval=0.3, what="the agent's first pass")
        assert kit.read(attr) == read_secret(host_key).text
        heals = series(port)["kvagent_drift_heals_total"]
        kit.write(attr, generate().text)
        t0 = time.monotonic()
        kit.wait_for(lambda: kit.read(attr) == read_secret(host_key).text, 60, interval=0.05,
                     what="the configured key written back")
        took = time.monotonic() - t0
        kit.wait_for(lambda: drifted(port, "target", "host key") >= 1, 30, interval=0.2,
                     what="the host key drift counted")
        assert series(port)["kvagent_drift_heals_total"] > heals
        assert proc.poll() is None
    ci_log(f"drift: a host's DH-HMAC-CHAP key changed by hand, written back {took:.1f}s later "
           "(collects every 2 s)")
    lab.write_empty(PREFIX)
    assert_ok(lab.apply())

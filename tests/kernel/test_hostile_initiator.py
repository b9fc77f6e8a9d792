"""The GPU side under a changed pool (issue 24, items 6 and 13), on Debian 13's 6.12
(TLS and DH-HMAC-CHAP need it), storage and GPU side on the same VM over 127.0.0.1.

- (6) A pool connected in plaintext, then its port and pool switched to TLS: the port is
  re-created (the plaintext controller retries for ever, and the target gives its
  controller id to the next controller), and the same apply replaces the plaintext
  controller with a TLS one (``tls_key`` set): the namespace and its data are there
  again, and the next apply changes nothing. Switched back: the TLS controller is
  replaced by a plaintext one.
- (13) Both DH-HMAC-CHAP secrets rotated (a reload of ``kvagent run``) while another
  /dev/nvme-fabrics write holds the device's mutex (a connect to a port that answers the
  ICReq and then nothing: the kernel waits 60 s for its Connect): the replacement's write
  waits behind it in the kernel, unkillable. SIGTERM then ends the agent within the stop
  bound, with the old controller live; once the mutex is free the next pass finishes the
  replacement (one controller left, with the new secrets).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from agent.dhchap import generate, read_secret, write_secret
from agent.naming import subsystem_nqn
from agent.progress import EXIT_BOUND, STOP_POLL
from agent.system.run import KILL_GRACE
from agent.tlspsk import generate_psk

from . import kit
from .crash import ci_log
from .pools import KVAGENT, Lab, assert_converged, assert_ok, mount_tmpfs, umount_all_under
from .test_daemon import free_port
from .test_tls import tls_lab  # noqa: F401 (the fixture: tlshd, nvme-cli 2.13, a Lab)

pytestmark = [pytest.mark.kernel(group="kernel-6.12", kernel="6.12.117+deb13-amd64"),
              pytest.mark.second_kernel]
PREFIX = "nqn.2026-12.io.kvagent.hostile"
NQN = subsystem_nqn(PREFIX, "lab", "sec", None)
ROOT = Path(__file__).resolve().parents[2]
#: SIGTERM to exit while a pass is in a step (docs/operations.md, "Stopping the agent").
STOP_BOUND = STOP_POLL + KILL_GRACE + EXIT_BOUND


def disconnect_ours() -> None:
    """Disconnect this file's controllers (by subsystem NQN prefix) before the lab's
    teardown: one left retrying for ever (a plaintext controller of a port that requires
    TLS) would hang the teardown's device scans on its namespace."""
    for ctrl in Path("/sys/class/nvme").glob("nvme*"):
        try:
            ours = kit.read(ctrl / "subsysnqn").startswith(PREFIX)
        except OSError:
            continue
        if ours:
            kit.sh("nvme", "disconnect", "-d", ctrl.name, check=False)


def replaced(result, kind: str) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """(subject, detail) of the pass's replacements of kind ``kind``."""
    return [(a.subject, a.detail) for a in result.actions
            if a.kind == kind and a.status == "done"]


# -------------------------------------------------------------------------- item 6

def tls_config(lab: Lab, psk: str | None) -> str:
    """One shared pool on port 1, with TLS (``psk``: the key file) or without."""
    port_tls = ", tls: required" if psk else ""
    host_tls = f", tls: {{key_file: {psk}}}" if psk else ""
    pool_tls = f"\n      tls: {{key_file: {psk}}}" if psk else ""
    return f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports: [{{name: s, id: 1, transport: tcp, address: 127.0.0.1, service: 4420{port_tls}}}]
  pools:
    - name: sec
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: 1, size: 64MiB}}
      ports: [s]
      shared: true
      hosts: [{{name: lab, nqn: "{lab.hostnqn}"{host_tls}}}]
initiator:
  device_wait: 60s
  pools:
    - name: sec
      target: {{transport: tcp, address: 127.0.0.1, service: 4420}}
      mount: {lab.root}/mnt/sec
      shared: true{pool_tls}
      connect: {{fast_io_fail_tmo: 'off'}}
"""


@pytest.fixture
def tls_pool(tls_lab: Lab):  # type: ignore[no-untyped-def]  # noqa: F811
    yield tls_lab
    disconnect_ours()


def the_namespace() -> str:
    return kit.wait_for(lambda: kit.block_by_uuid(kit.exported_uuid(NQN, 1)), 60,
                        what="the namespace's block device")


def test_tls_added_to_a_pool_replaces_its_plaintext_controller(tls_pool: Lab) -> None:
    lab = tls_pool
    keys = lab.root / "keys"
    keys.mkdir(mode=0o700)
    psk = str(keys / "lab.psk")
    write_secret(psk, generate_psk())

    lab.write(tls_config(lab, None))
    assert_ok(lab.apply())
    [plain] = kit.controllers_for(NQN)
    assert kit.read(plain / "state") == "live"
    assert not (plain / "tls_key").exists(), "6.12 shows tls_key only with TLS"
    digest = kit.odirect_roundtrip(the_namespace(), size=4 << 20)

    # TLS on both sides: the port is re-created with TLS (the plaintext controller loses
    # its connection and retries for ever); the same apply replaces that controller.
    lab.write(tls_config(lab, psk))
    started = time.monotonic()
    result = lab.apply()
    took = time.monotonic() - started
    assert_ok(result)
    [tls] = kit.controllers_for(NQN)  # (the kernel may give it the old one's name)
    assert kit.read(tls / "state") == "live"
    assert kit.read(tls / "tls_key") not in ("", "none")
    [(subject, detail)] = replaced(result, "nvme.tls")
    assert subject == plain.name
    assert detail.startswith("plaintext controller, the pool wants TLS: ") and \
        tls.name in detail and "(a new controller with TLS)" in detail, detail
    assert kit.digest_of_range(the_namespace(), 0, 4 << 20) == digest
    assert_converged(lab.apply())
    ci_log(f"hostile: TLS added to a pool: {detail} ({took:.0f}s); its data read back")

    # And back: the TLS controller is replaced by a plaintext one.
    lab.write(tls_config(lab, None))
    back = lab.apply()
    assert_ok(back)
    [again] = kit.controllers_for(NQN)
    assert not (again / "tls_key").exists()
    assert kit.read(again / "state") == "live"
    [(subject, detail)] = replaced(back, "nvme.tls")
    assert subject == tls.name and detail.startswith(
        "TLS controller, the pool no longer wants TLS: "), detail
    assert kit.digest_of_range(the_namespace(), 0, 4 << 20) == digest
    ci_log(f"hostile: TLS removed from a pool: {detail}")

    lab.write_empty(PREFIX)
    assert_ok(lab.apply())
    assert not kit.controllers_for(NQN)


# ------------------------------------------------------------------------- item 13

DECOY_ID = "7c1f0e2a-4b3d-4c5e-9f6a-0b1c2d3e4f5a"
DECOY_HOST = f"nqn.2014-08.org.nvmexpress:uuid:{DECOY_ID}"


class SilentPort:
    """An NVMe/TCP port that answers a connection's ICReq and then nothing: a
    /dev/nvme-fabrics write connecting to it waits for its Connect command's answer (the
    kernel's admin timeout, 60 s) and holds the device's mutex all that time, so every
    other write to /dev/nvme-fabrics waits behind it in the kernel, unkillable."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.holding = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()
        self.writer = threading.Thread(target=self._write, daemon=True)
        self.writer.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        self.conns.append(conn)
        got = b""
        while len(got) < 128:
            got += conn.recv(128 - len(got))
        # ICResp: PDU type 1, HLEN = PLEN = 128, PFV 0, CPDA 0, no digests, MAXH2CDATA.
        icresp = (bytes([0x01, 0, 128, 0]) + (128).to_bytes(4, "little") + bytes(4)
                  + (0x20000).to_bytes(4, "little"))
        conn.sendall(icresp + bytes(128 - len(icresp)))
        conn.recv(65536)  # the Connect command, never answered
        self.holding.set()

    def _write(self) -> None:
        opts = (f"transport=tcp,traddr=127.0.0.1,trsvcid={self.port},"
                f"nqn=nqn.2026-12.io.kvagent.hostile:decoy,hostnqn={DECOY_HOST},"
                f"hostid={DECOY_ID}")
        try:
            fd = os.open("/dev/nvme-fabrics", os.O_RDWR)
            try:
                os.write(fd, opts.encode())
            finally:
                os.close(fd)
        except OSError:
            pass  # the kernel gives up on the Connect: what is expected

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.sock.close()


def in_fabrics_write(pid: int) -> bool:
    """Whether a thread of process ``pid`` or of one of its children is inside a
    /dev/nvme-fabrics write (its kernel stack)."""
    pids = [pid]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                pids.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    for p in pids:
        for stack in Path(f"/proc/{p}/task").glob("*/stack"):
            try:
                if "nvmf_dev_write" in stack.read_text():
                    return True
            except OSError:
                continue
    return False


@pytest.fixture
def lab(tmp_path: Path):  # type: ignore[no-untyped-def]
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "200m")
    yield lab
    disconnect_ours()
    umount_all_under(tmp_path)
    kit.force_clean()


def auth_config(lab: Lab, host_key: str, ctrl_key: str, port: int) -> str:
    return f"""
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
      hosts: [{{name: lab, nqn: "{lab.hostnqn}", auth: {{key_file: {host_key},
               ctrl_key_file: {ctrl_key}}}}}]
initiator:
  device_wait: 60s
  pools:
    - name: sec
      # named: no discovery (its write to /dev/nvme-fabrics would wait for the mutex)
      target: {{transport: tcp, address: 127.0.0.1, service: 4420, subsystem: '{NQN}'}}
      mount: {lab.root}/mnt/sec
      shared: true
      auth: {{key_file: {host_key}, ctrl_key_file: {ctrl_key}}}
      connect: {{fast_io_fail_tmo: 'off'}}
health: {{listen: "127.0.0.1:{port}", interval: 10m, full_interval: 10m}}
"""


def new_keys(lab: Lab, tag: str) -> tuple[str, str]:
    keys = lab.root / "keys"
    keys.mkdir(mode=0o700, exist_ok=True)
    paths = (str(keys / f"host{tag}.key"), str(keys / f"ctrl{tag}.key"))
    for path in paths:
        write_secret(path, generate())
    return paths


def test_sigterm_during_a_controller_replacement_and_the_next_pass(lab: Lab) -> None:
    port = free_port()
    lab.write(auth_config(lab, *new_keys(lab, "1"), port))
    assert_ok(lab.apply())
    [old] = kit.controllers_for(NQN)
    assert kit.read(old / "state") == "live"

    log = open(lab.root / "agent.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([*KVAGENT, "-c", str(lab.config), "run"], stdout=log,
                            stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ))
    decoy: SilentPort | None = None
    try:
        kit.wait_for(lambda: "agent ready" in (lab.root / "agent.log").read_text(), 600,
                     interval=1, what="the agent's first pass")
        # Another write holds /dev/nvme-fabrics for 60 s; then both secrets change at
        # once (new files: one reload sees both) and the reload's pass replaces the
        # controller: its write waits for the mutex in the kernel.
        decoy = SilentPort()
        assert decoy.holding.wait(60), "the decoy connect did not reach its Connect"
        host_key, ctrl_key = new_keys(lab, "2")
        lab.write(auth_config(lab, host_key, ctrl_key, port))
        proc.send_signal(signal.SIGHUP)
        kit.wait_for(lambda: in_fabrics_write(proc.pid), 45, interval=0.2,
                     what="the replacement's /dev/nvme-fabrics write")
        assert decoy.writer.is_alive(), "the mutex was free again before the test was ready"
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    text = (lab.root / "agent.log").read_text()
    print(f"SIGTERM during the replacement's write: exit {code} after {took:.1f}s "
          f"(bound {STOP_BOUND:g}s)")
    assert code == 0 and took <= STOP_BOUND, (took, text[-3000:])
    assert "pass stopped at a step boundary" in text, text[-3000:]
    assert kit.read(old / "state") == "live", "the old controller stays"

    # The mutex is free again (the decoy's Connect timed out); the write the agent left
    # behind goes on in the kernel. The next pass finishes the replacement.
    decoy.writer.join(timeout=120)
    decoy.close()
    assert not decoy.writer.is_alive()
    kit.wait_for(lambda: not any("fabrics_writer.py" in c for c in _cmdlines()), 60,
                 what="the write the agent left behind to end")
    result = lab.apply()
    assert_ok(result)
    [new] = kit.controllers_for(NQN)
    assert new.name != old.name and not old.exists()
    assert kit.read(new / "state") == "live"
    assert kit.read(new / "dhchap_secret") == read_secret(host_key).text
    assert kit.read(new / "dhchap_ctrl_secret") == read_secret(ctrl_key).text
    assert replaced(result, "nvme.auth") == [(
        old.name, f"both DH-HMAC-CHAP secrets changed at once: {new.name} connected (a new "
                  f"controller with them), {old.name} disconnected")]
    assert_converged(lab.apply())
    ci_log(f"hostile: SIGTERM while a controller replacement's write waited in the kernel: "
           f"the agent exited in {took:.1f}s (bound {STOP_BOUND:g}s); the next pass "
           f"replaced {old.name} by {new.name}")

    lab.write_empty(PREFIX)
    assert_ok(lab.apply())
    assert not kit.controllers_for(NQN)


def _cmdlines() -> list[str]:
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            out.append(cmdline.read_bytes().decode(errors="replace"))
        except OSError:
            continue
    return out

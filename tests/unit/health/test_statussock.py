"""The agent's status socket on a real AF_UNIX socket in tmp_path: what it serves, how it
is made (0600, a stale socket replaced, a link or a foreign file refused), and its bounds
(a client that does not read is cut at the deadline, many clients are bounded)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent.daemonfiles import STATUS_SOCKET, DaemonInfo
from agent.health.server import SnapshotStore
from agent.health.snapshot import Snapshot
from agent.health.status import render_status_doc, render_status_text, to_status_json
from agent.health.statusclient import ask_agent
from agent.health.statussock import StatusSocket, StatusSocketError, encoded_around
from agent.rundir import RunDirError, process_start_time
from tests.unit.health import samples
from tests.unit.lockholders import NOBODY, needs_root, world_readable_dir


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def me() -> DaemonInfo:
    """This process as the recorded agent (the socket's server runs in it)."""
    return DaemonInfo(os.getpid(), process_start_time(os.getpid()), "/etc/kvagent.yaml", 0.0)


def big(pools: int = 1000) -> Snapshot:
    """A status of 1 MB: more than a socket's send buffer holds."""
    ps = tuple(samples.initiator_pool(name=f"pool{i:04d}") for i in range(pools))
    return dataclasses.replace(samples.healthy(), pools=ps)


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen"
        time.sleep(0.01)


def connect(run_dir: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        s.connect(f"/proc/self/fd/{fd}/{STATUS_SOCKET}")
    finally:
        os.close(fd)
    return s


def read_all(s: socket.socket) -> bytes:
    s.settimeout(30)
    out = b""
    try:
        while chunk := s.recv(1 << 16):
            out += chunk
    except ConnectionResetError:
        pass
    return out


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "a-run-directory-whose-path-is-longer-than-an-af-unix-path-may-be" / "run"
    path.mkdir(parents=True, mode=0o700)
    return path


@pytest.fixture
def serving(run_dir: Path) -> Iterator[tuple[StatusSocket, SnapshotStore, Clock]]:
    store, clock = SnapshotStore(), Clock(1000.0)
    server = StatusSocket(run_dir, store, clock=clock).start()
    try:
        yield server, store, clock
    finally:
        server.shutdown()


def test_serves_the_live_render_of_the_stored_snapshot_and_its_age(serving, run_dir) -> None:
    server, store, clock = serving
    snap = samples.degraded(tick_at=996.75)
    store.set(snap)
    clock.now = 1000.0
    served = ask_agent(run_dir, me())
    assert served == to_status_json(snap, source="agent", pid=os.getpid(), age_seconds=3.25)
    assert served["collected"] == {"source": "agent", "pid": os.getpid(), "age_seconds": 3.25}
    assert served["node"] == "gpu1" and served["exit_code"] == 1
    assert render_status_doc(served) == render_status_text(snap).replace(
        "\n", f"\ncollected 3.2 s ago by kvagent run (pid {os.getpid()})\n", 1)
    # A loop tick re-stamps the snapshot: the age and taken_at stay the collect's.
    store.set(snap.ticked(taken_at=samples.T0 + 10, tick_at=1006.0))
    clock.now = 1007.0
    later = ask_agent(run_dir, me())
    assert later is not None and later["collected"]["age_seconds"] == 10.25
    assert later["taken_at"] == served["taken_at"] == "2026-01-01T00:00:00Z"
    assert server.served == 2


@pytest.mark.parametrize("key", ["a", "b", "c"])
def test_a_document_encoded_around_a_key_is_its_encoding(key: str) -> None:
    doc = {"a": [1, {"x": "y"}], "b": {"c": None}, "c": "\"b\": 1"}
    head, tail = encoded_around(doc, key)
    assert head + json.dumps(doc[key]).encode() + tail == json.dumps(doc).encode()
    one = {key: 5}
    head, tail = encoded_around(one, key)
    assert head + b"5" + tail == json.dumps(one).encode()


def test_the_answer_is_the_status_document_encoded_whole(serving, run_dir) -> None:
    _, store, clock = serving
    snap = samples.degraded(tick_at=996.75)
    store.set(snap)
    for now, age in ((1000.0, 3.25), (1001.5, 4.75)):
        clock.now = now
        expected = to_status_json(snap, source="agent", pid=os.getpid(), age_seconds=age)
        assert read_all(connect(run_dir)) == json.dumps(expected).encode() + b"\n"


def test_no_snapshot_yet_is_no_answer(serving, run_dir) -> None:
    assert ask_agent(run_dir, me()) is None
    assert read_all(connect(run_dir)) == b""


def test_the_socket_is_0600_and_removed_on_shutdown(run_dir: Path) -> None:
    server = StatusSocket(run_dir, SnapshotStore(samples.healthy())).start()
    st = (run_dir / STATUS_SOCKET).lstat()
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.geteuid()
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    server.shutdown()
    server.shutdown()  # twice is harmless
    assert not (run_dir / STATUS_SOCKET).exists()


def test_the_socket_is_0600_whatever_the_umask(run_dir: Path) -> None:
    old = os.umask(0o000)
    try:
        with StatusSocket(run_dir, SnapshotStore()):
            assert stat.S_IMODE((run_dir / STATUS_SOCKET).lstat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_a_stale_socket_is_replaced(run_dir: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    stale.bind(f"/proc/self/fd/{fd}/{STATUS_SOCKET}")
    os.close(fd)
    stale.close()  # a crashed agent's: the file stays, nobody listens
    (run_dir / STATUS_SOCKET).chmod(0o640)  # tells it from the new one
    assert ask_agent(run_dir, me()) is None
    with capture_logs() as logs, StatusSocket(run_dir, SnapshotStore(samples.healthy())):
        assert stat.S_IMODE((run_dir / STATUS_SOCKET).lstat().st_mode) == 0o600
        assert "replaced the status socket a previous agent left" in [
            e["event"] for e in logs]
        served = ask_agent(run_dir, me())
        assert served is not None and served["node"] == "stor1"


def test_a_socket_someone_listens_on_is_refused_and_kept(run_dir: Path) -> None:
    with StatusSocket(run_dir, SnapshotStore(samples.healthy())):
        ino = (run_dir / STATUS_SOCKET).lstat().st_ino
        with pytest.raises(StatusSocketError, match="another process listens on"):
            StatusSocket(run_dir, SnapshotStore())
        assert (run_dir / STATUS_SOCKET).lstat().st_ino == ino
        assert ask_agent(run_dir, me()) is not None


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "file", "directory"])
def test_anything_else_at_the_path_is_refused_and_left_alone(run_dir: Path, tmp_path: Path,
                                                              kind: str) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    path = run_dir / STATUS_SOCKET
    if kind == "symlink":
        path.symlink_to(victim)
    elif kind == "dangling symlink":
        path.symlink_to(tmp_path / "nothing-here")
    elif kind == "file":
        path.write_text("not a socket\n")
    else:
        path.mkdir()
    before = path.lstat()
    with pytest.raises(StatusSocketError, match=r"is a symlink|is not a socket"):
        StatusSocket(run_dir, SnapshotStore())
    after = path.lstat()
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert victim.read_text() == "keep me\n"
    assert not (tmp_path / "nothing-here").exists()


def test_a_socket_of_another_user_is_refused(run_dir: Path) -> None:
    needs_root()
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    other.bind(f"/proc/self/fd/{fd}/{STATUS_SOCKET}")
    os.close(fd)
    other.close()
    os.chown(run_dir / STATUS_SOCKET, NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(StatusSocketError, match="owned by nobody"):
        StatusSocket(run_dir, SnapshotStore())
    assert (run_dir / STATUS_SOCKET).lstat().st_uid == NOBODY


def test_a_run_directory_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "run").symlink_to(real)
    with pytest.raises(RunDirError, match="is a symlink"):
        StatusSocket(tmp_path / "run", SnapshotStore())
    assert list(real.iterdir()) == []


def test_a_client_that_does_not_read_is_cut_at_the_deadline(run_dir: Path) -> None:
    snap = big()
    whole = len(json.dumps(to_status_json(snap, source="agent")))
    assert whole > 4 * int(Path("/proc/sys/net/core/wmem_default").read_text())
    with StatusSocket(run_dir, SnapshotStore(snap), send_deadline=0.3) as server:
        slow = connect(run_dir)
        wait_for(lambda: server.cut == 1, "the cut")
        got = read_all(slow)
        assert 0 < len(got) < whole  # what the buffers held, then the end
        assert server.served == 0
        fresh = ask_agent(run_dir, me())  # the next client is served whole
        assert fresh is not None and len(fresh["pools"]) == len(snap.pools)
        assert server.served == 1


def test_an_idle_socket_thread_sleeps_until_a_client_or_its_deadline(run_dir: Path) -> None:
    """No polling: idle, its select does not return for a second; a client that does not
    read is cut at the deadline (the test above); a stop wakes it at once."""
    server = StatusSocket(run_dir, SnapshotStore(samples.healthy()), send_deadline=0.3)
    returned = []
    real = server._selector.select

    def counting(timeout=None):
        found = real(timeout)
        returned.append((timeout, len(found)))
        return found

    server._selector.select = counting
    server.start()
    try:
        time.sleep(1.0)
        assert returned == []
        assert ask_agent(run_dir, me()) is not None
    finally:
        server.shutdown()
    assert server._thread is None and server.served == 1


def test_many_clients_are_bounded(run_dir: Path) -> None:
    snap = big()
    with StatusSocket(run_dir, SnapshotStore(snap), max_clients=4,
                      send_deadline=60.0) as server:
        idle = [connect(run_dir) for _ in range(20)]
        wait_for(lambda: server.cut == 16, "16 evictions")
        assert len(server._answers) == 4
        for s in idle[:16]:  # the oldest were cut for the newer ones
            assert len(read_all(s)) < len(json.dumps(to_status_json(snap)))
        served = ask_agent(run_dir, me(), timeout=30)
        assert served is not None and len(served["pools"]) == len(snap.pools)
        assert server.cut == 17 and len(server._answers) <= 4
        for s in idle:
            s.close()


def test_a_client_of_another_user_gets_nothing() -> None:
    """Only root reaches the socket (0600 in a 0700 directory); were both opened up, a
    client running as nobody is still closed unanswered (SO_PEERCRED)."""
    needs_root()
    client = ("import socket, sys\n"
              "s = socket.socket(socket.AF_UNIX)\n"
              "s.connect(sys.argv[1])\n"
              "data = b''\n"
              "while chunk := s.recv(65536):\n"
              "    data += chunk\n"
              "print(len(data))\n")
    with world_readable_dir() as root:
        run_dir = root / "run"
        run_dir.mkdir(mode=0o700)
        with StatusSocket(run_dir, SnapshotStore(samples.healthy())) as server:
            run_dir.chmod(0o711)
            (run_dir / STATUS_SOCKET).chmod(0o666)
            # Debian's python3: uid 65534 cannot enter /root, where this venv lives.
            proc = subprocess.run(["/usr/bin/python3", "-c", client,
                                   str(run_dir / STATUS_SOCKET)], user=NOBODY,
                                  capture_output=True, text=True, timeout=60, check=False)
            assert proc.returncode == 0, proc.stderr
            assert proc.stdout.strip() == "0"
            assert server.refused == 1 and server.served == 0
            run_dir.chmod(0o700)
            assert ask_agent(run_dir, me()) is not None and server.served == 1


def test_the_client_trusts_only_the_recorded_agent(serving, run_dir: Path) -> None:
    _, store, _ = serving
    store.set(samples.healthy())
    assert ask_agent(run_dir, me()) is not None
    other = DaemonInfo(1, process_start_time(1), "/etc/kvagent.yaml", 0.0)
    assert ask_agent(run_dir, other) is None  # the peer is this process, not pid 1


def test_the_client_gives_up_on_a_socket_that_does_not_answer(run_dir: Path) -> None:
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    mute.bind(f"/proc/self/fd/{fd}/{STATUS_SOCKET}")
    os.close(fd)
    mute.listen(4)  # connects, never accepts nor writes
    try:
        assert ask_agent(run_dir, me(), timeout=0.3) is None
    finally:
        mute.close()


def test_the_client_does_not_follow_a_link_to_a_socket(run_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    with StatusSocket(elsewhere, SnapshotStore(samples.healthy())) as server:
        (run_dir / STATUS_SOCKET).symlink_to(elsewhere / STATUS_SOCKET)
        assert ask_agent(run_dir, me()) is None
        assert ask_agent(elsewhere, me()) is not None
        assert server.served == 1


def test_a_bug_in_an_answer_does_not_end_the_thread(serving, run_dir,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.health import statussock

    server, store, _ = serving
    store.set(samples.healthy())
    real = statussock.to_status_json
    calls: list[int] = []

    def once_broken(snap: Snapshot, **kw: object) -> dict:
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("a bug")
        return real(snap, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(statussock, "to_status_json", once_broken)
    with capture_logs() as logs:
        assert ask_agent(run_dir, me()) is None  # closed before the thread logs why
        wait_for(lambda: any(e["event"] == "status socket failed" for e in logs), "the log")
    assert [e["log_level"] for e in logs if e["event"] == "status socket failed"] == ["error"]
    assert ask_agent(run_dir, me()) is not None and server.served == 1

"""The agent's status socket: ``kvagent status`` reads the agent's last snapshot here.

``kvagent run`` listens on ``<node.run_dir>/status.sock``, an AF_UNIX stream socket of
mode 0600 in the run directory only kvagent's user (root) may enter (:mod:`agent.rundir`).
A client connects and reads: the agent writes the status JSON of its last snapshot (what
``kvagent status -o json`` prints, :func:`~agent.health.status.to_status_json`), with
``collected`` saying the agent collected it and how long ago, and closes. It reads no
request. A client that runs as neither root nor kvagent's user (``SO_PEERCRED``) is
closed unanswered. One thread serves it with one selector: at most ``MAX_CLIENTS``
answers are being written at once (a new client evicts the oldest), each cut
``SEND_DEADLINE`` seconds after its accept, so a client that never reads holds a file
descriptor for at most that long and no thread.

The socket is made safely: in the run directory opened with ``O_NOFOLLOW`` and proven
ours, bound through that directory's descriptor (``bind`` never follows a link); an
existing socket of ours that nobody answers on (a crashed agent's) is replaced, anything
else at that name (a link, a file, another user's socket, a socket that answers) is
refused and left alone. On shutdown the agent removes the socket it made, and only it.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..daemonfiles import STATUS_SOCKET
from ..errors import KvagentError
from ..log import get_logger
from ..rundir import RunDirError, private_dir, user_name
from .server import SnapshotStore
from .snapshot import Snapshot
from .status import to_status_json
from .statusclient import peer_credentials, socket_path, trusted_uid
from .wakeup import Waker, until_oldest_deadline

log = get_logger("health.statussock")

#: The socket's mode: kvagent's user only.
SOCKET_MODE = 0o600
#: Answers being written at once; a new client evicts the one accepted longest ago.
MAX_CLIENTS = 8
#: Seconds from a client's accept to the end of its answer; a slower reader is cut.
SEND_DEADLINE = 2.0
#: Connections the kernel holds for the thread to accept.
LISTEN_BACKLOG = 16
#: Seconds the thread pauses after an unexpected error before it serves again.
ERROR_PAUSE = 0.25


class StatusSocketError(KvagentError):
    """The status socket could not be made."""


def encoded_around(doc: dict[str, Any], key: str) -> tuple[bytes, bytes]:
    """``json.dumps(doc)`` in two pieces, before and after ``doc[key]``'s value, so that
    an answer that differs only there is not encoded whole each time."""
    keys = list(doc)
    at = keys.index(key)
    head = json.dumps({k: doc[k] for k in keys[:at]})
    tail = json.dumps({k: doc[k] for k in keys[at + 1:]})
    return ((head[:-1] + (", " if at else "") + json.dumps(key) + ": ").encode(),
            ((", " + tail[1:]) if at + 1 < len(keys) else "}").encode())


class _Answer:
    """An answer being written."""

    __slots__ = ("began", "data", "sent")

    def __init__(self, data: bytes, began: float):
        self.data = memoryview(data)
        self.sent = 0
        self.began = began


class StatusSocket:
    """The status socket of ``run_dir``, serving ``store``'s snapshot from a thread.

    ``clock`` (``time.monotonic``) dates the answers (the collect's age); the deadline
    runs on ``time.monotonic``."""

    def __init__(self, run_dir: str | os.PathLike[str], store: SnapshotStore, *,
                 clock: Callable[[], float] = time.monotonic,
                 max_clients: int = MAX_CLIENTS, send_deadline: float = SEND_DEADLINE):
        self.run_dir = str(run_dir)
        self.path = Path(run_dir) / STATUS_SOCKET
        self.store = store
        self.clock = clock
        self.max_clients = max_clients
        self.send_deadline = send_deadline
        #: Answers written whole; clients closed unanswered (another user); answers cut
        #: (at the deadline, or evicted for a newer client).
        self.served = 0
        self.refused = 0
        self.cut = 0
        self._sock, self._made = self._bind()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._waker = Waker(self._selector)
        self._answers: dict[socket.socket, _Answer] = {}  # oldest first
        #: The last snapshot served and its JSON around the "collected" value.
        self._cached: tuple[Snapshot, bytes, bytes] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ the socket file
    def _bind(self) -> tuple[socket.socket, tuple[int, int]]:
        with private_dir(self.run_dir) as dir_fd:
            self._clear_stale(dir_fd)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                os.fchmod(sock.fileno(), SOCKET_MODE)  # bind makes the file with this mode
                sock.bind(socket_path(dir_fd))
                st = os.stat(STATUS_SOCKET, dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_IMODE(st.st_mode) != SOCKET_MODE:  # a umask took owner bits
                    os.chmod(STATUS_SOCKET, SOCKET_MODE, dir_fd=dir_fd)
                    st = os.stat(STATUS_SOCKET, dir_fd=dir_fd, follow_symlinks=False)
                if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid() \
                        or stat.S_IMODE(st.st_mode) != SOCKET_MODE:
                    raise StatusSocketError(f"{self.path} is not the 0600 socket just made",
                                            f"remove {self.path}")
                sock.listen(LISTEN_BACKLOG)
                sock.setblocking(False)
            except BaseException:
                sock.close()
                raise
        return sock, (st.st_dev, st.st_ino)

    def _clear_stale(self, dir_fd: int) -> None:
        """Remove a socket of ours nobody answers on; refuse anything else there."""
        try:
            st = os.stat(STATUS_SOCKET, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        remove = f"remove {self.path}"
        if stat.S_ISLNK(st.st_mode):
            raise StatusSocketError(f"{self.path} is a symlink; kvagent does not follow "
                                    "links there", remove)
        if not stat.S_ISSOCK(st.st_mode):
            raise StatusSocketError(f"{self.path} exists and is not a socket", remove)
        if st.st_uid != os.geteuid():
            raise StatusSocketError(
                f"{self.path} is owned by {user_name(st.st_uid)} (uid {st.st_uid}), not by "
                f"{user_name(os.geteuid())} who runs kvagent", remove)
        if self._answers_there(dir_fd):
            raise StatusSocketError(f"another process listens on {self.path}",
                                    "one agent per run directory: stop the other one")
        os.unlink(STATUS_SOCKET, dir_fd=dir_fd)
        log.info("replaced the status socket a previous agent left", path=str(self.path))

    @staticmethod
    def _answers_there(dir_fd: int) -> bool:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(socket_path(dir_fd))
        except ConnectionRefusedError:
            return False  # nobody listens: stale
        except OSError:
            return True  # a full backlog, or anything else: not ours to remove
        finally:
            probe.close()
        return True

    def _remove_file(self) -> None:
        """Unlink the socket file if it is still the one this object made."""
        try:
            with private_dir(self.run_dir, readonly=True) as dir_fd:
                st = os.stat(STATUS_SOCKET, dir_fd=dir_fd, follow_symlinks=False)
                if (st.st_dev, st.st_ino) == self._made:
                    os.unlink(STATUS_SOCKET, dir_fd=dir_fd)
        except (OSError, RunDirError) as exc:
            log.debug("status socket not removed", path=str(self.path), error=str(exc))

    # ------------------------------------------------------------------ serving
    def start(self) -> StatusSocket:
        """Serve in a daemon thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="kvagent-status",
                                            daemon=True)
            self._thread.start()
            log.info("status socket listening", path=str(self.path))
        return self

    def shutdown(self) -> None:
        """Stop serving, close every connection and remove the socket (twice is harmless)."""
        self._stop.set()
        self._waker.wake()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for conn in list(self._answers):
            self._drop(conn)
        if self._sock.fileno() != -1:
            self._selector.close()
            self._waker.close()
            self._sock.close()
            self._remove_file()

    def __enter__(self) -> StatusSocket:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                wait = until_oldest_deadline(self._answers, self.send_deadline,
                                             time.monotonic())
                for key, _ in self._selector.select(timeout=wait):
                    if key.fileobj is self._sock:
                        self._accept()
                    elif key.data is self._waker:
                        self._waker.drain()
                    else:
                        self._write(key.fileobj)  # type: ignore[arg-type]
                self._reap(time.monotonic())
            except Exception as exc:  # a bug must not end the thread silently
                log.error("status socket failed", error=f"{type(exc).__name__}: {exc}")
                time.sleep(ERROR_PAUSE)

    def _accept(self) -> None:
        for _ in range(LISTEN_BACKLOG):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: the next loop tries again
                log.warning("status socket cannot accept", error=str(exc))
                return
            try:
                pid, uid, _ = peer_credentials(conn)
            except OSError:
                conn.close()
                continue
            if not trusted_uid(uid):
                self.refused += 1
                log.warning("status socket: a client of another user closed", pid=pid,
                            uid=uid)
                conn.close()
                continue
            try:
                data = self._payload()
            except Exception:
                conn.close()
                raise
            if not data:  # no snapshot yet: the client reads live
                conn.close()
                continue
            conn.setblocking(False)
            while len(self._answers) >= self.max_clients:
                self._drop(next(iter(self._answers)))
                self.cut += 1
            self._answers[conn] = _Answer(data, time.monotonic())
            self._selector.register(conn, selectors.EVENT_WRITE)
            self._write(conn)

    def _payload(self) -> bytes:
        snap = self.store.get()
        if snap is None:
            return b""
        if self._cached is None or self._cached[0] is not snap:
            self._cached = (snap, *encoded_around(to_status_json(snap, source="agent"),
                                                  "collected"))
        _, head, tail = self._cached
        collected = {"source": "agent", "pid": os.getpid(),
                     "age_seconds": round(max(0.0, self.clock() - snap.collect_tick), 3)}
        return b"".join((head, json.dumps(collected).encode(), tail, b"\n"))

    def _write(self, conn: socket.socket) -> None:
        answer = self._answers.get(conn)
        if answer is None:
            return
        try:
            answer.sent += conn.send(answer.data[answer.sent:])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the client went away
            self._drop(conn)
            return
        if answer.sent >= len(answer.data):
            self.served += 1
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)
            self._drop(conn)

    def _reap(self, now: float) -> None:
        for conn, answer in list(self._answers.items()):
            if now - answer.began <= self.send_deadline:
                break  # oldest first: the rest are younger
            self._drop(conn)
            self.cut += 1

    def _drop(self, conn: socket.socket) -> None:
        self._answers.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(conn)
        conn.close()

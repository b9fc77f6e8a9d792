"""``kvagent status`` asking the running agent (``kvagent run``) for its last snapshot.

The agent is the one its record in ``node.run_dir`` names (:mod:`agent.daemonfiles`);
its status socket there (:mod:`agent.health.statussock`) must be a socket of kvagent's
user, reached through the run directory's descriptor (proven private, never through a
link), and the process at the other end (``SO_PEERCRED``) must be the recorded agent,
running as root or as kvagent's user. Whatever fails (no socket, another peer, no whole
answer within the timeout, an answer that is no status) makes :func:`ask_agent` return
None with the reason in a debug log: the caller then reads the host itself.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import time
from typing import Any

from ..daemonfiles import STATUS_SOCKET, DaemonInfo
from ..log import get_logger
from ..rundir import RunDirError, private_dir
from .status import STATUS_FORMAT

log = get_logger("health.statusclient")

#: Seconds ``kvagent status`` gives the agent for its whole answer.
ASK_TIMEOUT = 2.0
#: The longest answer read (a status of thousands of pools is a few MiB).
MAX_REPLY = 64 << 20
_CRED = struct.Struct("3i")


class NoAnswer(Exception):
    """The agent's status socket gave no status; the message says why."""


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of an AF_UNIX stream socket."""
    pid, uid, gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                 _CRED.size))
    return pid, uid, gid


def trusted_uid(uid: int) -> bool:
    """Root, or the user kvagent runs as."""
    return uid in (0, os.geteuid())


def socket_path(dir_fd: int) -> str:
    """The status socket in the run directory open as ``dir_fd`` (any length of
    ``node.run_dir``: an AF_UNIX path holds at most 107 bytes)."""
    return f"/proc/self/fd/{dir_fd}/{STATUS_SOCKET}"


def ask_agent(run_dir: str | os.PathLike[str], agent: DaemonInfo, *,
              timeout: float = ASK_TIMEOUT) -> dict[str, Any] | None:
    """The status JSON the agent serves (``collected.source`` "agent"), or None."""
    try:
        return _ask(run_dir, agent, timeout)
    except (NoAnswer, OSError, RunDirError, ValueError) as exc:
        log.debug("no status from the agent; reading the host here", pid=agent.pid,
                  reason=str(exc) or type(exc).__name__)
        return None


def _ask(run_dir: str | os.PathLike[str], agent: DaemonInfo,
         timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    with private_dir(run_dir, readonly=True) as dir_fd:
        st = os.stat(STATUS_SOCKET, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISSOCK(st.st_mode) or not trusted_uid(st.st_uid):
            raise NoAnswer(f"{STATUS_SOCKET} is not a socket of kvagent's user")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(socket_path(dir_fd))
        except BaseException:
            sock.close()
            raise
    with sock:
        pid, uid, _ = peer_credentials(sock)
        if pid != agent.pid:
            raise NoAnswer(f"the socket's peer is pid {pid}, not the agent (pid {agent.pid})")
        if not trusted_uid(uid):
            raise NoAnswer(f"the socket's peer runs as uid {uid}, not root")
        data = _read_all(sock, deadline)
    if not data:
        raise NoAnswer("the agent has no snapshot yet (its first pass runs)")
    doc = json.loads(data)
    if not (isinstance(doc, dict) and doc.get("format") == STATUS_FORMAT
            and doc.get("exit_code") in (0, 1) and isinstance(doc.get("collected"), dict)
            and doc["collected"].get("source") == "agent"):
        raise NoAnswer("the answer is not a kvagent status")
    return doc


def _read_all(sock: socket.socket, deadline: float) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise NoAnswer("no whole answer within the timeout")
        sock.settimeout(left)
        chunk = sock.recv(1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_REPLY:
            raise NoAnswer(f"an answer longer than {MAX_REPLY} bytes")
        chunks.append(chunk)

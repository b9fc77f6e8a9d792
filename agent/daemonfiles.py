"""Files the daemon (``kvagent run``) and the CLI exchange in ``node.run_dir``.

- ``daemon.json``: the running daemon's pid, start time and config file, written
  at start and removed on a clean exit. A record whose process is gone (or whose
  pid now names another process) is stale and ignored.
- ``apply-busy.json``: while the daemon's passes are skipped because another
  process holds the apply lock: how many in a row, since when, and the holder.
  ``kvagent status`` run from the CLI reads it.
- ``apply-request-<id>`` / ``apply-result-<id>.json``: ``kvagent apply`` while a
  daemon runs writes a request, sends SIGHUP, and waits for the daemon's result of
  the reload and pass it triggered (see docs/architecture.md, "The loop").
- ``status.sock``: the daemon's status socket (:mod:`agent.health.statussock`), where
  ``kvagent status`` reads the daemon's last snapshot.

Every file is 0600 in the private run directory (:mod:`agent.rundir`).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import KvagentError
from .lockholder import LockHolder
from .rundir import RunDirError, open_private_file, private_dir, process_alive, process_start_time

DAEMON_RECORD = "daemon.json"
BUSY_RECORD = "apply-busy.json"
REQUEST_PREFIX = "apply-request-"
RESULT_PREFIX = "apply-result-"
STATUS_SOCKET = "status.sock"
_ID = re.compile(r"[0-9a-f]{8,32}")


# ------------------------------------------------------------------ reading
def _read(run_dir: str | os.PathLike[str], name: str) -> Any:
    """A JSON record of ours in the run directory; None when missing, unreadable or foreign.

    Never creates or changes the directory (``kvagent status`` may run as any user).
    """
    try:
        with private_dir(run_dir, readonly=True) as dir_fd:
            fd = open_private_file(dir_fd, name, Path(run_dir) / name, os.O_RDONLY)
    except (OSError, RunDirError):
        return None
    try:
        with os.fdopen(fd) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write(run_dir: str | os.PathLike[str], name: str, data: Any) -> None:
    from .state import write_json  # (its effects seam: not for a command that only reads)

    with private_dir(run_dir):
        write_json(Path(run_dir) / name, data)  # mkstemp: 0600, then an atomic rename


def _remove(run_dir: str | os.PathLike[str], name: str) -> None:
    try:
        with private_dir(run_dir, readonly=True) as dir_fd:
            os.unlink(name, dir_fd=dir_fd)
    except (OSError, RunDirError):
        pass


# ------------------------------------------------------------ daemon record
@dataclass(frozen=True)
class DaemonInfo:
    """A running ``kvagent run``."""

    pid: int
    start_time: int | None
    config: str
    started_at: float

    def alive(self) -> bool:
        return process_alive(self.pid, self.start_time)


def register_daemon(run_dir: str | os.PathLike[str], config: str) -> DaemonInfo:
    """Record this process as the daemon of ``run_dir``; refuse while another one runs."""
    other = live_daemon(run_dir)
    if other is not None and other.pid != os.getpid():
        raise KvagentError(
            f"another kvagent run (pid {other.pid}, config {other.config}) already runs "
            f"with the run directory {run_dir}",
            "one agent per host: stop it first (systemctl stop kvagent), or give this one "
            "another node.run_dir")
    me = DaemonInfo(os.getpid(), process_start_time(os.getpid()), os.path.abspath(config),
                    time.time())
    _write(run_dir, DAEMON_RECORD, {"pid": me.pid, "start_time": me.start_time,
                                    "config": me.config, "started_at": me.started_at})
    return me


def unregister_daemon(run_dir: str | os.PathLike[str]) -> None:
    """Remove the daemon record if it is this process's."""
    current = _daemon_record(run_dir)
    if current is not None and current.pid == os.getpid():
        _remove(run_dir, DAEMON_RECORD)


def _daemon_record(run_dir: str | os.PathLike[str]) -> DaemonInfo | None:
    data = _read(run_dir, DAEMON_RECORD)
    try:
        return DaemonInfo(int(data["pid"]), data.get("start_time"), str(data["config"]),
                          float(data.get("started_at") or 0))
    except (TypeError, KeyError, ValueError):
        return None


def live_daemon(run_dir: str | os.PathLike[str]) -> DaemonInfo | None:
    """The daemon running with ``run_dir``, or None (no record, or a stale one)."""
    info = _daemon_record(run_dir)
    return info if info is not None and info.alive() else None


# --------------------------------------------------------------- busy record
@dataclass(frozen=True)
class BusyRecord:
    """The daemon's passes skipped in a row because the lock was held."""

    passes: int
    since: float
    holder: LockHolder | None
    updated_at: float


def write_busy(run_dir: str | os.PathLike[str], passes: int, since: float,
               holder: LockHolder | None) -> None:
    """Record (as the daemon) that ``passes`` passes in a row found the lock held."""
    info = {"pid": os.getpid(), "start_time": process_start_time(os.getpid()),
            "passes": passes, "since": since, "updated_at": time.time(),
            "holder": holder.to_json() if holder else None}
    _write(run_dir, BUSY_RECORD, info)


def clear_busy(run_dir: str | os.PathLike[str]) -> None:
    """A pass ran: nothing is skipped any more."""
    _remove(run_dir, BUSY_RECORD)


def read_busy(run_dir: str | os.PathLike[str]) -> BusyRecord | None:
    """The running daemon's busy record; None when none, or its daemon is gone."""
    data = _read(run_dir, BUSY_RECORD)
    try:
        if not process_alive(int(data["pid"]), data.get("start_time")):
            return None
        holder = LockHolder.from_json(data["holder"]) if data.get("holder") else None
        return BusyRecord(int(data["passes"]), float(data["since"]), holder,
                          float(data["updated_at"]))
    except (TypeError, KeyError, ValueError):
        return None


# ------------------------------------------------------ apply requests/results
@dataclass(frozen=True)
class ApplyRequest:
    """``kvagent apply`` asking the daemon for a reload and a pass."""

    id: str
    pid: int
    wait: bool
    #: Target pools whose namespaces may move to other storage in this pass (--rebind).
    rebind: tuple[str, ...] = ()


def new_request(run_dir: str | os.PathLike[str], *, wait: bool,
                rebind: tuple[str, ...] = ()) -> str:
    """Write a request (before signalling the daemon) and return its id."""
    import secrets

    request_id = secrets.token_hex(8)
    _write(run_dir, REQUEST_PREFIX + request_id,
           {"id": request_id, "pid": os.getpid(), "wait": wait, "rebind": list(rebind),
            "requested_at": time.time()})
    return request_id


def take_requests(run_dir: str | os.PathLike[str]) -> list[ApplyRequest]:
    """The pending requests (as the daemon), removed from the directory as they are read."""
    try:
        names = sorted(n for n in os.listdir(run_dir) if n.startswith(REQUEST_PREFIX))
    except OSError:
        return []
    found = []
    for name in names:
        request_id = name[len(REQUEST_PREFIX):]
        data = _read(run_dir, name)
        _remove(run_dir, name)
        if not _ID.fullmatch(request_id) or not isinstance(data, dict):
            continue
        rebind = data.get("rebind") or []
        found.append(ApplyRequest(request_id, int(data.get("pid") or 0),
                                  bool(data.get("wait")),
                                  tuple(str(p) for p in rebind if isinstance(p, str))))
    return found


def publish_result(run_dir: str | os.PathLike[str], request_id: str,
                   payload: dict[str, Any]) -> None:
    """Answer a request: ``{"result": ...}``, ``{"error": ...}`` or ``{"config_error": ...}``."""
    if _ID.fullmatch(request_id):
        _write(run_dir, f"{RESULT_PREFIX}{request_id}.json", {"id": request_id, **payload})


def wait_result(run_dir: str | os.PathLike[str], request_id: str, daemon: DaemonInfo, *,
                timeout: float, progress: Callable[[float], None] | None = None,
                poll: float = 0.2) -> dict[str, Any]:
    """The daemon's answer to ``request_id`` (removed once read).

    Raises when the daemon exits first or ``timeout`` seconds pass; ``progress(elapsed)``
    is called at every poll.
    """
    name = f"{RESULT_PREFIX}{request_id}.json"
    started = time.monotonic()
    while True:
        data = _read(run_dir, name)
        if isinstance(data, dict) and data.get("id") == request_id:
            _remove(run_dir, name)
            return data
        elapsed = time.monotonic() - started
        if not daemon.alive():
            _remove(run_dir, REQUEST_PREFIX + request_id)
            raise KvagentError(f"the agent (pid {daemon.pid}) exited before it answered "
                               f"apply request {request_id}",
                               "see its log (journalctl -u kvagent); run kvagent apply again")
        if elapsed > timeout:
            _remove(run_dir, REQUEST_PREFIX + request_id)  # nobody will read an answer
            raise KvagentError(
                f"the agent (pid {daemon.pid}) has not answered apply request {request_id} "
                f"after {timeout:g}s (a long pass, or the agent is stuck)",
                "it still runs the pass and will keep the new config; see kvagent status "
                "and journalctl -u kvagent")
        if progress is not None:
            progress(elapsed)
        time.sleep(poll)


def clear_exchange(run_dir: str | os.PathLike[str]) -> None:
    """Remove requests and results a previous daemon left behind (at daemon start)."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return
    for name in names:
        if name.startswith((REQUEST_PREFIX, RESULT_PREFIX)):
            _remove(run_dir, name)

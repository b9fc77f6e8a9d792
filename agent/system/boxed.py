"""Running a program kvagent does not trust, boxed: as a given account (never root's
groups), with only the environment it is given, its output read as it comes and capped,
and its whole process group killed when it ends or runs out of time.

For code that is not kvagent's (an engine's Python, ``kvagent engines check``): it may
hang, print without end or leave children behind, and none of that may reach kvagent.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Bytes read from a pipe at a time.
CHUNK = 1 << 16
#: Bytes read after the program exited, at most: what its pipes held then (a pipe holds
#: at most 1 MiB), not what a child it left behind goes on writing.
DRAIN_AFTER_EXIT = 4 << 20
#: The search path a boxed program gets (systemd's default for services).
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Account:
    """Who a boxed program runs as."""

    uid: int
    gid: int
    name: str
    home: str
    groups: tuple[int, ...] = ()

    @classmethod
    def of(cls, uid: int, gid: int) -> Account:
        """The account of ``uid`` (its name, home, primary and supplementary groups); a
        uid without a passwd entry keeps ``gid``, no other group and ``/`` as home."""
        try:
            pw = pwd.getpwuid(uid)
        except KeyError:
            return cls(uid, gid, str(uid), "/")
        return cls(uid, pw.pw_gid, pw.pw_name, pw.pw_dir,
                   tuple(os.getgrouplist(pw.pw_name, pw.pw_gid)))

    def environment(self, **extra: str) -> dict[str, str]:
        """A minimal environment for this account: PATH, HOME, USER, LOGNAME, LANG, and
        ``extra``."""
        return {"PATH": SAFE_PATH, "HOME": self.home, "USER": self.name,
                "LOGNAME": self.name, "LANG": "C.UTF-8", **extra}


@dataclass(frozen=True)
class BoxedResult:
    """How a boxed program ended and the last bytes of its output."""

    returncode: int | None  # None: killed at the timeout
    stdout: bytes  # the last ``cap`` bytes
    stderr: bytes
    stdout_bytes: int  # how many it wrote in all
    timed_out: bool


def run_boxed(argv: Sequence[str], *, account: Account, env: Mapping[str, str],
              input: bytes, timeout: float, cap: int) -> BoxedResult:
    """Run ``argv`` as ``account`` with exactly ``env``, feeding it ``input``; keep the last
    ``cap`` bytes of stdout and of stderr while reading all of them as they come.

    The program leads a process group of its own (a new session); when it exits, or at
    ``timeout`` seconds, every process left in that group is killed (SIGKILL): children it
    left behind holding its pipes end with it. FileNotFoundError/PermissionError when
    ``argv[0]`` cannot be run.
    """
    switch = os.geteuid() == 0  # (an unprivileged kvagent runs it as itself)
    proc = subprocess.Popen(
        list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=dict(env), cwd="/", start_new_session=True, close_fds=True,
        **({"user": account.uid, "group": account.gid, "extra_groups": list(account.groups)}
           if switch else {}))
    deadline = time.monotonic() + timeout
    try:
        out, err, total, timed_out = _pump(proc, input, cap, deadline)
    finally:
        _kill_group(proc)
    return BoxedResult(None if timed_out else proc.returncode, out, err, total, timed_out)


def _pump(proc: subprocess.Popen[bytes], data: bytes, cap: int,
          deadline: float) -> tuple[bytes, bytes, int, bool]:
    """Feed stdin and read stdout/stderr until the program exits (or both pipes close),
    keeping the tails; True when the deadline came first."""
    assert proc.stdin and proc.stdout and proc.stderr
    tails = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    total = after_exit = 0
    with selectors.DefaultSelector() as sel:
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            os.set_blocking(pipe.fileno(), False)
        if data:
            sel.register(proc.stdin, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        for pipe in tails:
            sel.register(pipe, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(tails[proc.stdout]), bytes(tails[proc.stderr]), total, True
            # Once the program has exited, what is left in the pipes is read without
            # waiting: a child of its own may hold them open (it is killed next).
            exited = _exited(proc)
            events = sel.select(timeout=0 if exited else min(left, 0.5))
            for key, _ in events:
                if key.fileobj is proc.stdin:
                    data = _write(proc, sel, data)
                    continue
                chunk = _read(key.fileobj)  # type: ignore[arg-type]
                if chunk is None:
                    continue
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                tail = tails[key.fileobj]  # type: ignore[index]
                tail += chunk
                del tail[:-cap]
                if key.fileobj is proc.stdout:
                    total += len(chunk)
                after_exit += len(chunk) if exited else 0
            if exited and (not events or after_exit > DRAIN_AFTER_EXIT):
                break
    while not _exited(proc):  # both pipes closed: it may still be finishing
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(tails[proc.stdout]), bytes(tails[proc.stderr]), total, True
        time.sleep(min(left, 0.05))
    return bytes(tails[proc.stdout]), bytes(tails[proc.stderr]), total, False


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the program has exited, without reaping it: its pid, and so its process
    group's id, stays taken until the group is killed (:func:`_kill_group`)."""
    return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _write(proc: subprocess.Popen[bytes], sel: selectors.BaseSelector, data: bytes) -> bytes:
    assert proc.stdin
    try:
        sent = os.write(proc.stdin.fileno(), data[:CHUNK])
    except (BrokenPipeError, BlockingIOError) as exc:
        sent = 0 if isinstance(exc, BlockingIOError) else len(data)
    data = data[sent:]
    if not data:
        sel.unregister(proc.stdin)
        proc.stdin.close()
    return data


def _read(pipe: object) -> bytes | None:
    """The next chunk; b"" at the end; None when nothing is there yet."""
    try:
        return os.read(pipe.fileno(), CHUNK)  # type: ignore[attr-defined]
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to every process of the program's group (the program itself not reaped yet,
    so the group's id is still its own), then reap the program."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()

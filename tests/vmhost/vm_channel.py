"""Run commands in a test VM from the host, through the VM's shared --out directory.

The guest runs ``python3 tests/vmhost/vm_channel.py serve`` as its scripts/vm command:
it polls ``$KVAGENT_VM_OUT/chan`` for request files and answers each with a result
file. The host side (:class:`Channel`) writes a request and waits for its result. No
network and no sshd: the --out directory is a 9p share without a cache, so each side
sees the other's files at once. Requests are handled one at a time, in order.

Used where a host program must drive the guest step by step at native speed (the
Ansible controller, through tests/vmhost/connection_plugins/kvagent_vm.py); the
programs it starts in the guest still run under TCG. Standard library only: the guest
runs it with the system Python.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

#: Seconds between looks for a request (guest) or a result (host).
POLL = 0.05
#: Seconds a request may run in the guest unless it says otherwise.
DEFAULT_TIMEOUT = 1800


class ChannelError(RuntimeError):
    """The guest did not answer: it died, or the request ran past its time."""


class Channel:
    """The host's end: ``run`` a shell command in the guest, ``put``/``fetch`` files."""

    def __init__(self, out: Path, vm: subprocess.Popen | None = None):
        self.dir = Path(out) / "chan"
        self.files = self.dir / "files"
        self.files.mkdir(parents=True, exist_ok=True)
        self.vm = vm
        self.seq = 0

    def _alive(self) -> bool:
        return self.vm is None or self.vm.poll() is None

    def wait_ready(self, timeout: float) -> None:
        """Until the guest's server has started (the VM has booted)."""
        deadline = time.monotonic() + timeout
        while not (self.dir / "ready").exists():
            if not self._alive():
                raise ChannelError(f"the VM exited ({self.vm.returncode}) before its "
                                   "channel server started")
            if time.monotonic() > deadline:
                raise ChannelError(f"the guest's channel server did not start in {timeout}s")
            time.sleep(0.2)

    def run(self, cmd: str, stdin: bytes = b"", timeout: float = DEFAULT_TIMEOUT,
            cwd: str | None = None) -> tuple[int, bytes, bytes]:
        """``/bin/sh -c cmd`` in the guest: its exit status, stdout and stderr."""
        self.seq += 1
        name = f"{self.seq:06d}"
        request = {"cmd": cmd, "stdin": base64.b64encode(stdin).decode(),
                   "timeout": timeout, "cwd": cwd}
        tmp = self.dir / f"{name}.tmp"
        tmp.write_text(json.dumps(request))
        tmp.rename(self.dir / f"{name}.req")
        result = self.dir / f"{name}.res"
        deadline = time.monotonic() + timeout + 60
        while not result.exists():
            if not self._alive():
                raise ChannelError(f"the VM exited ({self.vm.returncode}) while running "
                                   f"{cmd[:200]!r}")
            if time.monotonic() > deadline:
                raise ChannelError(f"no answer in {timeout + 60}s to {cmd[:200]!r}")
            time.sleep(POLL)
        answer = json.loads(result.read_text())
        result.unlink()
        return (answer["rc"], base64.b64decode(answer["stdout"]),
                base64.b64decode(answer["stderr"]))

    def check(self, cmd: str, timeout: float = DEFAULT_TIMEOUT, cwd: str | None = None) -> str:
        """Like :meth:`run`; a nonzero exit raises with the command's output."""
        rc, out, err = self.run(cmd, timeout=timeout, cwd=cwd)
        if rc != 0:
            raise ChannelError(f"{cmd!r} exited {rc} in the guest:\n"
                               f"{out.decode(errors='replace')[-3000:]}"
                               f"{err.decode(errors='replace')[-3000:]}")
        return out.decode(errors="replace")

    def put(self, src: str, dest: str) -> None:
        """Copy a host file to ``dest`` in the guest."""
        self.seq += 1
        staged = self.files / f"put-{self.seq:06d}"
        shutil.copyfile(src, staged)
        try:
            self.check(f"cp -- {_quote(str(staged))} {_quote(dest)}")
        finally:
            staged.unlink(missing_ok=True)

    def fetch(self, src: str, dest: str) -> None:
        """Copy a guest file to ``dest`` on the host."""
        self.seq += 1
        staged = self.files / f"fetch-{self.seq:06d}"
        try:
            self.check(f"cp -- {_quote(src)} {_quote(str(staged))}")
            shutil.copyfile(staged, dest)
        finally:
            staged.unlink(missing_ok=True)

    def stop(self) -> None:
        """Ends the guest's server (and so the VM's command, with exit status 0)."""
        (self.dir / "stop").write_text("")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def serve(out: Path) -> int:
    """The guest's end: answer requests until the host writes ``stop``."""
    chan = out / "chan"
    chan.mkdir(parents=True, exist_ok=True)
    (chan / "ready").write_text(str(os.getpid()))
    while not (chan / "stop").exists():
        requests = sorted(p for p in os.listdir(chan) if p.endswith(".req"))
        if not requests:
            time.sleep(POLL)
            continue
        for name in requests:
            _answer(chan, name[:-len(".req")])
    return 0


def _answer(chan: Path, name: str) -> None:
    request = json.loads((chan / f"{name}.req").read_text())
    (chan / f"{name}.req").unlink()
    try:
        proc = subprocess.run(["/bin/sh", "-c", request["cmd"]],
                              input=base64.b64decode(request["stdin"]), capture_output=True,
                              timeout=request["timeout"], cwd=request.get("cwd"), check=False)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stdout = 124, exc.stdout or b""
        stderr = (exc.stderr or b"") + f"\nvm_channel: timed out after {exc.timeout}s".encode()
    except OSError as exc:
        rc, stdout, stderr = 127, b"", str(exc).encode()
    tmp = chan / f"{name}.out"
    tmp.write_text(json.dumps({"rc": rc, "stdout": base64.b64encode(stdout).decode(),
                               "stderr": base64.b64encode(stderr).decode()}))
    tmp.rename(chan / f"{name}.res")


if __name__ == "__main__":
    if sys.argv[1:] != ["serve"]:
        sys.exit("usage: vm_channel.py serve   (in the guest, as scripts/vm's command)")
    sys.exit(serve(Path(os.environ["KVAGENT_VM_OUT"])))

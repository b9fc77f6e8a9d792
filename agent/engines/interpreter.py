"""Whose Python an engine's is: ``kvagent engines check`` runs the engine's code as the
owner of the interpreter's environment, never as root unless root alone could have put
that code there."""

from __future__ import annotations

import glob
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..system.boxed import Account


@dataclass(frozen=True)
class Interpreter:
    """A Python to run and the account to run it as."""

    path: str  # as given (a venv's bin/python links to the base interpreter: not resolved)
    account: Account
    environment: str  # the venv, or the interpreter as resolved: what the account owns


def interpreter(python: str) -> Interpreter:
    """The Python ``python`` names (looked up on ``$PATH`` when it has no ``/``) and whom
    it runs as: as root, the owner of its environment (the venv's directory when it is in
    one, else the interpreter as resolved), or the owner of the interpreter or of the
    venv's site-packages when that is another user; root only when root owns all of them
    and nobody else may write them (else UsageError). Not root: the caller itself."""
    found = python if "/" in python else shutil.which(python)
    if found is None:
        raise UsageError(f"--python {python}: no such program on $PATH",
                         "give the path of the Python the engine is installed in")
    path = os.path.abspath(found)
    resolved = os.path.realpath(path)
    if not os.path.isfile(resolved):
        raise UsageError(f"--python {python}: {path} is not a file",
                         "give the path of the Python the engine is installed in (e.g. "
                         "its venv's bin/python)")
    venv = Path(path).parent.parent
    environment = str(venv) if (venv / "pyvenv.cfg").is_file() else resolved
    if os.geteuid() != 0:
        return Interpreter(path, Account.of(os.geteuid(), os.getegid()), environment)
    parts = [environment, resolved]
    if environment != resolved:
        parts[1:1] = sorted(glob.glob(os.path.join(environment, "lib*", "python*",
                                                   "site-packages")))
    stats = [(p, os.stat(p)) for p in parts]
    owner = next(((p, st) for p, st in stats if st.st_uid != 0), None)
    if owner is not None:
        return Interpreter(path, Account.of(owner[1].st_uid, owner[1].st_gid), environment)
    for part, st in stats:
        if st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid != 0):
            raise UsageError(
                f"--python {python}: {part} is root's but writable by others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}, group {st.st_gid}): kvagent does not run "
                "code others may have put there as root",
                f"chmod go-w {part}, or give a Python owned by the engine's user")
    return Interpreter(path, Account.of(0, 0), environment)

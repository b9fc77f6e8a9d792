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
    it runs as. As root: the owner of its environment (the venv's directory when it is in
    one, else the interpreter as resolved), or else the first other user who owns the
    venv's ``bin`` or ``site-packages``, the interpreter, or a directory above any of
    them (whoever may swap them); root only when root owns all of that and nobody else
    may write it (else UsageError). Not root: the caller itself."""
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
    parts = [environment]
    if environment != resolved:
        parts += [os.path.dirname(path), *sorted(glob.glob(
            os.path.join(environment, "lib*", "python*", "site-packages")))]
    parts += [resolved, *_above(environment), *_above(resolved)]
    stats = [(p, os.stat(p)) for p in dict.fromkeys(parts)]
    owner = next((st for _, st in stats if st.st_uid != 0), None)
    if owner is not None:
        return Interpreter(path, Account.of(owner.st_uid, owner.st_gid), environment)
    for part, st in stats:
        if st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid != 0):
            raise UsageError(
                f"--python {python}: {part} is root's but writable by others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}, group {st.st_gid}): kvagent does not run "
                "code others may have put there as root",
                "give a Python owned by the engine's user, or one in directories only "
                "root can change")
    return Interpreter(path, Account.of(0, 0), environment)


def _above(path: str) -> list[str]:
    """The directories above ``path``, from ``/`` down."""
    return [str(p) for p in reversed(Path(path).parents)]

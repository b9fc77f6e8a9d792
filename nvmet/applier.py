"""Execute planned actions on a ConfigFS, one syscall each, in order.

EEXIST on a create (mkdir, symlink) and ENOENT on a delete (rmdir, unlink) count as
success. A failed action marks its key failed; later actions whose key, an ancestor of
their key, or one of their ``after`` keys failed are skipped (and mark their own key),
so a failing branch stops only what depends on it. Nothing is ever deleted
recursively: each rmdir is one planned action.
"""

from __future__ import annotations

import errno as E
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .configfs import ConfigFS
from .errors import NvmetError, from_oserror
from .planner import Action

log = logging.getLogger("nvmet.applier")


@dataclass(frozen=True)
class ApplyResult:
    """What happened: actions done, failed (with their error) and skipped, and the number
    of configfs writes (mutating calls) the apply performed."""

    done: tuple[Action, ...]
    failed: tuple[tuple[Action, NvmetError], ...]
    skipped: tuple[Action, ...]
    writes: int

    @property
    def ok(self) -> bool:
        """Every action succeeded."""
        return not self.failed and not self.skipped

    @property
    def changed(self) -> bool:
        """At least one action succeeded."""
        return bool(self.done)

    @property
    def errors(self) -> list[NvmetError]:
        return [err for _, err in self.failed]


def _blocked(key: str, failed: set[str]) -> bool:
    if key in failed:
        return True
    parts = key.split("/")
    return any("/".join(parts[:i]) in failed for i in range(1, len(parts)))


def _run(fs: ConfigFS, action: Action) -> None:
    if action.op == "write":
        fs.write(action.path, action.value or "")
    elif action.op == "mkdir":
        fs.mkdir(action.path)
    elif action.op == "rmdir":
        fs.rmdir(action.path)
    elif action.op == "symlink":
        fs.symlink(action.value or "", action.path)
    elif action.op == "unlink":
        fs.unlink(action.path)
    else:  # pragma: no cover - Action validates op
        raise ValueError(action.op)


def _benign(action: Action, code: int | None) -> bool:
    if action.op in ("mkdir", "symlink") and code == E.EEXIST:
        return True
    if action.op in ("rmdir", "unlink") and code == E.ENOENT:
        return True
    return action.missing_ok and code == E.ENOENT


def apply(actions: Iterable[Action], fs: ConfigFS,
          context: Mapping[str, str] | None = None) -> ApplyResult:
    """Run ``actions`` in order on ``fs``; never raises for a configfs error.

    ``context`` adds facts to every error hint (e.g. ``{"kernel": "6.1.0-..."}``).
    """
    start = fs.writes
    failed_keys: set[str] = set()
    done: list[Action] = []
    failed: list[tuple[Action, NvmetError]] = []
    skipped: list[Action] = []
    for action in actions:
        if _blocked(action.key, failed_keys) or any(_blocked(k, failed_keys)
                                                     for k in action.after):
            skipped.append(action)
            failed_keys.add(action.key)
            log.info("skipped: %s (depends on a failed action)", action)
            continue
        try:
            _run(fs, action)
        except OSError as exc:
            if _benign(action, exc.errno):
                done.append(action)
                log.debug("already so: %s (%s)", action, E.errorcode.get(exc.errno or -1))
                continue
            err = from_oserror(exc, action.op, action.path,
                               {**(context or {}), **action.context})
            failed.append((action, err))
            failed_keys.add(action.key)
            log.warning("failed: %s: %s", action, err)
            continue
        done.append(action)
        log.debug("done: %s", action)
    return ApplyResult(tuple(done), tuple(failed), tuple(skipped), fs.writes - start)

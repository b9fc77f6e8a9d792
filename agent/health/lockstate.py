"""What ``kvagent status`` (run from the CLI) knows about the apply lock.

The agent's own snapshot carries its skipped passes; the CLI builds its snapshot
itself, so it reads the agent's busy record (:mod:`agent.daemonfiles`) and looks
at the lock's holder in ``/proc/locks``. A holder that is not kvagent's user is a
problem even when no agent runs; a kvagent apply that holds it now is not.
"""

from __future__ import annotations

import os

from ..daemonfiles import read_busy
from ..lock import lock_holder, lock_path
from .snapshot import ApplyBusy


def observed_busy(run_dir: str | os.PathLike[str]) -> ApplyBusy | None:
    """The apply lock's state as the agent recorded it and as it is now; None when fine."""
    record = read_busy(run_dir)
    holder = lock_holder(lock_path(run_dir))
    if record is not None:
        return ApplyBusy(record.passes, holder or record.holder, record.since)
    if holder is not None and holder.foreign:
        return ApplyBusy(0, holder, None)
    return None

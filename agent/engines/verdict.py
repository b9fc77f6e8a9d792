"""Ask an engine's own code whether it accepts what kvagent rendered.

:func:`judge` runs the engine's checker script (:mod:`agent.engines.checks`) under the
engine's Python, feeds it the render as JSON and reads its verdict back. The script
runs in its own process as the owner of the engine's Python (never root's whole
environment), time-boxed and with its output read as it comes and capped: an engine's
import can hang, print without end, start children or crash, and none of that reaches
kvagent.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import KvagentError
from ..system.boxed import run_boxed
from .base import EngineContext, Rendered
from .checks import script
from .interpreter import interpreter

#: Seconds a checker may take (importing an engine's config code is slow under TCG).
CHECK_TIMEOUT = 300
#: Bytes of a checker's output kvagent reads.
OUTPUT_CAP = 1 << 20
VERDICTS = ("accepted", "refused", "unavailable")


@dataclass(frozen=True)
class EngineVerdict:
    """The engine's answer: ``verdict`` is accepted, refused or unavailable."""

    engine: str
    verdict: str
    engine_version: str | None
    method: str
    problems: tuple[str, ...] = ()
    messages: tuple[str, ...] = field(default_factory=tuple)
    python: str = ""
    user: str = ""  # whom the checker ran as

    @property
    def accepted(self) -> bool:
        return self.verdict == "accepted"


def payload(ctx: EngineContext, rendered: Rendered) -> dict[str, object]:
    """The JSON a checker reads (``checks/checkkit.py`` documents it)."""
    return {
        "engine": ctx.kind, "pool": ctx.pool, "format": rendered.format,
        "files": dict(rendered.files), "directories": list(ctx.directories),
        "directory_caps": list(ctx.caps()), "subdirectories": list(rendered.subdirectories),
        "tensor_parallel": ctx.tensor_parallel, "data_parallel": ctx.data_parallel,
    }


def judge(ctx: EngineContext, rendered: Rendered, python: str = "python3", *,
          pythonpath: Sequence[str] = (), timeout: float = CHECK_TIMEOUT) -> EngineVerdict:
    """Run engine ``ctx.kind``'s checker under ``python`` on ``rendered``.

    The checker runs as the owner of the interpreter's environment
    (:func:`~agent.engines.interpreter.interpreter`) with a minimal environment (PATH,
    HOME, USER, LANG: nothing of the caller's, ``pythonpath`` aside: the contract tests
    put the pinned wheel's files there), its output read as it comes with the last
    :data:`OUTPUT_CAP` bytes kept, and its whole process group killed when it ends or at
    ``timeout``. UsageError for a ``python`` that is not there (or root's but writable by
    others); KvagentError when the checker cannot be run or answers with something that
    is not a verdict.
    """
    who = interpreter(python)
    extra = {"PYTHONDONTWRITEBYTECODE": "1"}
    if pythonpath:
        extra["PYTHONPATH"] = os.pathsep.join(pythonpath)
    try:
        proc = run_boxed([who.path, str(script(ctx.kind))], account=who.account,
                         env=who.account.environment(**extra),
                         input=json.dumps(payload(ctx, rendered)).encode(), timeout=timeout,
                         cap=OUTPUT_CAP)
    except OSError as exc:
        raise KvagentError(f"cannot run {python} as {who.account.name}: "
                           f"{exc.strerror or exc}",
                           "give the Python the engine is installed in with --python") from None
    if proc.timed_out:
        raise KvagentError(f"{ctx.kind}'s checker did not answer within {timeout:g}s "
                           f"under {python} (killed, with every process it started)")
    out = proc.stdout.decode(errors="replace").strip().splitlines()
    try:
        data = json.loads(out[-1]) if out else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or data.get("verdict") not in VERDICTS:
        tail = proc.stderr[-2000:].decode(errors="replace").strip()
        raise KvagentError(f"{ctx.kind}'s checker under {python} gave no verdict (exit "
                           f"{proc.returncode})" + (f": {tail}" if tail else ""))
    return EngineVerdict(
        engine=ctx.kind, verdict=data["verdict"], engine_version=data.get("engine_version"),
        method=str(data.get("method", "")),
        problems=tuple(str(p) for p in data.get("problems", ())),
        messages=tuple(str(m) for m in data.get("messages", ())), python=python,
        user=who.account.name)

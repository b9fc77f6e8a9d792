"""Ask an engine's own code whether it accepts what kvagent rendered.

:func:`judge` runs the engine's checker script (:mod:`agent.engines.checks`) under the
engine's Python, feeds it the render as JSON and reads its verdict back. The script
runs in its own process, time-boxed and with its output capped: an engine's import can
hang, print megabytes or crash, and none of that reaches kvagent.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import KvagentError
from .base import EngineContext, Rendered
from .checks import script

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

    ``pythonpath`` is put in front of the engine's own path (the contract tests put the
    pinned wheel's files there; an operator's own PYTHONPATH, if set, follows). KvagentError
    when the checker cannot be run or answers with something that is not a verdict.
    """
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([*pythonpath, *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    argv = [python, str(script(ctx.kind))]
    try:
        proc = subprocess.run(argv, input=json.dumps(payload(ctx, rendered)), text=True,
                              capture_output=True, timeout=timeout, env=env, check=False)
    except FileNotFoundError:
        raise KvagentError(f"{python}: no such Python",
                           "give the Python the engine is installed in with --python") from None
    except subprocess.TimeoutExpired:
        raise KvagentError(f"{ctx.kind}'s checker did not answer within {timeout:g}s "
                           f"under {python}") from None
    out = proc.stdout[-OUTPUT_CAP:].strip().splitlines()
    try:
        data = json.loads(out[-1]) if out else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or data.get("verdict") not in VERDICTS:
        tail = proc.stderr[-2000:].strip()
        raise KvagentError(f"{ctx.kind}'s checker under {python} gave no verdict (exit "
                           f"{proc.returncode})" + (f": {tail}" if tail else ""))
    return EngineVerdict(
        engine=ctx.kind, verdict=data["verdict"], engine_version=data.get("engine_version"),
        method=str(data.get("method", "")),
        problems=tuple(str(p) for p in data.get("problems", ())),
        messages=tuple(str(m) for m in data.get("messages", ())), python=python)

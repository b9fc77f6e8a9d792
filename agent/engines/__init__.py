"""Engine hand-off: per-engine directories, capacity caps and rendered config snippets.

``render(kind, ctx)`` returns the files one engine reads (YAML, JSON, env or
arguments); ``KINDS`` lists the engines kvagent knows. Every key is checked
against the engine's own docs or code (docs/engines.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

from ..config.model import EngineKind
from ..errors import UsageError
from . import dynamo, lmcache, mooncake, sglang, vllm
from .base import EngineContext, Rendered

_RENDERERS: dict[str, Callable[[EngineContext], Rendered]] = {
    "lmcache": lmcache.render,
    "vllm": vllm.render,
    "dynamo": dynamo.render,
    "sglang": sglang.render,
    "mooncake": mooncake.render,
}
#: Engine kinds, in the order the config model lists them.
KINDS: tuple[str, ...] = get_args(EngineKind)

__all__ = ["KINDS", "EngineContext", "Rendered", "render"]


def render(kind: str, ctx: EngineContext) -> Rendered:
    """Render engine ``kind`` for ``ctx``; UsageError for an unknown kind or a bad context."""
    renderer = _RENDERERS.get(kind)
    if renderer is None:
        raise UsageError(f"unknown engine {kind!r}; known engines: {', '.join(KINDS)}")
    if ctx.kind != kind:
        raise UsageError(f"engine context is for {ctx.kind!r}, not {kind!r}")
    return renderer(ctx)

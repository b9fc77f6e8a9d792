"""A fake command runner for unit tests: canned results by argv prefix, calls recorded."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.system.run import CommandError, CommandResult

Response = CommandResult | Callable[[tuple[str, ...], str | None], CommandResult]


@dataclass
class FakeRunner:
    """Answers each argv with the response of the longest matching registered prefix.

    An argv that matches nothing fails the test loudly (unexpected command).
    """

    responses: list[tuple[tuple[str, ...], Response]] = field(default_factory=list)
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def on(self, prefix: Sequence[str], stdout: str = "", returncode: int = 0,
           stderr: str = "") -> FakeRunner:
        """Register a canned answer for commands starting with ``prefix``."""
        self.responses.append((tuple(prefix), CommandResult(tuple(prefix), returncode, stdout,
                                                            stderr)))
        return self

    def on_call(self, prefix: Sequence[str], fn: Callable[[tuple[str, ...], str | None],
                                                            CommandResult]) -> FakeRunner:
        """Register a function computing the answer from argv and stdin."""
        self.responses.append((tuple(prefix), fn))
        return self

    def __call__(self, argv: Sequence[str], *, timeout: float = 60.0, check: bool = True,
                 input: str | None = None,
                 env: Mapping[str, str] | None = None) -> CommandResult:
        args = tuple(str(a) for a in argv)
        self.calls.append(args)
        matches = [(p, r) for p, r in self.responses if args[: len(p)] == p]
        if not matches:
            raise AssertionError(f"unexpected command: {args}")
        _, response = max(matches, key=lambda m: len(m[0]))
        if callable(response):
            result = response(args, input)
        else:
            result = CommandResult(args, response.returncode, response.stdout, response.stderr)
        if check and result.returncode != 0:
            raise CommandError(result)
        return result

    def ran(self, *prefix: str) -> list[tuple[str, ...]]:
        """The recorded calls starting with ``prefix``."""
        return [c for c in self.calls if c[: len(prefix)] == prefix]

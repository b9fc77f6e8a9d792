"""Entry point of the ``kvagent`` command."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from .. import __version__
from ..config import CONFIG_ENV, DEFAULT_CONFIG_PATH, ConfigError
from ..errors import KvagentError
from ..log import configure_logging
from . import failure
from .failure import OUTPUT_FORMATS, OUTPUT_OPTIONS, asks_for_json


class _NoArgs(click.UsageError):
    """A command line with no arguments: the help itself is the message."""

    def __init__(self, ctx: click.Context):
        super().__init__("no command given", ctx)

    def show(self, file: Any = None) -> None:
        assert self.ctx is not None
        click.echo(self.ctx.get_help(), file=file, err=file is None)


class KvagentGroup(click.Group):
    """Turns kvagent's exceptions into one clear message and an exit code; no tracebacks.

    With ``-o json`` every failure is also an error object on stdout
    (:mod:`agent.cli.failure`). Subcommands are loaded lazily from :data:`COMMANDS`.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attr = target.split(":")
        return _accept_output_option(
            getattr(importlib.import_module(f"{__package__}.{module}"), attr))

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """No arguments at all: the help on stderr and exit 2, as click 8.2 and later do
        (older click, Debian 12's 8.1 among them, printed it on stdout and exited 0)."""
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            raise _NoArgs(ctx)
        return super().parse_args(ctx, args)

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        json_errors = asks_for_json(args)
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except click.ClickException as exc:  # the top level's options refused
            if json_errors:
                failure.print_json(failure.click_failure(exc))
            raise
        ctx.meta[JSON_ERRORS] = json_errors
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, SystemExit, KeyboardInterrupt):
            raise
        except click.ClickException as exc:  # a command line click refused: it says why
            if ctx.meta.get(JSON_ERRORS):
                failure.print_json(failure.click_failure(exc))
            raise
        except ConfigError as exc:
            for problem in exc.problems:
                click.echo(f"kvagent: config error: {problem}", err=True)
            _fail(ctx, failure.config_failure(exc))
        except KvagentError as exc:
            problems = getattr(exc, "problems", None)  # a config the agent refused
            for line in ([f"config error: {p}" for p in problems] if problems
                         else [f"error: {exc.message}"]):
                click.echo(f"kvagent: {line}", err=True)
            if exc.hint:
                click.echo(f"kvagent: hint: {exc.hint}", err=True)
            _fail(ctx, failure.error_failure(exc))
        except Exception as exc:
            verbose = (ctx.obj or {}).get("verbose", 0)
            if verbose:
                import traceback

                traceback.print_exc()
            click.echo(f"kvagent: internal error: {type(exc).__name__}: {exc}", err=True)
            if not verbose:
                click.echo("kvagent: hint: run again with -v to see where it happened",
                           err=True)
            _fail(ctx, failure.internal_failure(exc))


#: ``ctx.meta`` key: the command line asked for ``-o json`` (read before click parsed it).
JSON_ERRORS = "kvagent.json_errors"


def _fail(ctx: click.Context, what: failure.Failure) -> None:
    """Exit with ``what``'s code, after its error object on stdout under ``-o json``."""
    if (ctx.obj or {}).get("output") == "json" or ctx.meta.get(JSON_ERRORS):
        failure.print_json(what)
    sys.exit(what.exit_code)


def _set_output(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.find_root().obj["output"] = value


def _accept_output_option(cmd: click.Command) -> click.Command:
    """Let ``-o/--output`` follow the subcommand too (``kvagent status -o json``)."""
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            _accept_output_option(sub)
    elif not any(p.name == "output" for p in cmd.params):
        cmd.params.append(click.Option(
            [*OUTPUT_OPTIONS, "output"], type=click.Choice(OUTPUT_FORMATS), default=None,
            expose_value=False, callback=_set_output,
            help="Result format (same as the global -o)."))
    return cmd


@click.group(cls=KvagentGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-c", "--config", "config_file", metavar="FILE", envvar=CONFIG_ENV,
              help=f"Config file [default: {DEFAULT_CONFIG_PATH}; env {CONFIG_ENV}].")
@click.option(*OUTPUT_OPTIONS, "output", type=click.Choice(OUTPUT_FORMATS), default="text",
              show_default=True,
              help="Result format on stdout (--output-format: nvme-cli's spelling).")
@click.option("-v", "--verbose", count=True, help="More logging (on stderr).")
@click.version_option(__version__, "--version", prog_name="kvagent")
@click.pass_context
def main(ctx: click.Context, config_file: str | None, output: str, verbose: int) -> None:
    """kvagent: KV-cache pools over NVMe-oF, from storage host to inference engine.

    Storage hosts export pools with the kernel NVMe target (nvmet) over
    NVMe/TCP and NVMe/RDMA; GPU hosts connect, mount and hand them to
    inference engines; every host reports health.

    Results go to stdout (-o json for scripts), logs to stderr.
    Exit codes: 0 success, 1 failed, 2 bad usage or config.
    """
    configure_logging(verbose)
    ctx.obj = {"config_file": config_file, "output": output, "verbose": verbose}


#: Commands by name -> "module:attribute", imported only when used (start-up time
#: matters: every kvagent invocation pays it, and the VM test tier pays it many times).
COMMANDS = {
    "apply": "apply_cmd:apply",
    "bench": "bench_cmd:bench",
    "config": "config_cmd:config_group",
    "engines": "engines_cmd:engines_group",
    "keys": "keys_cmd:keys_group",
    "plan": "apply_cmd:plan",
    "pool": "pool_cmd:pool_group",
    "run": "run_cmd:run",
    "status": "status_cmd:status",
    "target": "target_cmd:target_group",
    "wait": "wait_cmd:wait",
}


def entry() -> None:
    """The ``kvagent`` process (its console script and ``python -m agent``): runs
    :func:`main`, then ends the process without the interpreter's teardown.

    Freeing every module and object one by one is about a tenth of a short command's
    wall time (``kvagent status``, ``--version``) and does nothing for the operator. What
    a normal exit does that matters still happens first: the exit functions run (logging
    flushes its handlers) and stdout and stderr are flushed. A normal exit is kept
    where it could differ: another thread still alive (the interpreter would wait for
    it), an exit code that is not a number (click prints it), or a stream that cannot be
    flushed (a closed pipe: the interpreter reports it as it always did).
    """
    try:
        main()
    except SystemExit as exc:
        code = exc.code if exc.code is not None else 0
        if not isinstance(code, int) or not _ready_to_leave():
            raise
        os._exit(code)


def _ready_to_leave() -> bool:
    """Run the exit functions and flush stdout and stderr; False if the process should
    exit the normal way instead (another thread alive, a stream that will not flush)."""
    import atexit
    import threading

    if threading.active_count() > 1:
        return False
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return False
    return True

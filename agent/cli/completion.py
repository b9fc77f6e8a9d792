"""Shell completion scripts for kvagent: click's own, for bash, zsh and fish.

Each script is what ``_KVAGENT_COMPLETE=<shell>_source kvagent`` prints: a small
shell function that asks kvagent itself for the completions at every TAB, so the
commands and options it offers are always the installed CLI's. The Debian package
runs ``python3 -m agent.cli.completion debian/kvagent`` to install them where each
shell looks for vendor completions.
"""

from __future__ import annotations

import sys
from pathlib import Path

from click.shell_completion import get_completion_class

from .main import main

PROG = "kvagent"
#: click's environment variable for ``kvagent``: _{PROG}_COMPLETE, upper-cased.
COMPLETE_VAR = "_KVAGENT_COMPLETE"
#: Where each shell's vendor completions live (paths under the install root).
INSTALL_PATHS = {
    "bash": "usr/share/bash-completion/completions/kvagent",
    "zsh": "usr/share/zsh/vendor-completions/_kvagent",
    "fish": "usr/share/fish/vendor_completions.d/kvagent.fish",
}


def completion_script(shell: str) -> str:
    """The completion script for ``shell`` (bash, zsh or fish)."""
    cls = get_completion_class(shell)
    if cls is None:
        raise ValueError(f"no click completion for shell {shell!r}")
    return cls(main, {}, PROG, COMPLETE_VAR).source()


def install_scripts(root: str | Path) -> list[Path]:
    """Write every shell's script under ``root`` (e.g. debian/kvagent); returns the paths."""
    written = []
    for shell, rel in INSTALL_PATHS.items():
        path = Path(root) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(completion_script(shell))
        written.append(path)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m agent.cli.completion ROOT")
    for p in install_scripts(sys.argv[1]):
        print(p)

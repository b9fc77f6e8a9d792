"""Shell completion (click's) for bash, zsh and fish, as the Debian package installs it.

Each generated script is sourced by the real shell and asked to complete, so the
script, click's completion protocol and the CLI are checked together. The scripts
call the ``kvagent`` on PATH: this environment's console script.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli.completion import COMPLETE_VAR, INSTALL_PATHS, completion_script, install_scripts

VENV_BIN = Path(sys.executable).parent


def shell(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run scripts/setup (completion tests need it)")
    return path


def env() -> dict[str, str]:
    # PYTHONPATH kept: a second checkout run with the main checkout's venv completes with
    # its own kvagent.
    return {"PATH": f"{VENV_BIN}{os.pathsep}/usr/bin:/bin", "LANG": "C.UTF-8",
            "HOME": "/nonexistent",
            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("root")
    install_scripts(root)
    return {sh: root / rel for sh, rel in INSTALL_PATHS.items()}


def bash_complete(script: Path, *words: str) -> list[str]:
    cword = len(words) - 1
    quoted = " ".join(f"'{w}'" for w in words)
    proc = subprocess.run(
        [shell("bash"), "--norc", "--noprofile", "-c",
         f"source {script}; COMP_WORDS=({quoted}); COMP_CWORD={cword}; "
         '_kvagent_completion kvagent; printf "%s\\n" "${COMPREPLY[@]}"'],
        capture_output=True, text=True, timeout=60, check=False, env=env())
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_the_scripts_are_click_s_own_for_kvagent() -> None:
    """What the package installs is what `_KVAGENT_COMPLETE=<shell>_source kvagent` prints."""
    for sh in INSTALL_PATHS:
        proc = subprocess.run([str(VENV_BIN / "kvagent")], capture_output=True, text=True,
                              timeout=60, check=False,
                              env={**env(), COMPLETE_VAR: f"{sh}_source"})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == completion_script(sh).strip(), sh


def test_install_paths_are_the_shells_vendor_directories(scripts: dict[str, Path]) -> None:
    assert INSTALL_PATHS == {
        "bash": "usr/share/bash-completion/completions/kvagent",
        "zsh": "usr/share/zsh/vendor-completions/_kvagent",
        "fish": "usr/share/fish/vendor_completions.d/kvagent.fish",
    }
    assert all(p.stat().st_size > 0 for p in scripts.values())
    assert scripts["zsh"].read_text().startswith("#compdef kvagent")


@pytest.mark.parametrize(("words", "expected"), [
    (("kvagent", "po"), ["pool"]),
    (("kvagent", "pool", "d"), ["destroy"]),
    (("kvagent", "config", ""), ["validate"]),
    (("kvagent", "status", "--no"), ["--no-drives"]),
    (("kvagent", "engines", "render", "kv", "--engine", "l"), ["lmcache"]),
    # nvme-cli's spelling of -o/--output, before and after the command
    (("kvagent", "--output-f"), ["--output-format"]),
    (("kvagent", "status", "--output-f"), ["--output-format"]),
    (("kvagent", "plan", "--output-format", "j"), ["json"]),
])
def test_bash_completes(scripts: dict[str, Path], words: tuple[str, ...],
                        expected: list[str]) -> None:
    assert bash_complete(scripts["bash"], *words) == expected


def test_bash_completes_every_command(scripts: dict[str, Path]) -> None:
    assert bash_complete(scripts["bash"], "kvagent", "") == [
        "apply", "bench", "config", "engines", "keys", "plan", "pool", "run", "status", "target",
        "wait"]


def test_zsh_completes(scripts: dict[str, Path]) -> None:
    """zsh -f with compsys's builtins stubbed to print what the script hands them."""
    proc = subprocess.run(
        [shell("zsh"), "-f", "-c",
         "compdef() { :; }; _describe() { print -l -- \"${(@P)3}\"; }; "
         "compadd() { print -l -- \"${(@P)${@[-1]}}\"; }; "
         f"source {scripts['zsh']}; words=(kvagent po); CURRENT=2; _kvagent_completion"],
        capture_output=True, text=True, timeout=60, check=False, env=env())
    assert proc.returncode == 0, proc.stderr
    assert [line.split(":", 1)[0] for line in proc.stdout.split("\n") if line] == ["pool"]


def test_fish_completes(scripts: dict[str, Path]) -> None:
    proc = subprocess.run(
        [shell("fish"), "--no-config", "-c",
         f"source {scripts['fish']}; complete -C 'kvagent po'; "
         "complete -C 'kvagent engines render kv --engine '"],
        capture_output=True, text=True, timeout=60, check=False, env=env())
    assert proc.returncode == 0, proc.stderr
    values = [line.split("\t", 1)[0] for line in proc.stdout.splitlines()]
    assert values == ["pool", "dynamo", "lmcache", "mooncake", "sglang", "vllm"], proc.stdout

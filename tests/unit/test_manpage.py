"""docs/kvagent.8 must be what agent.cli.manpage generates from the CLI (drift test)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import click
import pytest

from agent.cli.main import main
from agent.cli.manpage import render_manpage

PAGE = Path(__file__).resolve().parents[2] / "docs" / "kvagent.8"


def test_committed_man_page_matches_the_cli() -> None:
    assert PAGE.read_text() == render_manpage(), (
        "docs/kvagent.8 is out of date; run `.venv/bin/python -m agent.cli.manpage "
        "docs/kvagent.8`")


def _leaf_commands(group: click.Group, ctx: click.Context, path: str):
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None
        sub = click.Context(cmd, info_name=name, parent=ctx)
        if isinstance(cmd, click.Group):
            yield from _leaf_commands(cmd, sub, f"{path} {name}")
        else:
            yield f"{path} {name}", cmd, sub


def test_every_command_and_option_is_on_the_page() -> None:
    """Walks the CLI independently of the generator: nothing is left out."""
    page = render_manpage().replace("\\-", "-")
    root = click.Context(main, info_name="kvagent", **main.context_settings)
    for opt in ("--config", "--output", "--output-format", "--verbose", "--version"):
        assert f".B -{opt[1:]}" in page or f", {opt}" in page, opt
    leaves = list(_leaf_commands(main, root, "kvagent"))
    assert len(leaves) >= 11
    for path, cmd, ctx in leaves:
        assert f'.SS "{path} ' in page, path
        section = page.split(f'.SS "{path} ', 1)[1].split(".SS ", 1)[0]
        for param in cmd.get_params(ctx):
            if isinstance(param, click.Option) and "--help" not in param.opts:
                for opt in param.opts:
                    assert opt in section, f"{path}: {opt} missing from the man page"
            elif isinstance(param, click.Argument):
                assert param.human_readable_name in section.split("\n", 1)[0], (path, param)


def test_man_renders_the_page_without_warnings() -> None:
    man = shutil.which("man")
    if man is None:
        pytest.fail("man is not installed: run scripts/setup (package man-db)")
    proc = subprocess.run([man, "--warnings", "-E", "UTF-8", "-l", "-Tutf8", str(PAGE)],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "MANWIDTH": "80"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr
    text = " ".join(re.sub(r".\x08", "", proc.stdout).split())
    assert "kvagent - KV-cache pools over NVMe-oF" in text
    assert "kvagent pool destroy [OPTIONS] NAME" in text

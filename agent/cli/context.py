"""What every command gets from the global options."""

from __future__ import annotations

import click

from ..config import Config, load_config


def load_cli_config() -> Config:
    """The config named by -c/--config, $KVAGENT_CONFIG or the default path."""
    ctx = click.get_current_context()
    return load_config((ctx.find_root().obj or {}).get("config_file"))

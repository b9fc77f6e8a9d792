"""``python -m agent`` runs the kvagent command line."""

from agent.cli.main import entry

entry()

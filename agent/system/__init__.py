"""Seams to the outside world: running commands (argv only, always with a timeout)."""

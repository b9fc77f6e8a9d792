"""The ``kvagent`` command line (click)."""

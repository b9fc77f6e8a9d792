"""The engines' own verdict on what kvagent rendered.

Each ``check_<kind>.py`` here is a standalone script run by the engine's Python (the
one the engine is installed in, ``kvagent engines check --python``; in the contract
tests, kvagent's venv with the pinned wheel's files on ``PYTHONPATH``). It imports
nothing of kvagent, only the standard library, :mod:`checkkit` (beside it) and the
engine's own modules; reads the render as JSON on stdin (see ``checkkit.Payload``) and
prints one JSON verdict (``checkkit.emit``).
"""

from pathlib import Path

#: Where the checker scripts lie (run as files, never imported by kvagent).
CHECKS_DIR = Path(__file__).resolve().parent


def script(kind: str) -> Path:
    """The checker script of engine ``kind``."""
    return CHECKS_DIR / f"check_{kind}.py"

"""Read the live nvmet tree from any :class:`ConfigFS`: :func:`read`, the one entry point.

Two ways to read, both live every time (nothing is cached between reads):

* the full read (``read(fs)``, :func:`nvmet.reader.read`): every attribute file, found by
  listing directories (like nvmetcli's globbing), so attributes that newer kernels add are
  read without code changes — for ``kvagent target show`` and nvmetcli export;
* the planner's read (``read(fs, spec=read_spec(desired, features))``,
  :func:`nvmet.specread.read_planned`): only the files a :class:`~nvmet.readspec.ReadSpec`
  names (what the planner needs plus what the desired tree mentions), one open/read/close
  per file and one listing per directory that holds objects or links — the converged
  pass's cost. Attributes outside the spec are absent from the result (``None`` for a
  namespace's fields, ``""`` for an unread ANA state).

A failed read raises :class:`~nvmet.errors.ReadError`; it never returns a partial or
empty tree. This module sits above both reads, which do not import each other.
"""

from __future__ import annotations

from . import reader, specread
from .configfs import ConfigFS
from .model import Tree
from .readspec import ReadSpec


def read(fs: ConfigFS, spec: ReadSpec | None = None) -> Tree:
    """The live tree: every attribute (``spec`` None), or only the files ``spec`` names.

    Raises NvmetUnavailable (no nvmet) or ReadError (any failure).
    """
    if spec is not None:
        return specread.read_planned(fs, spec)
    return reader.read(fs)

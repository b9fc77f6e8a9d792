"""A small library for the Linux kernel NVMe-oF target (nvmet) through configfs.

Typed model (:mod:`nvmet.model`), a filesystem seam (:mod:`nvmet.configfs`, with an
in-memory kernel-like fake in :mod:`nvmet.fake`), a live reader with feature detection
(:mod:`nvmet.reader`; the planner's narrower read in :mod:`nvmet.readspec` and
:mod:`nvmet.specread`; :func:`read`, in :mod:`nvmet.liveread`, picks one; what they share
in :mod:`nvmet.readbase`), a pure planner (:mod:`nvmet.planner`), an ordered applier with
errno-typed errors (:mod:`nvmet.applier`, :mod:`nvmet.errors`) and nvmetcli JSON
import/export (:mod:`nvmet.nvmetcli`). It knows nothing about pools or engines.
"""

from .applier import ApplyResult, apply
from .configfs import ConfigFS, Entry, RealConfigFS
from .errors import NvmetError
from .liveread import read
from .model import Host, Namespace, Port, Referral, Subsystem, Tree
from .planner import Action, Scope, plan
from .readbase import Features
from .reader import features
from .readspec import ReadSpec, read_spec
from .specread import read_more

__all__ = [
    "Action",
    "ApplyResult",
    "ConfigFS",
    "Entry",
    "Features",
    "Host",
    "Namespace",
    "NvmetError",
    "Port",
    "ReadSpec",
    "RealConfigFS",
    "Referral",
    "Scope",
    "Subsystem",
    "Tree",
    "apply",
    "features",
    "plan",
    "read",
    "read_more",
    "read_spec",
]

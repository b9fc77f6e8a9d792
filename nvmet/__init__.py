"""A small library for the Linux kernel NVMe-oF target (nvmet) through configfs.

Typed model (:mod:`nvmet.model`), a filesystem seam (:mod:`nvmet.configfs`, with an
in-memory kernel-like fake in :mod:`nvmet.fake`), a live reader with feature detection
(:mod:`nvmet.reader`; the planner's narrower read in :mod:`nvmet.readspec` and
:mod:`nvmet.specread`; :func:`read`, in :mod:`nvmet.liveread`, picks one; what they share
in :mod:`nvmet.readbase`), a pure planner (:mod:`nvmet.planner`), an ordered applier with
errno-typed errors (:mod:`nvmet.applier`, :mod:`nvmet.errors`) and nvmetcli JSON
import/export (:mod:`nvmet.nvmetcli`). It knows nothing about pools or engines.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

#: Names imported from their submodule at first use (a program that needs only
#: :mod:`nvmet.nqn`, say, does not pay for the planner and the applier).
_LAZY = {
    **dict.fromkeys(("ApplyResult", "apply"), "applier"),
    **dict.fromkeys(("ConfigFS", "Entry", "RealConfigFS"), "configfs"),
    "NvmetError": "errors",
    "read": "liveread",
    **dict.fromkeys(("Host", "Namespace", "Port", "Referral", "Subsystem", "Tree"), "model"),
    **dict.fromkeys(("Action", "Scope", "plan"), "planner"),
    "Features": "readbase",
    "features": "reader",
    **dict.fromkeys(("ReadSpec", "read_spec"), "readspec"),
    "read_more": "specread",
}


def __getattr__(name: str) -> Any:
    import importlib
    import importlib.util

    module = _LAZY.get(name)
    if module is None:
        # A submodule used as an attribute (``nvmet.model``), as after an eager import.
        if importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return importlib.import_module(f"{__name__}.{name}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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

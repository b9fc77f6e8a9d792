"""What the reads of the live tree share, below all of them: the availability check, the
read error, the parsing of object directory names and attribute file prefixes, and the
:class:`Features` record.

:mod:`nvmet.reader` (the full read, feature detection), :mod:`nvmet.readspec` (what the
planner's read reads) and :mod:`nvmet.specread` (the planner's read) import this module;
it imports none of them.
"""

from __future__ import annotations

import errno as E
from collections.abc import Mapping
from dataclasses import dataclass, field

from .configfs import ConfigFS, join
from .errors import NvmetUnavailable, ReadError
from .model import FrozenMap

NOT_LOADED_HINT = ("load the target driver and mount configfs: 'modprobe nvmet' (and "
                   "nvmet-tcp / nvmet-rdma), 'mount -t configfs none /sys/kernel/config'")


def read_error(path: str, exc: OSError) -> ReadError:
    """The ReadError for a failed read at ``path`` (or at the relative path ``exc`` names:
    ``read_attrs`` and ``children`` name the file that failed)."""
    if isinstance(exc.filename, str) and exc.filename and not exc.filename.startswith("/"):
        path = exc.filename
    return ReadError(f"cannot read nvmet configfs at {path or '.'}: "
                     f"{exc.strerror or exc} ({E.errorcode.get(exc.errno or -1, '?')})",
                     errno=exc.errno, path=path, op="read",
                     hint="the live state is unknown; nothing was changed")


def check_available(fs: ConfigFS) -> None:
    """Raise :class:`NvmetUnavailable` unless the nvmet root with its three groups exists."""
    try:
        names = {e.name for e in fs.list("") if e.kind == "dir"}
    except OSError as exc:
        raise NvmetUnavailable(f"the nvmet configfs tree is not available ({fs!r}): "
                               f"{exc.strerror or exc}", errno=exc.errno, path="",
                               hint=NOT_LOADED_HINT) from exc
    missing = {"hosts", "ports", "subsystems"} - names
    if missing:
        raise NvmetUnavailable(f"the nvmet configfs tree ({fs!r}) lacks {sorted(missing)}",
                               path="", hint=NOT_LOADED_HINT)


def decimal_name(name: str, what: str, parent: str) -> int:
    """``name`` (listed in directory ``parent``) as a plain decimal number."""
    if not (name.isascii() and name.isdigit()) or str(int(name)) != name:
        path = join(parent, name)
        raise ReadError(f"{what} directory {path!r} is not a plain decimal number",
                        path=path, op="read",
                        hint="rename it (rmdir and mkdir with a decimal name); it was not "
                             "created by this library")
    return int(name)


def prefixed(files: Mapping[str, str], prefix: str) -> dict[str, str]:
    """The files whose names start with ``prefix``, by the rest of their name."""
    return {k[len(prefix):]: v for k, v in files.items() if k.startswith(prefix)}


@dataclass(frozen=True)
class Features:
    """Attribute files this kernel offers, per object kind (``None`` = not known: no object
    of that kind existed to look at). Detected by file presence, never by version."""

    kernel: str | None = None
    files: Mapping[str, frozenset[str] | None] = field(default_factory=FrozenMap)

    def has(self, kind: str, attribute: str) -> bool | None:
        """True/False when known, None when no object of ``kind`` could be inspected."""
        known = self.files.get(kind)
        return None if known is None else attribute in known

    @property
    def dhchap(self) -> bool | None:
        """DH-HMAC-CHAP (NVME_TARGET_AUTH): hosts have dhchap_key."""
        return self.has("host", "dhchap_key")

    @property
    def tsas(self) -> bool | None:
        """Transport-specific address subtype (TLS): ports have addr_tsas."""
        return self.has("port", "addr_tsas")

    @property
    def reservations(self) -> bool | None:
        """Persistent reservations: namespaces have resv_enable."""
        return self.has("namespace", "resv_enable")

    @property
    def qid_max(self) -> bool | None:
        """Per-subsystem queue limit: subsystems have attr_qid_max."""
        return self.has("subsystem", "attr_qid_max")

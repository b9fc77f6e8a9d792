"""Intent records of the volume groups kvagent is creating.

Before kvagent labels a device as an LVM physical volume it records, in
``<state_dir>/lvm-intents/<volume group>.json``, the group it is making, for which pool,
on which devices, and the PV uuid it will give each device's label (``pvcreate --uuid``).
The record goes once ``vgcreate`` has made the group. A pass killed in between leaves
PVs that belong to no group: the next apply finds the record, proves each label is the
one it names (same PV uuid, in no group, nothing else on the device) and finishes the
group. Without a record, a labelled device is foreign like any other signature and
refused (:func:`agent.target.safety.ensure_blank`): kvagent never takes over a label it
did not write.

A record is hostile input like anything on disk: its directory must be a real directory
(not a symlink) of kvagent's user that no group or other user can write, the file is
opened below it with ``O_NOFOLLOW`` and must be a regular file of kvagent's user that no
one else can write, and its content must be exactly what kvagent writes (the keys, the
group's name, device paths under ``/dev``, PV uuids in LVM's format). Anything else is
refused with the file and the way out, and acted on in no way.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import stat
import string
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from ... import failpoints
from ...config.types import BlankDevice, Name, VolumeGroupName
from ...errors import KvagentError
from ...records import SCHEMA
from ...state import trust_problem

#: The directory of the intent records, below ``node.state_dir``.
INTENT_DIR = "lvm-intents"
#: The most a record may hold (kvagent's are a few hundred bytes per device).
MAX_BYTES = 64 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PV_UUID_RE = re.compile(r"^[A-Za-z0-9]{6}(?:-[A-Za-z0-9]{4}){5}-[A-Za-z0-9]{6}$")
_KEYS = {"schema", "kind", "volume_group", "pool", "pvs"}
_PV_KEYS = {"path", "pv_uuid"}


class IntentError(KvagentError):
    """An intent record kvagent did not write, or in a place it does not trust."""


@dataclass(frozen=True)
class PvIntent:
    """One device of a group being made: its configured path and its label's PV uuid."""

    path: str
    pv_uuid: str


@dataclass(frozen=True)
class VgIntent:
    """A volume group kvagent is making: for which pool, on which devices."""

    volume_group: str
    pool: str
    pvs: tuple[PvIntent, ...]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(pv.path for pv in self.pvs)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "kind": "vgcreate", "volume_group": self.volume_group,
                "pool": self.pool,
                "pvs": [{"path": pv.path, "pv_uuid": pv.pv_uuid} for pv in self.pvs]}


def new_pv_uuid() -> str:
    """A fresh PV uuid in LVM's format (32 letters and digits, grouped 6-4-4-4-4-4-6)."""
    chars = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(32))
    return "-".join(chars[a:b] for a, b in pairwise((0, 6, 10, 14, 18, 22, 26, 32)))


def new_intent(volume_group: str, pool: str, devices: Sequence[str]) -> VgIntent:
    """The record of a group about to be made on ``devices``, each with a fresh PV uuid."""
    return VgIntent(volume_group, pool, tuple(PvIntent(d, new_pv_uuid()) for d in devices))


def intent_path(state_dir: Path | str, volume_group: str) -> Path:
    """Where the intent record of ``volume_group`` lives."""
    return Path(state_dir) / INTENT_DIR / f"{volume_group}.json"


def _file_name(volume_group: str) -> str:
    """The record's file name; the group's name is checked first (no ``/``, no ``..``)."""
    try:
        VolumeGroupName.parse(volume_group)
    except ValueError as exc:
        raise IntentError(f"no intent record for volume group {volume_group!r}: {exc}") from None
    return f"{volume_group}.json"


def _check_private(fd: int, display: Path, what: str) -> os.stat_result:
    """Refuse ``fd`` unless it may hold kvagent's records (:func:`agent.state.trust_problem`,
    the rule every record is read under)."""
    st = os.fstat(fd)
    problem = trust_problem(st)
    if problem:
        me = os.geteuid()
        raise IntentError(
            f"{display} ({what}) {problem}: another user could write kvagent's intent "
            "records there, so kvagent does not read them",
            f"make it uid {me}'s and not group- or world-writable (chown {me} {display}; "
            f"chmod go-w {display}), or remove it")
    return st


@contextlib.contextmanager
def _intent_dir(state_dir: Path | str, *, create: bool) -> Iterator[int | None]:
    """The intent directory, opened below the state directory without following a link
    (None when it does not exist and ``create`` is false)."""
    state, display = Path(state_dir), Path(state_dir) / INTENT_DIR
    if create:
        state.mkdir(parents=True, exist_ok=True)
    try:  # the configured state directory itself may be a link; nothing below it
        top = os.open(state, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if create:
            raise
        yield None
        return
    try:
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(INTENT_DIR, 0o700, dir_fd=top)
        try:
            fd = os.open(INTENT_DIR, _DIR_FLAGS, dir_fd=top)
        except FileNotFoundError:
            yield None
            return
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise IntentError(f"{display} is a symlink or not a directory; kvagent keeps "
                                  "its intent records only in a real directory",
                                  f"remove {display}") from None
            raise
        try:
            _check_private(fd, display, "kvagent's intent directory")
            yield fd
        finally:
            os.close(fd)
    finally:
        os.close(top)


def read_intent(state_dir: Path | str, volume_group: str) -> VgIntent | None:
    """The intent record of ``volume_group`` (None if there is none); IntentError for a
    record kvagent would not have written, or one in a place it does not trust."""
    name = _file_name(volume_group)
    display = intent_path(state_dir, volume_group)
    with _intent_dir(state_dir, create=False) as dfd:
        if dfd is None:
            return None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise IntentError(f"{display} is a symlink; kvagent never follows one to an "
                                  "intent record", f"remove {display}") from None
            raise IntentError(f"cannot read {display}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            st = _check_private(f.fileno(), display, "an intent record")
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
                raise _not_ours(display, f"not a regular file of at most {MAX_BYTES} bytes")
            raw = f.read(MAX_BYTES + 1)
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _not_ours(display, f"not JSON: {exc}") from None
    return parse_intent(data, volume_group, display)


def _not_ours(display: Path, why: str) -> IntentError:
    return IntentError(
        f"{display} is not an intent record kvagent writes ({why}); kvagent does not act "
        "on it",
        f"remove it (rm {display}) unless you know it to be kvagent's; a device carrying "
        "an LVM label is then refused as foreign, nothing is touched")


def parse_intent(data: Any, volume_group: str, display: Path) -> VgIntent:
    """``data`` as a record of ``volume_group``, if it is exactly what kvagent writes."""
    if not isinstance(data, dict) or set(data) != _KEYS:
        raise _not_ours(display, f"its keys must be {sorted(_KEYS)}")
    if type(data["schema"]) is not int or data["schema"] != SCHEMA:
        raise _not_ours(display, f"schema {data['schema']!r}, not {SCHEMA}")
    if data["kind"] != "vgcreate" or data["volume_group"] != volume_group:
        raise _not_ours(display, f"kind {data['kind']!r} of volume group "
                                 f"{data['volume_group']!r}, not vgcreate of {volume_group!r}")
    pvs = data["pvs"]
    if not isinstance(pvs, list) or not pvs:
        raise _not_ours(display, "pvs must be a list of devices")
    try:
        pool = Name.parse(data["pool"])
        out = tuple(_pv(pv) for pv in pvs)
    except ValueError as exc:
        raise _not_ours(display, str(exc)) from None
    if len({p.path for p in out}) != len(out) or len({p.pv_uuid for p in out}) != len(out):
        raise _not_ours(display, "a device or PV uuid is listed twice")
    return VgIntent(volume_group, str(pool), out)


def _pv(entry: Any) -> PvIntent:
    if not isinstance(entry, dict) or set(entry) != _PV_KEYS:
        raise ValueError(f"each device must have exactly the keys {sorted(_PV_KEYS)}")
    path = BlankDevice.parse(entry["path"])
    uuid = entry["pv_uuid"]
    if not isinstance(uuid, str) or not _PV_UUID_RE.match(uuid):
        raise ValueError(f"PV uuid {uuid!r} is not one kvagent makes")
    return PvIntent(str(path), uuid)


def write_intent(state_dir: Path | str, intent: VgIntent) -> None:
    """Record ``intent`` durably (a temporary file renamed into place, both fsynced),
    before any device is labelled."""
    name = _file_name(intent.volume_group)
    text = json.dumps(intent.to_json(), indent=2, sort_keys=True) + "\n"
    with _intent_dir(state_dir, create=True) as dfd:
        assert dfd is not None
        tmp = f".{name}.{secrets.token_hex(6)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        os.fsync(dfd)
    failpoints.step("record", str(intent_path(state_dir, intent.volume_group)))


def remove_intent(state_dir: Path | str, volume_group: str) -> None:
    """Forget the intent of ``volume_group`` (its group is made); nothing if there is none."""
    name = _file_name(volume_group)
    with _intent_dir(state_dir, create=False) as dfd:
        if dfd is None:
            return
        try:
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            return
        os.fsync(dfd)
    failpoints.step("record", str(intent_path(state_dir, volume_group)))


def has_intent(state_dir: Path | str, volume_group: str) -> bool:
    """Whether a record of ``volume_group`` exists (not read: for a group that exists)."""
    return os.path.lexists(intent_path(state_dir, volume_group))

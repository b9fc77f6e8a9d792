"""This host's NVMe identity: ``<nvme_dir>/hostnqn`` and ``<nvme_dir>/hostid``.

Storage hosts admit a GPU host by its host NQN, so it must be unique per
host and stable. kvagent reads both files, creates the missing ones (never
overwrites an existing one) and warns loudly about identities that are
likely shared between machines:

- a host NQN of the form ``nqn.2014-08.org.nvmexpress:uuid:<u>`` whose ``<u>``
  differs from ``hostid`` (nvme-cli and the kernel treat them as a pair; on the
  6.1 kernel a second hostid for the same host NQN even overwrites the one
  live controllers show);
- a well-known default NQN that distribution images ship
  (:data:`nvmet.nqn.WELL_KNOWN_DEFAULT_HOSTNQNS`).

Not detectable here: ``nvme gen-hostnqn`` (and libnvme when the files are
missing) derives the NQN from the DMI ``product_uuid``; VMs cloned with the
same firmware uuid then get the *same* NQN. Each clone looks fine on its own;
only the storage host can see two hosts presenting one NQN. Regenerate the
files (delete them and let kvagent create random ones) on cloned images.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nvmet.nqn import WELL_KNOWN_DEFAULT_HOSTNQNS, InvalidNQN, validate_nqn

from .. import effects
from ..errors import KvagentError
from ..log import get_logger

log = get_logger("initiator.identity")

UUID_NQN_PREFIX = "nqn.2014-08.org.nvmexpress:uuid:"
FILE_MODE = 0o644


_WARNED: set[str] = set()


class IdentityError(KvagentError):
    """The identity files exist but cannot be used (kvagent does not overwrite them)."""


@dataclass(frozen=True)
class HostIdentity:
    """This host's NVMe identity and what kvagent noticed about it."""

    hostnqn: str
    hostid: str
    created: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def suspect(self) -> bool:
        """True when the identity may be shared with other hosts (see ``warnings``)."""
        return bool(self.warnings)


def uuid_of_nqn(hostnqn: str) -> str | None:
    """The uuid inside ``nqn.2014-08.org.nvmexpress:uuid:<uuid>``, lower case; else None."""
    if not hostnqn.startswith(UUID_NQN_PREFIX):
        return None
    try:
        return str(uuidlib.UUID(hostnqn[len(UUID_NQN_PREFIX):]))
    except ValueError:
        return None


def identity_warnings(hostnqn: str, hostid: str) -> tuple[str, ...]:
    """Reasons to suspect the identity is shared or inconsistent (empty: looks fine)."""
    found = []
    if hostnqn in WELL_KNOWN_DEFAULT_HOSTNQNS:
        found.append(f"host NQN {hostnqn} is a well-known default that cloned images share; "
                     "every host using it is the same host to a storage host")
    nqn_uuid = uuid_of_nqn(hostnqn)
    if nqn_uuid is not None and nqn_uuid != hostid.lower():
        found.append(f"host NQN uuid {nqn_uuid} and hostid {hostid} disagree")
    if hostid.lower() == str(uuidlib.UUID(int=0)):
        found.append("hostid is the all-zero uuid (a default, shared by clones)")
    return tuple(found)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise IdentityError(f"cannot read {path}: {exc.strerror}",
                            "check the file's permissions") from None


def _create(path: Path, value: str) -> bool:
    """Write ``value`` to ``path`` atomically if it does not exist; False if it appeared."""
    effects.make_dirs(path.parent, 0o755)
    # a temp file linked into place: atomic, and fails if someone created it meanwhile
    return effects.create_file(path, value + "\n", FILE_MODE)


def _check_hostnqn(path: Path, value: str) -> str:
    try:
        return validate_nqn(value)
    except InvalidNQN as exc:
        raise IdentityError(f"{path}: host NQN {value!r} {exc}",
                            f"fix {path} or remove it so kvagent creates one") from None


def _check_hostid(path: Path, value: str) -> str:
    try:
        uuidlib.UUID(value)
    except ValueError:
        raise IdentityError(f"{path}: hostid {value!r} is not a uuid",
                            f"fix {path} or remove it so kvagent creates one") from None
    return value


def ensure_host_identity(nvme_dir: Path | str = "/etc/nvme", *,
                         new_uuid: Callable[[], uuidlib.UUID] = uuidlib.uuid4) -> HostIdentity:
    """Read this host's identity, creating missing files (mode 0644, never overwriting).

    A missing hostid takes the uuid of a uuid-form host NQN; a missing host NQN
    is made from the hostid; both missing get one new random uuid. Suspicious
    identities are logged as warnings and flagged in the result.
    """
    base = Path(nvme_dir)
    nqn_path, id_path = base / "hostnqn", base / "hostid"
    hostnqn, hostid = _read(nqn_path), _read(id_path)
    if hostnqn == "":
        raise IdentityError(f"{nqn_path} is empty", f"remove {nqn_path} so kvagent creates one")
    if hostid == "":
        raise IdentityError(f"{id_path} is empty", f"remove {id_path} so kvagent creates one")
    if hostnqn is not None:
        _check_hostnqn(nqn_path, hostnqn)
    if hostid is not None:
        _check_hostid(id_path, hostid)

    created: list[str] = []
    if hostnqn is None or hostid is None:
        fresh = str(new_uuid())
        if hostid is None:
            hostid = uuid_of_nqn(hostnqn) if hostnqn else None
            hostid = hostid or fresh
            if not _create(id_path, hostid):
                hostid = _check_hostid(id_path, _read(id_path) or "")
            else:
                created.append(str(id_path))
        if hostnqn is None:
            hostnqn = UUID_NQN_PREFIX + str(uuidlib.UUID(hostid))
            if not _create(nqn_path, hostnqn):
                hostnqn = _check_hostnqn(nqn_path, _read(nqn_path) or "")
            else:
                created.append(str(nqn_path))
        for path in created:
            log.info("created host identity file", path=path)

    warnings = identity_warnings(hostnqn, hostid)
    for text in warnings:
        if text in _WARNED:
            continue  # once per process: the agent checks on every pass
        _WARNED.add(text)
        log.warning("HOST IDENTITY PROBLEM: " + text, hostnqn=hostnqn, hostid=hostid,
                    nvme_dir=str(base))
    return HostIdentity(hostnqn=hostnqn, hostid=hostid, created=tuple(created),
                        warnings=warnings)

"""kvagent's records: typed, versioned, in one place.

Records are how kvagent proves what it owns and what each namespace is bound to.
All of them live under ``node.state_dir`` except a file pool's manifest, which lives
in the pool's directory next to the files it lists:

=====================  =============================================================
``target.json``        :class:`TargetRecords`: this host's export identity (node name,
                       NQN prefix), nvmet ports and host entries kvagent created, pools
                       exported, whole-device claims, and each namespace's binding
                       (uuid, nguid and the storage behind it)
``initiator.json``     :class:`InitiatorRecords`: what each pool's attach connected,
                       found and mounted
``last-apply.json``    the last apply's result (:func:`write_last_apply`)
``probes/<pool>.json`` a GPU pool's probe results
``engines/<pool>/``    rendered engine configs
``lvm-intents/<vg>.json``  a volume group kvagent is making (devices, PV uuids), until
                       ``vgcreate`` made it (:mod:`agent.target.backings.lvm_intent`)
``<dir>/<pool>/.kvagent-pool.json``  :class:`FileManifest` of a file pool
=====================  =============================================================

Every file carries ``"schema"``; files written before schemas existed (schema 1:
``target.json`` without it, ``device-claims.json`` beside it, manifests mapping a path
to a size) are read and migrated, and written back as schema 2 by the next apply. A
file from a newer kvagent is refused rather than guessed at.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from . import effects
from .fabrics import FabricsAddress
from .state import StateError, json_text, read_json, write_json, write_json_text

SCHEMA = 2
TARGET_FILE = "target.json"
V1_CLAIMS_FILE = "device-claims.json"
INITIATOR_FILE = "initiator.json"
LAST_APPLY_FILE = "last-apply.json"
PROBES_DIR = "probes"
ENGINES_DIR = "engines"
MANIFEST_FILE = ".kvagent-pool.json"


class RecordError(StateError):
    """A record exists but kvagent cannot use it (wrong shape, newer schema)."""


def _schema(data: Any, path: Path) -> int:
    if not isinstance(data, dict):
        raise RecordError(f"{path} is not a JSON object; kvagent will not guess what it owns",
                          "restore it from backup or inspect it")
    version = data.get("schema", 1)
    if not isinstance(version, int) or version < 1:
        raise RecordError(f"{path}: schema {version!r} is not a version number")
    if version > SCHEMA:
        raise RecordError(f"{path} was written by a newer kvagent (schema {version}; this "
                          f"one reads up to {SCHEMA})",
                          "upgrade kvagent, or restore the records the older version wrote")
    return version


def recorded_path(value: Any, what: str, *, absolute: bool = True) -> str:
    """``value`` as a path field of a record: a string without NUL or ``..`` components,
    and (``absolute``) absolute and normalized — else ValueError naming ``what``.
    Records are root's (:func:`agent.state.read_record`); this keeps a corrupt one from
    pointing kvagent anywhere but where it could have written."""
    if not isinstance(value, str) or not value or "\0" in value:
        raise ValueError(f"{what} is not a path: {value!r}")
    if ".." in value.split("/"):
        raise ValueError(f"{what} {value!r} has a '..' component")
    if absolute and (not value.startswith("/") or os.path.normpath(value) != value):
        raise ValueError(f"{what} {value!r} is not an absolute, normalized path")
    return value


def _typed(path: Path, build: Any, *args: Any) -> Any:
    try:
        return build(*args)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RecordError(f"{path} is malformed ({type(exc).__name__}: {exc}); kvagent will "
                          "not guess what it owns",
                          "restore it from backup or inspect it") from None


# ------------------------------------------------------------------- target side
@dataclass(frozen=True)
class Storage:
    """What backs a namespace: the backing kind, the path nvmet opens, and what it is."""

    kind: str
    path: str
    detail: str = ""

    def describe(self) -> str:
        return f"{self.kind} {self.path}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class Binding:
    """A namespace's identity (uuid, nguid) and the storage it was bound to when exported."""

    nqn: str
    nsid: int
    uuid: str
    nguid: str
    pool: str
    host: str | None
    storage: Storage
    #: The size nvmet last read for the namespace (None: not known yet). A volume grown
    #: past it is revalidated, also when the pass that grew it was killed.
    size: int | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.nqn, self.nsid)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Binding:
        storage = dict(d["storage"])
        storage["path"] = recorded_path(storage.get("path"), "a binding's storage path",
                                        absolute=False)
        return cls(str(d["nqn"]), int(d["nsid"]), str(d["uuid"]), str(d["nguid"]),
                   str(d["pool"]), d.get("host"), Storage(**storage), d.get("size"))

    def to_json(self) -> dict[str, Any]:
        """``dataclasses.asdict(self)``, written out: every pass builds one per namespace
        (twice), and ``asdict`` deep-copies each field (most of a converged pass's time
        at 1024 namespaces)."""
        s = self.storage
        return {"nqn": self.nqn, "nsid": self.nsid, "uuid": self.uuid, "nguid": self.nguid,
                "pool": self.pool, "host": self.host,
                "storage": {"kind": s.kind, "path": s.path, "detail": s.detail},
                "size": self.size}


@dataclass(frozen=True)
class DeviceClaim:
    """A whole device kvagent exports, claimed when it was blank.

    ``uuid``/``nguid`` are the identity its namespace carries; ``wwid``, ``serial``
    and ``size`` identify the device itself and are checked on every pass. Claims from
    schema 1 have only ``device`` (the node) and ``size``.
    """

    path: str
    pool: str
    host: str | None
    device: str
    size: int | None = None
    nsid: int | None = None
    uuid: str | None = None
    nguid: str | None = None
    wwid: str | None = None
    serial: str | None = None

    @classmethod
    def from_json(cls, path: str, d: Mapping[str, Any]) -> DeviceClaim:
        known = {k: d[k] for k in ("pool", "host", "device", "size", "nsid", "uuid", "nguid",
                                   "wwid", "serial") if k in d}
        recorded_path(path, "a device claim's path")
        recorded_path(known.get("device"), f"the device of claim {path}")
        return cls(path=path, **known)


@dataclass(frozen=True)
class PoolRecord:
    """A pool kvagent exported, as its backing driver recorded it (``kind`` + parameters)."""

    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.params}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PoolRecord:
        return cls(str(d["kind"]), {k: v for k, v in d.items() if k != "kind"})


@dataclass
class TargetRecords:
    """What kvagent created and bound on this storage host (``<state_dir>/target.json``)."""

    node: str | None = None
    nqn_prefix: str | None = None
    ports: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    pools: dict[str, PoolRecord] = field(default_factory=dict)
    claims: dict[str, DeviceClaim] = field(default_factory=dict)
    bindings: dict[tuple[str, int], Binding] = field(default_factory=dict)
    #: The discovery referrals kvagent made: (port id, referral name).
    referrals: set[tuple[int, str]] = field(default_factory=set)
    #: The schema of the file these records were read from (1: migrated on save).
    read_schema: int = field(default=SCHEMA, compare=False)

    @property
    def empty(self) -> bool:
        return not (self.ports or self.hosts or self.pools or self.claims or self.bindings
                    or self.referrals)

    @classmethod
    def load(cls, state_dir: Path | str) -> TargetRecords:
        """Read (and migrate) the records; an absent file means nothing was created yet."""
        state_dir = Path(state_dir)
        path = state_dir / TARGET_FILE
        data = read_json(path, None)
        if data is None:
            records = cls()
            version = 1 if (state_dir / V1_CLAIMS_FILE).exists() else SCHEMA
        else:
            version = _schema(data, path)
            records = _typed(path, cls._from_json, data)
        if version == 1:
            claims_path = state_dir / V1_CLAIMS_FILE
            claims = read_json(claims_path, {})
            if not isinstance(claims, dict):
                raise RecordError(f"{claims_path} is not a JSON object")
            records.claims = _typed(claims_path, lambda c: {
                p: DeviceClaim.from_json(p, v) for p, v in c.items()}, claims)
            records.claims = legacy_claim_nsids(records.pools, records.claims)
        records.read_schema = version
        return records

    @classmethod
    def _from_json(cls, data: Mapping[str, Any]) -> TargetRecords:
        bindings = [Binding.from_json(b) for b in data.get("bindings", [])]
        return cls(
            node=data.get("node"), nqn_prefix=data.get("nqn_prefix"),
            ports={int(p) for p in data.get("ports", [])},
            hosts={str(h) for h in data.get("hosts", [])},
            pools={str(n): PoolRecord.from_json(p) for n, p in data.get("pools", {}).items()},
            claims={p: DeviceClaim.from_json(p, c) for p, c in data.get("claims", {}).items()},
            bindings={b.key: b for b in bindings},
            referrals={(int(pid), str(name)) for pid, name in data.get("referrals", [])})

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "node": self.node, "nqn_prefix": self.nqn_prefix,
            "ports": sorted(self.ports), "hosts": sorted(self.hosts),
            "pools": {n: p.to_json() for n, p in sorted(self.pools.items())},
            "claims": {p: {k: v for k, v in asdict(c).items() if k != "path"}
                       for p, c in sorted(self.claims.items())},
            "bindings": [b.to_json() for _, b in sorted(self.bindings.items())],
            "referrals": [[pid, name] for pid, name in sorted(self.referrals)],
        }

    def snapshot(self) -> TargetRecords:
        """A copy to compare with later (``records != snapshot``: there is something to
        save). Its containers are copied; what they hold is immutable."""
        return replace(self, ports=set(self.ports), hosts=set(self.hosts),
                       pools=dict(self.pools), claims=dict(self.claims),
                       bindings=dict(self.bindings), referrals=set(self.referrals))

    def save(self, state_dir: Path | str) -> None:
        """Write schema 2 atomically; a schema-1 claims file goes once its content is in."""
        state_dir = Path(state_dir)
        write_json(state_dir / TARGET_FILE, self.to_json())
        effects.unlink(state_dir / V1_CLAIMS_FILE, missing_ok=True, kind="record.remove")
        self.read_schema = SCHEMA

    def pool_bindings(self, pool: str) -> list[Binding]:
        return [b for b in self.bindings.values() if b.pool == pool]

    def pool_claims(self, pool: str) -> dict[str, DeviceClaim]:
        return {p: c for p, c in self.claims.items() if c.pool == pool}


def legacy_claim_nsids(pools: Mapping[str, PoolRecord],
                       claims: Mapping[str, DeviceClaim]) -> dict[str, DeviceClaim]:
    """Schema-1 claims with the nsid each device was exported under.

    Schema 1 numbered a device pool's namespaces by their place in its device list, per
    host, and recorded that list (``pools.<name>.devices``) with every listed device
    claimed: a device's place there is its nsid. A pool whose recorded list is not
    exactly that (not a list of distinct paths, each claimed by the pool) proves
    nothing, and its claims keep no nsid (:func:`agent.target.backings.device.legacy_nsid`
    then looks for other proof).
    """
    out = dict(claims)
    for name, pool in pools.items():
        devices = pool.params.get("devices")
        if (pool.kind != "device" or not isinstance(devices, list)
                or not all(isinstance(d, str) for d in devices)
                or len(set(devices)) != len(devices)):
            continue
        listed = [c for d in devices if (c := claims.get(d)) is not None and c.pool == name]
        if len(listed) != len(devices):
            continue
        place: dict[str | None, int] = {}
        for claim in listed:
            place[claim.host] = place.get(claim.host, 0) + 1
            if claim.nsid is None:
                out[claim.path] = replace(claim, nsid=place[claim.host])
    return out


# ----------------------------------------------------------------- file manifest
ManifestState = Literal["creating", "created"]


@dataclass(frozen=True)
class ManifestEntry:
    """One file kvagent made in a file pool.

    ``state`` is ``creating`` from the moment kvagent decides to create the file
    (under the temporary name ``temp``) until it is renamed into place; ``uuid`` and
    ``nguid`` are the identity the file's namespace carries.
    """

    size: int
    uuid: str | None = None
    nguid: str | None = None
    state: ManifestState = "created"
    temp: str | None = None


@dataclass
class FileManifest:
    """The files of one file pool (``<directory>/<pool>/.kvagent-pool.json``)."""

    pool: str | None = None
    files: dict[str, ManifestEntry] = field(default_factory=dict)

    @classmethod
    def load(cls, directory: Path | str) -> FileManifest:
        path = Path(directory) / MANIFEST_FILE
        data = read_json(path, None)
        if data is None:
            return cls()
        version = _schema(data, path)

        def build(d: Mapping[str, Any]) -> FileManifest:
            files: dict[str, ManifestEntry] = {}
            for rel, entry in d.get("files", {}).items():
                files[str(rel)] = (ManifestEntry(int(entry)) if version == 1
                                   else ManifestEntry(**entry))
            return cls(d.get("pool"), files)

        return _typed(path, build, data)

    def save(self, directory: Path | str) -> None:
        write_json(Path(directory) / MANIFEST_FILE, {
            "schema": SCHEMA, "pool": self.pool,
            "files": {rel: asdict(e) for rel, e in sorted(self.files.items())}})


# ---------------------------------------------------------------- initiator side
@dataclass(frozen=True)
class SubsystemPath:
    """A subsystem of a pool as this GPU host reaches it: one endpoint (no host side).

    Its JSON is flat, as it always was: ``{"subsysnqn", "transport", "traddr", "trsvcid"}``.
    """

    subsysnqn: str
    address: FabricsAddress

    _KEYS = ("subsysnqn", "transport", "traddr", "trsvcid")

    def __post_init__(self) -> None:
        if self.address != self.address.endpoint:
            raise ValueError(f"a recorded subsystem path has no host side: {self.address}")

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SubsystemPath:
        unknown = sorted(set(d) - set(cls._KEYS))
        if unknown:
            raise TypeError(f"a subsystem path has no {', '.join(unknown)}")
        return cls(str(d["subsysnqn"]),
                   FabricsAddress(str(d["transport"]), str(d["traddr"]), str(d["trsvcid"])))

    def to_json(self) -> dict[str, Any]:
        a = self.address
        return {"subsysnqn": self.subsysnqn, "transport": a.transport, "traddr": a.traddr,
                "trsvcid": a.trsvcid}


@dataclass(frozen=True)
class AttachedDevice:
    """A namespace found on this GPU host, and the directory its filesystem is mounted on
    (per-namespace layout; None: none yet, or a striped pool's member)."""

    subsysnqn: str
    nsid: int
    uuid: str
    device: str
    mount: str | None = None


@dataclass(frozen=True)
class MountRecovery:
    """A mount whose xfs shut down (I/O errors in an outage) and that kvagent unmounted
    and mounted again (log recovery): how often, and when last (wall clock)."""

    mount: str
    count: int
    last_at: float


@dataclass
class PoolAttachment:
    """What attaching one pool did on this GPU host (kept even when it failed half-way)."""

    hostnqn: str
    layout: str = "per-namespace"
    shared: bool = False
    subsystems: list[SubsystemPath] = field(default_factory=list)
    devices: list[AttachedDevice] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    created_dirs: list[str] = field(default_factory=list)
    complete: bool = False
    recoveries: list[MountRecovery] = field(default_factory=list)
    #: The discovery ports (endpoints) the pool's seeds referred this host to, as its last
    #: discovery walked them (:mod:`agent.initiator.stages.discover`): the persistent
    #: discovery controllers follow them (:mod:`agent.initiator.discovery_controllers`).
    #: JSON ``[{"transport", "traddr", "trsvcid"}]``, left out while empty (a record
    #: written before it loads with none).
    discovery: list[FabricsAddress] = field(default_factory=list)

    _ADDRESS_KEYS = ("transport", "traddr", "trsvcid")

    @classmethod
    def _address(cls, d: Any) -> FabricsAddress:
        """A recorded discovery port: exactly its three keys, each a string."""
        if not isinstance(d, Mapping) or set(d) != set(cls._ADDRESS_KEYS) or not all(
                isinstance(d[k], str) for k in cls._ADDRESS_KEYS):
            raise TypeError(f"a discovery port is {{transport, traddr, trsvcid}}: {d!r}")
        return FabricsAddress(d["transport"], d["traddr"], d["trsvcid"])

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PoolAttachment:
        layout = d.get("layout", "per-namespace")
        devices = [AttachedDevice(**x) for x in d.get("devices", [])]
        for x in devices:
            recorded_path(x.device, "an attached device")
            if x.mount is not None:
                recorded_path(x.mount, f"the mount of {x.device}")
        mounts = [recorded_path(m, "a mount") for m in d.get("mounts", [])]
        if (layout == "per-namespace" and not d.get("shared") and devices
                and all(x.mount is None for x in devices) and len(devices) == len(mounts)):
            # Written before devices named their mount: namespace i was mounted on
            # mounts[i] (<mount>/ns<i>, by position); it keeps that directory.
            devices = [AttachedDevice(x.subsysnqn, x.nsid, x.uuid, x.device, m)
                       for x, m in zip(devices, mounts, strict=True)]
        return cls(hostnqn=str(d["hostnqn"]), layout=layout,
                   shared=bool(d.get("shared", False)),
                   subsystems=[SubsystemPath.from_json(s) for s in d.get("subsystems", [])],
                   devices=devices, mounts=mounts,
                   created_dirs=[recorded_path(c, "a created directory")
                                 for c in d.get("created_dirs", [])],
                   complete=bool(d.get("complete", False)),
                   recoveries=[MountRecovery(recorded_path(r["mount"], "a recovered mount"),
                                             int(r["count"]),
                                             float(r["last_at"]))
                               for r in d.get("recoveries", [])],
                   discovery=[cls._address(a) for a in d.get("discovery", [])])

    def to_json(self) -> dict[str, Any]:
        out = {**asdict(self), "subsystems": [s.to_json() for s in self.subsystems]}
        del out["discovery"]
        if self.discovery:
            out["discovery"] = [{"transport": a.transport, "traddr": a.traddr,
                                 "trsvcid": a.trsvcid} for a in self.discovery]
        return out

    def removable_dirs(self) -> list[str]:
        """The created directories kvagent may remove: each one a recorded mount or a
        directory above one (what ``mkdir -p`` of a mount made); any other recorded one
        is not kvagent's to remove."""
        mounts = [*self.mounts, *(x.mount for x in self.devices if x.mount),
                  *(r.mount for r in self.recoveries)]
        return [d for d in self.created_dirs
                if any(m == d or m.startswith(d.rstrip("/") + "/") for m in mounts)]

    def device_mount(self, uuid: str) -> str | None:
        """The directory recorded for the namespace with ``uuid`` (None if none)."""
        want = uuid.lower()
        return next((x.mount for x in self.devices
                     if x.uuid.lower() == want and x.mount is not None), None)

    def recovered(self, mount: str, at: float) -> None:
        """Count one more recovery of ``mount`` (at wall clock ``at``)."""
        old = next((r for r in self.recoveries if r.mount == mount), None)
        count = old.count + 1 if old is not None else 1
        self.recoveries = [r for r in self.recoveries if r.mount != mount]
        self.recoveries.append(MountRecovery(mount, count, at))
        self.recoveries.sort(key=lambda r: r.mount)


class InitiatorRecords:
    """``<state_dir>/initiator.json``: every pool an apply attached (fully or in part)."""

    @staticmethod
    def load(state_dir: Path | str) -> dict[str, PoolAttachment]:
        path = Path(state_dir) / INITIATOR_FILE
        data = read_json(path, None)
        if data is None:
            return {}
        _schema(data, path)
        return _typed(path, lambda d: {str(n): PoolAttachment.from_json(p)
                                       for n, p in d.get("pools", {}).items()}, data)

    @staticmethod
    def save(state_dir: Path | str, pools: Mapping[str, PoolAttachment],
             texts: dict[str, tuple[PoolAttachment, str]] | None = None) -> None:
        """Write every pool's record, the same text as :func:`~agent.state.write_json`
        of the whole document.

        ``texts``: each pool's JSON text as this caller last saved it, kept here and reused
        while the same record object is saved again (the caller never changes a record
        it has saved: it saves a new object). A pass that attaches many pools saves after
        each step of each; without it every save formatted every pool's record again
        (2 ms more per pool already attached, per save, under TCG)."""
        parts = []
        for name, pool in sorted(pools.items()):
            hit = texts.get(name) if texts is not None else None
            if hit is None or hit[0] is not pool:
                hit = (pool, json_text(pool.to_json()))
                if texts is not None:
                    texts[name] = hit
            parts.append(f"    {json_text(name)}: " + hit[1].replace("\n", "\n    "))
        body = ("{\n" + ",\n".join(parts) + "\n  }") if parts else "{}"
        write_json_text(Path(state_dir) / INITIATOR_FILE,
                        f'{{\n  "pools": {body},\n  "schema": {json_text(SCHEMA)}\n}}')


# ---------------------------------------------------------------- other records
def last_apply_path(state_dir: Path | str) -> Path:
    """Where apply records its last result."""
    return Path(state_dir) / LAST_APPLY_FILE


def write_last_apply(state_dir: Path | str, result: Mapping[str, Any]) -> None:
    write_json(last_apply_path(state_dir), dict(result))


def read_last_apply(state_dir: Path | str) -> dict[str, Any] | None:
    """The last apply's result (None if there was none)."""
    return read_json(last_apply_path(state_dir), None)


def probes_path(state_dir: Path | str, pool: str) -> Path:
    """Where apply records the probe results of a GPU pool's mounts."""
    return Path(state_dir) / PROBES_DIR / f"{pool}.json"


def engine_renders_dir(state_dir: Path | str, pool: str) -> Path:
    """Where apply writes the rendered engine configs of a GPU pool."""
    return Path(state_dir) / ENGINES_DIR / pool


def quota_path(state_dir: Path | str, pool: str) -> Path:
    """Where apply records which engine directories of a GPU pool it put in their xfs
    project (every file below counted), so a converged pass does not walk them again."""
    return Path(state_dir) / "quota" / f"{pool}.json"


def cleaner_path(state_dir: Path | str, pool: str) -> Path:
    """Where apply counts the runs of a GPU pool's engine cleaners (what they deleted)."""
    return Path(state_dir) / "cleaner" / f"{pool}.json"

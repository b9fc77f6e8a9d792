"""Typed, immutable model of the nvmet configfs tree.

The same classes describe the *live* tree (everything the reader found) and a
*desired* tree (what a caller wants). In a desired tree an attribute that is
``None`` or absent from a mapping is not mentioned and is left alone by the
planner; only mentioned attributes are compared and written.

Values are kept as the kernel shows them (strings, without the trailing
newline); :func:`canonical` turns friendly input (``True``, ``64``, upper-case
uuids, ``"1.3.0"``) into that form so that desired and live values compare.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

#: Attribute files whose value is a boolean (the kernel shows 0/1, accepts kstrtobool input).
BOOL_ATTRS = frozenset({
    "attr_allow_any_host", "attr_pi_enable", "param_pi_enable", "enable", "buffered_io",
    "resv_enable", "p2pmem",
})
#: Attribute files whose value is an integer (shown in decimal).
INT_ATTRS = frozenset({
    "attr_qid_max", "attr_cntlid_min", "attr_cntlid_max", "ana_grpid",
    "param_inline_data_size", "param_max_queue_size", "param_mdts", "addr_portid",
})
#: Namespace attributes that may only change while the namespace is disabled
#: (EBUSY for device_*, p2pmem; EINVAL for buffered_io, resv_enable).
NS_DISABLED_ONLY = frozenset({
    "device_path", "device_uuid", "device_nguid", "buffered_io", "resv_enable", "p2pmem",
})
#: Order in which a port's (or referral's) address attributes are written: trtype first,
#: because the kernel resets tsas when trtype is written; tsas before treq, because
#: writing tsas sets treq (TLS: required; none: not specified) and treq 'not specified'
#: is refused while tsas is tls1.3.
ADDR_ORDER = ("trtype", "adrfam", "traddr", "trsvcid", "tsas", "treq", "portid")

_TRUE = {"1", "y", "yes", "true", "on"}
_FALSE = {"0", "n", "no", "false", "off"}
_VERSION_RE = re.compile(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?\s*$")
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class FrozenMap(Mapping[K, V], Generic[K, V]):
    """An immutable, hashable mapping (dataclasses here are frozen all the way down)."""

    __slots__ = ("_data", "_hash")

    def __init__(self, data: Mapping[K, V] | Iterable[tuple[K, V]] = ()):
        self._data: dict[K, V] = dict(data)
        self._hash: int | None = None

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    # The Mapping mixins go through __getitem__ and exceptions; the planner calls these
    # per namespace, so they go straight to the dict.
    def get(self, key: K, default: Any = None) -> Any:
        return self._data.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def keys(self) -> Any:
        return self._data.keys()

    def items(self) -> Any:
        return self._data.items()

    def values(self) -> Any:
        return self._data.values()

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._data.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def replace(self, **changes: V) -> FrozenMap[K, V]:
        """A copy with ``changes`` applied (string keys only)."""
        data = dict(self._data)
        data.update(changes)  # type: ignore[arg-type]
        return FrozenMap(data)


#: The empty attribute map every object without extra attributes shares.
EMPTY: FrozenMap[str, str] = FrozenMap()


def canonical(name: str, value: Any) -> str:
    """``value`` for attribute file ``name`` in the form the kernel shows it.

    ``name`` is the file name (``attr_allow_any_host``, ``device_uuid``, ``addr_traddr``...).
    Unknown attributes keep their string form (stripped), so new kernel attributes need no code.
    """
    if isinstance(value, bool):
        text = "1" if value else "0"
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, str):
        text = value.strip()
    else:
        raise TypeError(f"{name}: value must be str, int or bool, got {type(value).__name__}")
    if name in BOOL_ATTRS:
        low = text.lower()
        if low in _TRUE:
            return "1"
        if low in _FALSE:
            return "0"
        return text
    if name in INT_ATTRS:
        try:
            return str(int(text, 0)) if text.lower().startswith("0x") else str(int(text))
        except ValueError:
            return text
    if name in ("device_uuid", "device_nguid"):
        if _UUID_RE.fullmatch(text):
            return text  # already as the kernel shows it
        try:
            return str(uuid.UUID(text))
        except ValueError:
            return text.lower()
    if name == "attr_version":
        m = _VERSION_RE.match(text)
        if m:
            major, minor, tertiary = m.groups()
            base = f"{int(major)}.{int(minor)}"
            return f"{base}.{int(tertiary)}" if tertiary and int(tertiary) else base
    return text


def _attrs(prefix: str, data: Mapping[str, Any] | None) -> FrozenMap[str, str]:
    if not data:
        return EMPTY  # shared: hot paths test ``attrs is EMPTY`` instead of calling len()
    return FrozenMap({str(k): canonical(prefix + str(k), v) for k, v in data.items()})


def _opt(name: str, value: Any) -> str | None:
    return None if value is None else canonical(name, value)


@dataclass(frozen=True)
class Host:
    """A host NQN known to nvmet (``hosts/<nqn>``); ``attrs`` are its attribute files
    (``dhchap_key``... on kernels with NVME_TARGET_AUTH)."""

    nqn: str
    attrs: Mapping[str, str] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        object.__setattr__(self, "attrs", _attrs("", self.attrs))


#: The attribute files :class:`Namespace` has fields for.
_NS_FIELDS = frozenset({"device_path", "device_uuid", "device_nguid", "enable", "ana_grpid",
                        "buffered_io"})


@dataclass(frozen=True)
class Namespace:
    """``subsystems/<nqn>/namespaces/<nsid>``. ``None`` = not mentioned (left alone).

    ``attrs`` holds any other attribute file (``resv_enable``, ``p2pmem``...).
    """

    nsid: int
    device_path: str | None = None
    device_uuid: str | None = None
    device_nguid: str | None = None
    enable: bool | None = None
    ana_grpid: int | None = None
    buffered_io: bool | None = None
    attrs: Mapping[str, str] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        if isinstance(self.nsid, bool) or not isinstance(self.nsid, int):
            raise TypeError(f"nsid must be an int, got {self.nsid!r}")
        for name in ("device_path", "device_uuid", "device_nguid"):
            object.__setattr__(self, name, _opt(name, getattr(self, name)))
        for name in ("enable", "buffered_io"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                object.__setattr__(self, name, canonical(name, value) == "1")
        if self.ana_grpid is not None:
            object.__setattr__(self, "ana_grpid", int(self.ana_grpid))
        object.__setattr__(self, "attrs", _attrs("", self.attrs))

    @classmethod
    def from_files(cls, nsid: int, files: Mapping[str, str]) -> Namespace:
        """The namespace whose attribute files (as configfs shows them) are ``files``;
        ``device_path`` ``(null)`` or empty is unset, a file not given is ``None``.

        Equal to ``Namespace(nsid, device_path=..., enable=files["enable"] == "1", ...)``
        with other files in ``attrs``, but built without the per-field conversions where
        the kernel's form is already canonical: a live read builds one per namespace,
        every pass.
        """
        get = files.get
        path = get("device_path")
        if path is not None:
            path = None if path in ("(null)", "") else path.strip()
        ids = []
        for name in ("device_uuid", "device_nguid"):
            value = get(name)
            if value is not None and not _UUID_RE.fullmatch(value):
                value = canonical(name, value)
            ids.append(value)
        enable, grp, buffered = get("enable"), get("ana_grpid"), get("buffered_io")
        other = files.keys() - _NS_FIELDS
        ns = object.__new__(cls)
        ns.__dict__.update(
            nsid=nsid, device_path=path, device_uuid=ids[0], device_nguid=ids[1],
            enable=None if enable is None else enable == "1",
            ana_grpid=None if grp is None else int(grp),
            buffered_io=None if buffered is None else buffered == "1",
            attrs=FrozenMap({k: canonical(k, files[k]) for k in other}) if other else EMPTY)
        return ns

    def files(self) -> dict[str, str]:
        """Every mentioned attribute as ``{file name: kernel value}``."""
        out: dict[str, str] = {}
        for name in ("device_path", "device_uuid", "device_nguid"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.buffered_io is not None:
            out["buffered_io"] = "1" if self.buffered_io else "0"
        if self.ana_grpid is not None:
            out["ana_grpid"] = str(self.ana_grpid)
        if self.enable is not None:
            out["enable"] = "1" if self.enable else "0"
        if self.attrs is not EMPTY:
            out.update(self.attrs.items())
        return out


def ns_shape(ns: Namespace) -> tuple[object, ...]:
    """Which attribute files ``ns`` mentions, not their values (a hashable key: planning
    checks features once per shape, not once per namespace)."""
    return (ns.device_path is None, ns.device_uuid is None, ns.device_nguid is None,
            ns.enable is None, ns.ana_grpid is None, ns.buffered_io is None,
            () if ns.attrs is EMPTY else tuple(ns.attrs))


@dataclass(frozen=True)
class Subsystem:
    """``subsystems/<nqn>``: ``attrs`` maps attr_* names without the prefix
    (``allow_any_host``, ``model``, ``serial``, ``version``, ``qid_max``...)."""

    nqn: str
    attrs: Mapping[str, str] = field(default_factory=FrozenMap)
    namespaces: Mapping[int, Namespace] = field(default_factory=FrozenMap)
    allowed_hosts: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "attrs", _attrs("attr_", self.attrs))
        ns = self.namespaces
        items = ns.values() if isinstance(ns, Mapping) else ns
        mapping: dict[int, Namespace] = {}
        for n in items:
            if n.nsid in mapping:
                raise ValueError(f"subsystem {self.nqn}: nsid {n.nsid} given twice")
            mapping[n.nsid] = n
        if isinstance(ns, Mapping):
            for key, n in ns.items():
                if key != n.nsid:
                    raise ValueError(f"subsystem {self.nqn}: namespace key {key} != nsid {n.nsid}")
        object.__setattr__(self, "namespaces", FrozenMap(sorted(mapping.items())))
        object.__setattr__(self, "allowed_hosts", frozenset(self.allowed_hosts))


@dataclass(frozen=True)
class Referral:
    """``ports/<id>/referrals/<name>``: another discovery address advertised by this port."""

    name: str
    addr: Mapping[str, str] = field(default_factory=FrozenMap)
    enable: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "addr", _attrs("addr_", self.addr))
        if self.enable is not None and not isinstance(self.enable, bool):
            object.__setattr__(self, "enable", canonical("enable", self.enable) == "1")


@dataclass(frozen=True)
class Port:
    """``ports/<id>``: ``addr`` maps addr_* names without the prefix (trtype, adrfam, traddr,
    trsvcid, treq, tsas), ``params`` param_* names (inline_data_size, pi_enable...).

    ``subsystems`` are the NQNs linked into the port. ``ana_groups`` (grpid -> state) and
    ``referrals`` are ``None`` in a desired tree that leaves them alone.
    """

    id: int
    addr: Mapping[str, str] = field(default_factory=FrozenMap)
    params: Mapping[str, str] = field(default_factory=FrozenMap)
    subsystems: frozenset[str] = frozenset()
    ana_groups: Mapping[int, str] | None = None
    referrals: Mapping[str, Referral] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.id, bool) or not isinstance(self.id, int):
            raise TypeError(f"port id must be an int, got {self.id!r}")
        object.__setattr__(self, "addr", _attrs("addr_", self.addr))
        object.__setattr__(self, "params", _attrs("param_", self.params))
        object.__setattr__(self, "subsystems", frozenset(self.subsystems))
        if self.ana_groups is not None:
            object.__setattr__(self, "ana_groups", FrozenMap(
                sorted((int(k), canonical("ana_state", v)) for k, v in self.ana_groups.items())))
        if self.referrals is not None:
            refs = self.referrals
            items = refs.values() if isinstance(refs, Mapping) else refs
            object.__setattr__(self, "referrals", FrozenMap(sorted((r.name, r) for r in items)))


def _keyed(items: Mapping[Any, Any] | Iterable[Any], key: str) -> FrozenMap[Any, Any]:
    values = items.values() if isinstance(items, Mapping) else items
    out: dict[Any, Any] = {}
    for v in values:
        k = getattr(v, key)
        if k in out:
            raise ValueError(f"{type(v).__name__} {k!r} given twice")
        out[k] = v
    return FrozenMap(sorted(out.items()))


@dataclass(frozen=True)
class Tree:
    """The whole nvmet state: hosts by NQN, subsystems by NQN, ports by id.

    Accepts mappings or plain iterables of objects.
    """

    hosts: Mapping[str, Host] = field(default_factory=FrozenMap)
    subsystems: Mapping[str, Subsystem] = field(default_factory=FrozenMap)
    ports: Mapping[int, Port] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hosts", _keyed(self.hosts, "nqn"))
        object.__setattr__(self, "subsystems", _keyed(self.subsystems, "nqn"))
        object.__setattr__(self, "ports", _keyed(self.ports, "id"))

    def is_empty(self) -> bool:
        """True when there are no hosts, subsystems or ports."""
        return not (self.hosts or self.subsystems or self.ports)


def as_dict(tree: Tree) -> dict[str, Any]:
    """``tree`` as plain JSON-able data (lists sorted by name/id, ``None`` kept)."""

    def ns(n: Namespace) -> dict[str, Any]:
        return {"nsid": n.nsid, "device_path": n.device_path, "device_uuid": n.device_uuid,
                "device_nguid": n.device_nguid, "enable": n.enable, "ana_grpid": n.ana_grpid,
                "buffered_io": n.buffered_io, "attrs": dict(n.attrs)}

    def port(p: Port) -> dict[str, Any]:
        return {"id": p.id, "addr": dict(p.addr), "params": dict(p.params),
                "subsystems": sorted(p.subsystems),
                "ana_groups": None if p.ana_groups is None
                else {str(k): v for k, v in p.ana_groups.items()},
                "referrals": None if p.referrals is None else [
                    {"name": r.name, "addr": dict(r.addr), "enable": r.enable}
                    for r in p.referrals.values()]}

    return {
        "hosts": [{"nqn": h.nqn, "attrs": dict(h.attrs)} for h in tree.hosts.values()],
        "subsystems": [{"nqn": s.nqn, "attrs": dict(s.attrs),
                        "namespaces": [ns(n) for n in s.namespaces.values()],
                        "allowed_hosts": sorted(s.allowed_hosts)}
                       for s in tree.subsystems.values()],
        "ports": [port(p) for p in tree.ports.values()],
    }

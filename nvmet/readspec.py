"""Which attribute files a read must see: what the planner needs, derived from a desired tree.

The planner compares only the attributes a desired tree mentions; on top of those it
needs a few facts of every live object, desired or not, to order and scope its work:

* every object's name (directory listings), allowed_hosts links and port links;
* a namespace's ``enable`` (a delete disables first) and ``device_path`` (who exports
  which device; the context of enable errors);
* a subsystem's ``attr_allow_any_host`` (allowed hosts need it off);
* a port's ``addr_trtype``, ``addr_adrfam``, ``addr_traddr`` and ``addr_trsvcid``
  (its address in messages, and whether a port kvagent did not create is the one it wants);
* the names of a port's ANA groups and referrals (a port delete removes them first).

:func:`read_spec` adds every attribute file the desired tree mentions, so an attribute a
newer kernel adds (``dhchap_*``, ``addr_tsas``, ``addr_treq``...) is read and compared as
soon as a desired tree mentions it: the reader needs no change. ``features`` (when known
for a kind) drops the files that kernel does not have, which the planner then refuses
with :class:`~nvmet.errors.FeatureMissing` anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .model import Tree, ns_shape
from .readbase import Features

#: The planner's own needs, whatever the desired tree says (see the module docstring).
PLANNER_FILES: dict[str, frozenset[str]] = {
    "hosts": frozenset(),
    "subsystems": frozenset({"attr_allow_any_host"}),
    "namespaces": frozenset({"enable", "device_path"}),
    "ports": frozenset({"addr_trtype", "addr_adrfam", "addr_traddr", "addr_trsvcid"}),
    "ana_groups": frozenset(),
    "referrals": frozenset(),
}
#: ReadSpec field -> the object kind :class:`~nvmet.readbase.Features` uses.
FEATURE_KIND = {"hosts": "host", "subsystems": "subsystem", "namespaces": "namespace",
                "ports": "port", "ana_groups": "ana_group", "referrals": "referral"}


@dataclass(frozen=True)
class ReadSpec:
    """Attribute files to read, per object kind (file names as configfs shows them).

    Names, links and child objects are always read; only attribute files are chosen.
    """

    hosts: frozenset[str] = frozenset()
    subsystems: frozenset[str] = frozenset()
    namespaces: frozenset[str] = frozenset()
    ports: frozenset[str] = frozenset()
    ana_groups: frozenset[str] = frozenset()
    referrals: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, frozenset(getattr(self, f.name)))

    @classmethod
    def planner(cls) -> ReadSpec:
        """What the planner needs of every live object (no desired tree mentioned)."""
        return cls(**PLANNER_FILES)

    def __or__(self, other: ReadSpec) -> ReadSpec:
        return ReadSpec(**{f.name: getattr(self, f.name) | getattr(other, f.name)
                           for f in fields(self)})

    def __sub__(self, other: ReadSpec) -> ReadSpec:
        return ReadSpec(**{f.name: getattr(self, f.name) - getattr(other, f.name)
                           for f in fields(self)})

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))

    def covers(self, other: ReadSpec) -> bool:
        """Every file ``other`` reads, this reads too."""
        return not (other - self)


def _mentioned(desired: Tree) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {f: set() for f in PLANNER_FILES}
    for host in desired.hosts.values():
        out["hosts"].update(host.attrs)
    seen = set()
    for sub in desired.subsystems.values():
        out["subsystems"].update(f"attr_{k}" for k in sub.attrs)
        for ns in sub.namespaces.values():
            shape = ns_shape(ns)  # the same for nearly every namespace
            if shape not in seen:
                seen.add(shape)
                out["namespaces"].update(ns.files())
    if out["subsystems"] & {"attr_cntlid_min", "attr_cntlid_max"}:
        # the planner orders a min/max change by the live other bound
        out["subsystems"] |= {"attr_cntlid_min", "attr_cntlid_max"}
    for port in desired.ports.values():
        out["ports"].update(f"addr_{k}" for k in port.addr)
        out["ports"].update(f"param_{k}" for k in port.params)
        if port.ana_groups is not None:
            out["ana_groups"].add("ana_state")
        if port.referrals is not None:
            out["referrals"].add("enable")
            for ref in port.referrals.values():
                out["referrals"].update(f"addr_{k}" for k in ref.addr)
    return out


def read_spec(desired: Tree | None = None, features: Features | None = None) -> ReadSpec:
    """The files the planner needs to plan ``desired`` against the live tree: its own
    (:data:`PLANNER_FILES`) plus every attribute ``desired`` mentions, less the files
    ``features`` knows this kernel lacks."""
    wanted = {k: set(v) for k, v in PLANNER_FILES.items()}
    if desired is not None:
        for kind, names in _mentioned(desired).items():
            wanted[kind] |= names
    if features is not None:
        for kind, names in wanted.items():
            known = features.files.get(FEATURE_KIND[kind])
            if known is not None:
                wanted[kind] = names & known
    return ReadSpec(**{k: frozenset(v) for k, v in wanted.items()})

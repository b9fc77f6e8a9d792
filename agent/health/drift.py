"""Drift: kvagent's own objects changed behind its back, seen by a collect and healed at once.

A collect describes what kvagent owns of each pool as a set of **facts** (kind, subject,
value), each a thing a pass made and keeps:

- storage side (read live by every collect: configfs has no events): each of the
  pool's subsystems, its namespaces and whether each is enabled, its allowed hosts and
  ``attr_allow_any_host``, each of the pool's ports, every port link of the pool's
  subsystems, and each allowed host's DH-HMAC-CHAP settings (a digest, never the key);
- GPU side: the pool's data controllers and its mounts.

:class:`DriftTracker` keeps the facts the last pass left (its **baseline**, taken by the
collect that follows the pass, for the roles and pools the pass covered) and compares
every later collect with it. On the storage side any change is drift (an object gone, one
added to kvagent's subsystem, a value changed); on the GPU side only what went away is
(new controllers and mounts are the attach pass's work). The agent answers drift with a
targeted pass at once (:mod:`agent.daemon`): the storage side's pass for a storage pool,
an attach pass over the drifted GPU pools.

A fight with another writer is bounded: the same subject drifting again after kvagent
healed it is healed again only after a back-off (``health.interval`` doubled per heal, at
most ``health.full_interval``); every drift is counted, and the subjects healed more than
once lately are named in ``kvagent status`` (:class:`DriftSubject`). A subject that stays
as kvagent left it for ``health.full_interval`` is forgotten.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import nvmet

from .snapshot import DriftSubject

#: (kind, subject, value): one thing a pass made and keeps.
Fact = tuple[str, str, str]
#: (role, pool).
PoolKey = tuple[str, str]
Facts = Mapping[PoolKey, frozenset[Fact]]

#: A host entry's DH-HMAC-CHAP attributes (their digest is a fact).
DHCHAP_ATTRS = ("dhchap_key", "dhchap_ctrl_key", "dhchap_hash", "dhchap_dhgroup")
#: What the storage side's facts need of nvmet beyond names and links: namespaces'
#: ``enable`` and subsystems' ``attr_allow_any_host`` (hosts' DH-HMAC-CHAP files only
#: where the config uses it: :func:`target_spec`).
TARGET_SPEC = nvmet.ReadSpec(namespaces=frozenset({"enable"}),
                             subsystems=frozenset({"attr_allow_any_host"}))


def target_spec(auth: bool) -> nvmet.ReadSpec:
    """What a collect reads of nvmet for health and drift (``auth``: the config gives
    hosts DH-HMAC-CHAP keys)."""
    return TARGET_SPEC | nvmet.ReadSpec(hosts=frozenset(DHCHAP_ATTRS)) if auth else TARGET_SPEC


def target_facts(live: nvmet.Tree, nqns: Iterable[str], port_ids: Iterable[int],
                 auth_hosts: Iterable[str] = ()) -> frozenset[Fact]:
    """A storage pool's facts: its subsystems ``nqns`` (and theirs namespaces, allowed
    hosts, links on any port), its ports ``port_ids``, and the DH-HMAC-CHAP settings of
    ``auth_hosts`` (a digest)."""
    facts: set[Fact] = set()
    nqns = list(nqns)
    for nqn in nqns:
        sub = live.subsystems.get(nqn)
        if sub is None:
            continue
        facts.add(("subsystem", nqn, ""))
        facts.add(("allow any host", nqn, sub.attrs.get("allow_any_host", "")))
        for nsid, ns in sub.namespaces.items():
            facts.add(("namespace", f"{nqn} nsid {nsid}",
                       "enabled" if ns.enable else "disabled"))
        facts.update(("allowed host", f"{nqn} {host}", "") for host in sub.allowed_hosts)
    for pid, port in live.ports.items():
        facts.update(("port link", f"port {pid} {nqn}", "") for nqn in nqns
                     if nqn in port.subsystems)
    facts.update(("port", f"port {pid}", "") for pid in port_ids if pid in live.ports)
    for nqn in auth_hosts:
        host = live.hosts.get(nqn)
        if host is not None:
            digest = hashlib.sha256("\0".join(host.attrs.get(a, "") for a in DHCHAP_ATTRS)
                                    .encode()).hexdigest()[:16]
            facts.add(("host key", nqn, digest))
    return frozenset(facts)


def initiator_facts(controllers: Iterable[str], mounts: Iterable[str]) -> frozenset[Fact]:
    """A GPU pool's facts: its data controllers (by name) and its mounted mount points."""
    return frozenset({*(("controller", c, "") for c in controllers),
                      *(("mount", m, "") for m in mounts)})


@dataclass(frozen=True)
class Drift:
    """One fact of one pool that changed since the last pass: ``before`` / ``after`` are
    its value then and now (None: absent)."""

    role: str
    pool: str
    kind: str
    subject: str
    before: str | None
    after: str | None

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.role, self.pool, self.kind, self.subject)

    def describe(self) -> str:
        """One line: what changed."""
        if self.after is None:
            change = "gone"
        elif self.before is None:
            change = "added"
        else:
            change = f"{self.before or '-'} -> {self.after or '-'}"
        return f"{self.kind} {self.subject}: {change}"


def changes(before: Facts, now: Facts) -> list[Drift]:
    """Every drift from ``before`` to ``now`` over the pools both know (a pool only one of
    them knows is not drift: the config changed, or it was never collected)."""
    out: list[Drift] = []
    for key in sorted(set(before) & set(now)):
        role, pool = key
        old = {(k, s): v for k, s, v in before[key]}
        new = {(k, s): v for k, s, v in now[key]}
        for ks in sorted(set(old) | set(new)):
            a, b = old.get(ks), new.get(ks)
            if a == b or (role == "initiator" and b is not None):
                continue
            out.append(Drift(role, pool, ks[0], ks[1], a, b))
    return out


@dataclass
class DriftTracker:
    """The baseline the last passes left and the subjects that drifted since (see the
    module's docstring). ``interval`` and ``full_interval``: ``health.interval`` and
    ``health.full_interval`` (the back-off's step and bound)."""

    interval: float
    full_interval: float
    baseline: dict[PoolKey, frozenset[Fact]] = field(default_factory=dict)
    subjects: dict[tuple[str, str, str, str], DriftSubject] = field(default_factory=dict)
    detected_total: dict[tuple[str, str], int] = field(default_factory=dict)
    #: The drifts the last :meth:`due` saw first and held back by their back-off.
    held: list[Drift] = field(default_factory=list)

    def passed(self, facts: Facts, covered: Iterable[PoolKey] | None) -> list[Drift]:
        """A pass ran and ``facts`` were collected after it: the pools it covered
        (``covered``; None: every pool) take them as their baseline; the others are
        compared as by :meth:`observe`, whose drifts this returns."""
        keys = set(facts) if covered is None else set(covered) & set(facts)
        for key in keys:
            self.baseline[key] = facts[key]
        for key in set(self.baseline) - set(facts):
            del self.baseline[key]  # a pool the config dropped
        return self._compare({k: v for k, v in facts.items() if k not in keys})

    def observe(self, facts: Facts) -> list[Drift]:
        """A collect between passes: what drifted since the baseline (GPU pools' new
        controllers and mounts join their baseline)."""
        return self._compare(facts)

    def _compare(self, facts: Facts) -> list[Drift]:
        for key, now in facts.items():
            if key not in self.baseline:
                self.baseline[key] = now  # first seen: nothing to compare with
            elif key[0] == "initiator" and now >= self.baseline[key]:
                self.baseline[key] = now  # only appearances: not drift
        return changes(self.baseline, facts)

    def due(self, drifts: Iterable[Drift], *, now: float, wall: float) -> list[Drift]:
        """Record ``drifts`` (each counted once, until it is healed) and return those to
        heal now: a subject's first drift at once, a subject healed lately once its
        back-off has passed. Those newly seen and held back are in :attr:`held`."""
        self.forget_settled(now=now)
        drifts = list(drifts)
        keys = {d.key for d in drifts}
        for key, subj in self.subjects.items():
            if subj.pending and key not in keys:  # a pass covered it, or it came back
                self.subjects[key] = dataclasses.replace(subj, pending=False)
        heal: list[Drift] = []
        self.held = []
        for d in drifts:
            subj = self.subjects.get(d.key) or DriftSubject(d.role, d.pool, d.kind, d.subject,
                                                            first_at=wall)
            new = not subj.pending
            if new:
                kind = (d.role, d.kind)
                self.detected_total[kind] = self.detected_total.get(kind, 0) + 1
                subj = dataclasses.replace(subj, detected=subj.detected + 1, last_at=wall,
                                           pending=True)
            self.subjects[d.key] = subj
            if subj.backoff_until is None or now >= subj.backoff_until:
                heal.append(d)
            elif new:
                self.held.append(d)
        return heal

    def healing(self, drifts: Iterable[Drift], *, now: float) -> None:
        """A targeted pass for ``drifts`` starts now: after a subject's k-th heal, its next
        one waits ``interval`` x 2^(k-1), at most ``full_interval``."""
        for d in drifts:
            subj = self.subjects[d.key]
            heals = subj.heals + 1
            wait = min(self.interval * 2 ** (heals - 1), self.full_interval)
            self.subjects[d.key] = dataclasses.replace(
                subj, heals=heals, pending=False, last_heal=now, backoff_until=now + wait)

    def next_heal(self) -> float | None:
        """When the earliest drift held back by its back-off may be healed (monotonic)."""
        return min((s.backoff_until for s in self.subjects.values()
                    if s.pending and s.backoff_until is not None), default=None)

    def forget_settled(self, *, now: float) -> None:
        """Forget the subjects left as kvagent made them for ``full_interval`` since their
        last heal."""
        for key, subj in list(self.subjects.items()):
            if (not subj.pending and subj.last_heal is not None
                    and now - subj.last_heal > self.full_interval):
                del self.subjects[key]

    def lately(self) -> tuple[DriftSubject, ...]:
        """The subjects that drifted lately, fights first."""
        return tuple(sorted(self.subjects.values(),
                            key=lambda s: (not s.fighting, -s.heals, s.describe())))

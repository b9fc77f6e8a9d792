"""Placement of new LVs on a group's PVs: spread (round-robin, deterministic, free-space
aware), striped (lvcreate -i/-I) and linear; the config and plan errors for impossible
requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.config import ConfigError, parse_config
from agent.target.backings import lvm
from agent.target.backings.placement import PlacementError, PvState, choose_spread
from tests.unit.fakerunner import FakeRunner

from .helpers import H1, H2, context, plan_of, pvs_json

GIB = 1 << 30
MIB = 1 << 20
TAGS = "kvagent,kvagent_pool={pool},kvagent_host={host},kvagent_ns={ns}"


def lvm_config(pools: list[tuple[str, dict]], count: int = 4, size: str = "1GiB",
               hosts: tuple[tuple[str, str], ...] = (("gpu-1", H1),)):
    data = {"version": 1, "node": {"name": "stor"}, "target": {
        "ports": [{"name": "p", "id": 1, "transport": "tcp", "address": "127.0.0.1"}],
        "pools": [{"name": name, "ports": ["p"],
                   "backing": {"kind": "lvm", "volume_group": "vg0", **backing},
                   "namespaces": {"count": count, "size": size},
                   "hosts": [{"name": n, "nqn": q} for n, q in hosts]}
                  for name, backing in pools]}}
    return parse_config(yaml.safe_dump(data))


class Lvm:
    """A fake LVM: one group vg0 of PVs, LVs that lvcreate really places (on the PV named
    last, else on the first PV with room), and the reports lvs, vgs and pvs give."""

    def __init__(self, free: dict[str, int], extent: int = 4 * MIB):
        self.free = dict(free)
        self.extent = extent
        self.lvs: dict[str, tuple[int, str, tuple[str, ...]]] = {}  # name -> size, tags, pvs
        self.runner = (FakeRunner().on_call(["lvs"], self._lvs).on_call(["vgs"], self._vgs)
                       .on_call(["pvs"], self._pvs).on_call(["lvcreate"], self._lvcreate))

    def _result(self, argv, stdout):  # type: ignore[no-untyped-def]
        from agent.system.run import CommandResult
        return CommandResult(tuple(argv), 0, stdout, "")

    def _lvs(self, argv, _input):  # type: ignore[no-untyped-def]
        rows = [{"lv_name": n, "vg_name": "vg0", "lv_path": f"/dev/vg0/{n}",
                 "lv_size": str(size), "lv_tags": tags, "lv_uuid": f"U-{n}",
                 "vg_size": str(1 << 50), "vg_free": str(sum(self.free.values())),
                 "vg_extent_size": str(self.extent), "vg_tags": "kvagent",
                 "devices": ",".join(f"{pv}(0)" for pv in pvs)}
                for n, (size, tags, pvs) in self.lvs.items()]
        return self._result(argv, json.dumps({"report": [{"lv": rows}]}))

    def _vgs(self, argv, _input):  # type: ignore[no-untyped-def]
        return self._result(argv, json.dumps({"report": [{"vg": [{
            "vg_name": "vg0", "vg_size": str(1 << 50), "vg_free": str(sum(self.free.values())),
            "vg_extent_size": str(self.extent), "vg_tags": "kvagent"}]}]}))

    def _pvs(self, argv, _input):  # type: ignore[no-untyped-def]
        rows = [(pv, "vg0", free, "", "") for pv, free in self.free.items()]
        rows += [(pv, "vg0", self.free[pv], f"U-{n}", tags)
                 for n, (_, tags, pvs) in self.lvs.items() for pv in pvs]
        return self._result(argv, pvs_json(*rows))

    def _lvcreate(self, argv, _input):  # type: ignore[no-untyped-def]
        name = argv[argv.index("-n") + 1]
        size = int(argv[argv.index("-L") + 1].rstrip("b"))
        tags = ",".join(argv[i + 1] for i, a in enumerate(argv) if a == "--addtag")
        last = argv[-1]
        pv = last if last in self.free else next(p for p, f in self.free.items() if f >= size)
        assert self.free[pv] >= size, f"{pv} has no room for {name}"
        self.free[pv] -= size
        self.lvs[name] = (size, tags, (pv,))
        return self._result(argv, "")

    def apply(self, cfg, upto: int | None = None) -> None:  # type: ignore[no-untyped-def]
        """Plan every pool and run the first ``upto`` lvcreate steps (all: None), as a pass
        killed after its ``upto``-th step would."""
        ctx = context(cfg, self.runner)
        steps = [s for pool in cfg.target.pools for s in plan_of(cfg, ctx, pool).steps]
        for step in steps[:upto]:
            step.run()

    def placed(self) -> dict[str, str]:
        return {n: pvs[0] for n, (_, _, pvs) in self.lvs.items()}


def four_pvs(free: int = 10 * GIB) -> dict[str, int]:
    return {f"/dev/nvme{i}n1": free for i in range(4)}


# ------------------------------------------------------------------- spread
def test_spread_puts_each_namespace_of_a_host_on_its_own_pv_round_robin() -> None:
    fake = Lvm(four_pvs())
    fake.apply(lvm_config([("kv", {})], count=6))
    assert fake.placed() == {
        "kv_kv_gpu-1_1": "/dev/nvme0n1", "kv_kv_gpu-1_2": "/dev/nvme1n1",
        "kv_kv_gpu-1_3": "/dev/nvme2n1", "kv_kv_gpu-1_4": "/dev/nvme3n1",
        # more namespaces than PVs: round and round
        "kv_kv_gpu-1_5": "/dev/nvme0n1", "kv_kv_gpu-1_6": "/dev/nvme1n1"}
    cmd = fake.runner.ran("lvcreate")[0]
    assert cmd[-2:] == ("vg0", "/dev/nvme0n1")


def test_spread_balances_hosts_and_pools_over_the_pvs() -> None:
    fake = Lvm(four_pvs())
    cfg = lvm_config([("kv", {}), ("kw", {})], count=2, hosts=(("gpu-1", H1),))
    fake.apply(cfg)
    # The second spread pool of the group starts where the first has nothing.
    assert fake.placed() == {"kv_kv_gpu-1_1": "/dev/nvme0n1", "kv_kv_gpu-1_2": "/dev/nvme1n1",
                             "kv_kw_gpu-1_1": "/dev/nvme2n1", "kv_kw_gpu-1_2": "/dev/nvme3n1"}
    two_hosts = Lvm(four_pvs())
    two_hosts.apply(lvm_config([("kv", {})], count=2, hosts=(("gpu-1", H1), ("gpu-2", H2))))
    assert two_hosts.placed() == {
        "kv_kv_gpu-1_1": "/dev/nvme0n1", "kv_kv_gpu-1_2": "/dev/nvme1n1",
        "kv_kv_gpu-2_1": "/dev/nvme2n1", "kv_kv_gpu-2_2": "/dev/nvme3n1"}


@settings(max_examples=40, deadline=None)
@given(frees=st.lists(st.sampled_from([1, 2, 3, 8]), min_size=1, max_size=5),
       count=st.integers(1, 6), hosts=st.integers(1, 2), data=st.data())
def test_a_killed_pass_makes_the_same_choices_when_run_again(
        frees: list[int], count: int, hosts: int, data: st.DataObject) -> None:
    """Kill after any lvcreate: the next pass places the rest exactly where the
    uninterrupted pass would have."""
    free = {f"/dev/sd{chr(97 + i)}": f * GIB for i, f in enumerate(frees)}
    cfg = lvm_config([("kv", {})], count=count,
                     hosts=(("gpu-1", H1), ("gpu-2", H2))[:hosts])
    whole = Lvm(free)
    whole.apply(cfg)
    planned = whole.placed()
    if len(planned) < count * hosts:  # the plan refused (no room): nothing to resume
        assert not whole.lvs
        return
    killed_after = data.draw(st.integers(0, count * hosts))
    resumed = Lvm(free)
    resumed.apply(cfg, upto=killed_after)
    resumed.apply(lvm_config([("kv", {})], count=count,
                             hosts=(("gpu-1", H1), ("gpu-2", H2))[:hosts]))
    assert resumed.placed() == planned


def test_spread_skips_pvs_without_room_and_says_which_when_it_cannot() -> None:
    free = four_pvs()
    free["/dev/nvme1n1"] = 512 * MIB  # too small for a 1 GiB namespace
    fake = Lvm(free)
    fake.apply(lvm_config([("kv", {})], count=3))
    assert fake.placed() == {"kv_kv_gpu-1_1": "/dev/nvme0n1", "kv_kv_gpu-1_2": "/dev/nvme2n1",
                             "kv_kv_gpu-1_3": "/dev/nvme3n1"}
    # Four namespaces: the fourth would share a PV with another of the host's, because
    # /dev/nvme1n1 lacks room: refused, naming it; nothing is created.
    fake = Lvm(free)
    cfg = lvm_config([("kv", {})], count=4)
    plan = plan_of(cfg, context(cfg, fake.runner))
    assert plan.steps == []
    (error,) = plan.errors
    assert "vg0/kv_kv_gpu-1_4" in error and "/dev/nvme1n1 512.0 MiB free" in error
    assert "/dev/nvme0n1" in error  # where it would have gone
    # No PV has room for a whole namespace: every PV's free space is listed.
    tight = Lvm({"/dev/nvme0n1": 600 * MIB, "/dev/nvme1n1": 700 * MIB})
    cfg = lvm_config([("kv", {})], count=1)
    (error,) = plan_of(cfg, context(cfg, tight.runner)).errors
    assert error == ("pool kv: placement spread keeps each namespace on one device, and no "
                     "device of the volume group has the 1.0 GiB that vg0/kv_kv_gpu-1_1 needs "
                     "(/dev/nvme0n1 600.0 MiB free, /dev/nvme1n1 700.0 MiB free)")


def test_choose_spread_is_pure_and_takes_the_space() -> None:
    pvs = [PvState("/dev/b", 3 * GIB), PvState("/dev/a", 3 * GIB, [("kv", "h")])]
    assert choose_spread(pvs, "kv", "h", GIB, frozenset({"kv"}), "x").name == "/dev/b"
    assert (pvs[0].free, pvs[0].owners) == (2 * GIB, [("kv", "h")])
    # Both hold one of h's now: the tie goes to the name.
    assert choose_spread(pvs, "kv", "h", GIB, frozenset({"kv"}), "x").name == "/dev/a"
    with pytest.raises(PlacementError, match="no device"):
        choose_spread(pvs, "kv", "h", 5 * GIB, frozenset({"kv"}), "x")


def test_existing_lvs_are_never_moved_and_a_converged_pass_asks_nothing_about_pvs() -> None:
    fake = Lvm(four_pvs())
    # Made by a linear pass earlier: all on one PV.
    for n in (1, 2):
        fake.lvs[f"kv_kv_gpu-1_{n}"] = (GIB, TAGS.format(pool="kv", host="gpu-1", ns=n) +
                                        f",kvagent_uuid=u{n},kvagent_nguid=g{n}",
                                        ("/dev/nvme0n1",))
        fake.free["/dev/nvme0n1"] -= GIB
    cfg = lvm_config([("kv", {})], count=2)
    plan = plan_of(cfg, context(cfg, fake.runner))
    assert plan.steps == [] and not plan.errors
    assert not fake.runner.ran("pvs")
    # Growing the pool: only the new ones follow the placement (away from nvme0n1).
    fake.apply(lvm_config([("kv", {})], count=4))
    assert fake.placed() == {"kv_kv_gpu-1_1": "/dev/nvme0n1", "kv_kv_gpu-1_2": "/dev/nvme0n1",
                             "kv_kv_gpu-1_3": "/dev/nvme1n1", "kv_kv_gpu-1_4": "/dev/nvme2n1"}


def test_a_spread_volume_that_cannot_grow_on_its_pv_is_refused() -> None:
    fake = Lvm({"/dev/nvme0n1": 100 * MIB, "/dev/nvme1n1": 10 * GIB})
    fake.lvs["kv_kv_gpu-1_1"] = (GIB // 2, TAGS.format(pool="kv", host="gpu-1", ns=1) +
                                 ",kvagent_uuid=u,kvagent_nguid=g", ("/dev/nvme0n1",))
    cfg = lvm_config([("kv", {})], count=1)
    plan = plan_of(cfg, context(cfg, fake.runner))
    assert plan.steps == []
    (error,) = plan.errors
    assert "grows by 536870912 bytes on its device /dev/nvme0n1" in error
    assert "104857600 bytes free" in error


def test_a_new_group_is_placed_from_its_devices_sizes(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs = tmp_path / "sys"
    for name, size in (("nvme0n1", 4 * GIB), ("nvme1n1", 4 * GIB), ("nvme2n1", GIB)):
        (sysfs / "class/block" / name).mkdir(parents=True)
        (sysfs / "class/block" / name / "size").write_text(f"{size // 512}\n")
    monkeypatch.setattr(lvm, "ensure_blank", lambda dev, purpose, runner: "/dev/" + dev[-7:])

    def cfg(count: int):  # type: ignore[no-untyped-def]
        return parse_config(yaml.safe_dump({"version": 1, "node": {
            "name": "stor", "sysfs": str(sysfs)}, "target": {
            "ports": [{"name": "p", "id": 1, "transport": "tcp", "address": "127.0.0.1"}],
            "pools": [{"name": "kv", "ports": ["p"], "hosts": [{"name": "gpu-1", "nqn": H1}],
                       "namespaces": {"count": count, "size": "1GiB"},
                       "backing": {"kind": "lvm", "volume_group": "new", "devices": [
                           f"/dev/disk/by-id/{n}" for n in ("nvme2n1", "nvme1n1", "nvme0n1")
                       ]}}]}}))

    def runner() -> FakeRunner:
        return (FakeRunner().on(["lvs"], stdout=json.dumps({"report": [{"lv": []}]}))
                .on(["vgs"], stdout=json.dumps({"report": [{"vg": []}]})))

    two = runner()
    plan = plan_of(cfg(2), context(cfg(2), two))
    assert [s.detail for s in plan.steps if s.kind in ("lvm.vgcreate", "lvm.lvcreate")] == [
        "on /dev/disk/by-id/nvme2n1, /dev/disk/by-id/nvme1n1, /dev/disk/by-id/nvme0n1",
        f"{GIB} bytes on /dev/nvme0n1", f"{GIB} bytes on /dev/nvme1n1"]
    assert not two.ran("pvs")  # the group does not exist yet: nothing to ask
    # nvme2n1 is 1 GiB: less LVM's 1 MiB data start, it cannot hold a 1 GiB namespace.
    (error,) = plan_of(cfg(3), context(cfg(3), runner())).errors
    assert "new/kv_kv_gpu-1_3 on /dev/nvme0n1 next to another namespace" in error
    assert "(/dev/nvme2n1 1020.0 MiB free)" in error


# ------------------------------------------------------------------ striped
def test_striped_creates_with_stripes_over_every_pv() -> None:
    fake = Lvm(four_pvs())
    cfg = lvm_config([("kv", {"placement": "striped", "stripe_size": "256KiB"})], count=1,
                     size="10MiB")
    plan = plan_of(cfg, context(cfg, fake.runner))
    assert not plan.errors
    (step,) = plan.steps
    assert step.detail == f"{12 * MIB} bytes in 4 stripes of 256.0 KiB"
    fake.runner.on(["lvcreate"])  # record only
    step.run()
    (argv,) = fake.runner.ran("lvcreate")
    assert argv[argv.index("-i") + 1: argv.index("-i") + 4] == ("4", "-I", "256k")
    assert argv[-1] == "vg0"  # LVM picks the PVs: one stripe on each
    three = lvm_config([("kv", {"placement": "striped", "stripes": 3})], count=1)
    (step,) = plan_of(three, context(three, Lvm(four_pvs()).runner)).steps
    assert "in 3 stripes of 1.0 MiB" in step.detail


def test_striped_refusals_say_what_is_wrong() -> None:
    cfg = lvm_config([("kv", {"placement": "striped"})], count=1)
    (error,) = plan_of(cfg, context(cfg, Lvm({"/dev/nvme0n1": 10 * GIB}).runner)).errors
    assert error == ("pool kv: placement striped needs a volume group of at least 2 devices; "
                     "vg0 has 1 (/dev/nvme0n1): add devices to it (vgextend), or use placement: "
                     "spread or linear")
    free = four_pvs()
    free["/dev/nvme3n1"] = 100 * MIB
    (error,) = plan_of(cfg, context(cfg, Lvm(free).runner)).errors
    assert "needs 256.0 MiB on each of 4 devices" in error
    assert "only 3 have it (/dev/nvme3n1 100.0 MiB free)" in error
    five = lvm_config([("kv", {"placement": "striped", "stripes": 5})], count=1)
    (error,) = plan_of(five, context(five, Lvm(four_pvs()).runner)).errors
    assert "with 5 stripes needs 5 devices in the volume group; it has 4" in error
    wide = lvm_config([("kv", {"placement": "striped", "stripe_size": "8MiB"})], count=1)
    (error,) = plan_of(wide, context(wide, Lvm(four_pvs()).runner)).errors
    assert "stripe_size 8.0 MiB is larger than the extent size" in error


def test_linear_lets_lvm_choose_and_asks_nothing_about_pvs() -> None:
    fake = Lvm(four_pvs())
    cfg = lvm_config([("kv", {"placement": "linear"})], count=2)
    fake.apply(cfg)
    assert set(fake.placed().values()) == {"/dev/nvme0n1"}  # LVM fills one PV first
    assert not fake.runner.ran("pvs")
    assert all(c[-1] == "vg0" and "-i" not in c for c in fake.runner.ran("lvcreate"))


# ------------------------------------------------------------------- config
@pytest.mark.parametrize(("backing", "where", "what"), [
    ({"placement": "striped", "devices": ["/dev/disk/by-id/a"]}, "backing.placement",
     "striped needs a volume group of at least 2 devices; devices lists one"),
    ({"stripes": 2}, "backing.stripes", "is only used with placement: striped"),
    ({"placement": "striped", "stripes": 3, "devices": ["/dev/a", "/dev/b"]},
     "backing.stripes", "3 stripes need 3 devices; devices lists 2"),
    ({"placement": "striped", "stripe_size": "96KiB"}, "backing.stripe_size",
     "is not a power of two of at least 4KiB"),
    ({"placement": "diagonal"}, "backing.placement", "is not one of: spread, striped, linear"),
])
def test_impossible_placements_are_config_errors(backing: dict, where: str, what: str) -> None:
    with pytest.raises(ConfigError) as info:
        lvm_config([("kv", backing)])
    assert f"target.pools[0].{where}: " in str(info.value) and what in str(info.value)


def test_a_refused_pool_does_not_leave_its_group_half_planned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool that would create the group is refused (no room): the next pool of the
    group is not told the group is on its way (its lvcreate would fail), it says the group
    does not exist."""
    sysfs = tmp_path / "sys"
    for name in ("nvme0n1", "nvme1n1"):
        (sysfs / "class/block" / name).mkdir(parents=True)
        (sysfs / "class/block" / name / "size").write_text(f"{4 * GIB // 512}\n")
    monkeypatch.setattr(lvm, "ensure_blank", lambda dev, purpose, runner: "/dev/" + dev[-7:])
    devices = [f"/dev/disk/by-id/{n}" for n in ("nvme0n1", "nvme1n1")]
    cfg = parse_config(yaml.safe_dump({"version": 1, "node": {
        "name": "stor", "sysfs": str(sysfs)}, "target": {
        "ports": [{"name": "p", "id": 1, "transport": "tcp", "address": "127.0.0.1"}],
        "pools": [{"name": name, "ports": ["p"], "hosts": [{"name": "gpu-1", "nqn": H1}],
                   "namespaces": {"count": 1, "size": size},
                   "backing": {"kind": "lvm", "volume_group": "new", "devices": devs}}
                  for name, size, devs in (("big", "8GiB", devices), ("kv", "1GiB", []))]}}))
    runner = (FakeRunner().on(["lvs"], stdout=json.dumps({"report": [{"lv": []}]}))
              .on(["vgs"], stdout=json.dumps({"report": [{"vg": []}]})))
    ctx = context(cfg, runner)
    big, kv = (plan_of(cfg, ctx, p) for p in cfg.target.pools)
    assert big.steps == [] and "no device of the volume group has the 8.0 GiB" in big.errors[0]
    assert kv.steps == [] and "volume group 'new' does not exist" in kv.errors[0]

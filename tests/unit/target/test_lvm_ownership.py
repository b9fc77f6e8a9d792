"""An LVM namespace is the LV kvagent's tags name: its identity and its path (issue 24).

Item 10: the identity came from the tags but the path from the LV name, so a renamed
LV of kvagent's was exported under the canonical name, and a foreign LV of that name
got kvagent's identity.
"""

from __future__ import annotations

from tests.unit.fakerunner import FakeRunner

from .helpers import context, plan_of
from .test_backings import GIB, lvm_cfg, lvm_runner, lvs_json

TAGS = "kvagent,kvagent_pool=kv,kvagent_host=gpu-1,kvagent_ns={ns},kvagent_uuid=u{ns}," \
       "kvagent_nguid=g{ns}"


def touched(runner: FakeRunner, lv: str) -> list[tuple[str, ...]]:
    """Every LVM command that changed something and names ``lv``."""
    return [c for c in runner.calls if c[0] in ("lvcreate", "lvchange", "lvextend", "lvremove")
            and any(lv in a for a in c)]


def test_a_renamed_lv_of_kvagent_is_exported_by_its_own_path_never_the_foreign_one() -> None:
    """kvagent's LV for namespace 1 was renamed; someone made an LV of the old name. The
    namespace's identity and its path both come from the tagged LV: the foreign LV is
    neither exported nor touched."""
    cfg = lvm_cfg(count=1)
    runner = lvm_runner(lvs_json(("renamed", GIB, TAGS.format(ns=1)),
                                 ("kv_kv_gpu-1_1", GIB, "")))
    plan = plan_of(cfg, context(cfg, runner))
    assert not plan.errors and plan.steps == []
    (vol,) = plan.volumes
    assert (vol.path, vol.uuid, vol.nguid) == ("/dev/vg0/renamed", "u1", "g1")
    assert "vg0/renamed" in vol.storage.detail
    assert all(v.path != "/dev/vg0/kv_kv_gpu-1_1" for v in plan.volumes)
    assert touched(runner, "kv_kv_gpu-1_1") == []


def test_a_renamed_lv_that_grows_is_grown_by_its_own_path() -> None:
    cfg = lvm_cfg(count=1, size="2GiB")
    runner = lvm_runner(lvs_json(("renamed", GIB, TAGS.format(ns=1))))
    plan = plan_of(cfg, context(cfg, runner))
    (step,) = plan.steps
    assert (step.kind, step.subject, step.grown) == ("lvm.lvextend", "vg0/renamed",
                                                     "/dev/vg0/renamed")
    step.run()
    (argv,) = runner.ran("lvextend")
    assert "/dev/vg0/renamed" in argv


def test_a_foreign_lv_of_the_canonical_name_is_never_given_an_identity() -> None:
    """No LV of kvagent's for namespace 1, an untagged one of its name: a plan error that
    names the LV, the group and the way out; nothing exported, created or tagged."""
    cfg = lvm_cfg(count=2)
    runner = lvm_runner(lvs_json(("kv_kv_gpu-1_1", GIB, ""),
                                 ("kv_kv_gpu-1_2", GIB, TAGS.format(ns=2))))
    plan = plan_of(cfg, context(cfg, runner))
    (error,) = plan.errors
    assert "volume group vg0 already has an LV named kv_kv_gpu-1_1" in error
    assert "/dev/vg0/kv_kv_gpu-1_1" in error and "does not carry kvagent's tags" in error
    assert "lvrename vg0 kv_kv_gpu-1_1" in error
    assert [v.path for v in plan.volumes] == ["/dev/vg0/kv_kv_gpu-1_2"]
    assert plan.steps == []
    assert touched(runner, "kv_kv_gpu-1_1") == []


def test_an_lv_of_kvagent_for_another_namespace_does_not_lend_its_name() -> None:
    """An LV tagged for namespace 2 but named like namespace 1 is not namespace 1's."""
    cfg = lvm_cfg(count=1)
    runner = lvm_runner(lvs_json(("kv_kv_gpu-1_1", GIB, TAGS.format(ns=2))))
    plan = plan_of(cfg, context(cfg, runner))
    assert plan.volumes == [] and plan.steps == []
    assert "already has an LV named kv_kv_gpu-1_1" in plan.errors[0]


def test_two_lvs_tagged_for_one_namespace_are_refused_not_guessed() -> None:
    cfg = lvm_cfg(count=1)
    runner = lvm_runner(lvs_json(("kv_kv_gpu-1_1", GIB, TAGS.format(ns=1)),
                                 ("copy", GIB, TAGS.format(ns=1))))
    plan = plan_of(cfg, context(cfg, runner))
    assert plan.volumes == [] and plan.steps == []
    (error,) = plan.errors
    assert "vg0/copy, vg0/kv_kv_gpu-1_1" in error and "namespace 1" in error
    assert "lvchange --deltag kvagent" in error


def test_a_free_name_asks_lvm_once_per_group_and_a_converged_pool_never() -> None:
    cfg = lvm_cfg(count=2)
    runner = lvm_runner()
    plan = plan_of(cfg, context(cfg, runner))
    assert not plan.errors and [s.kind for s in plan.steps] == ["lvm.lvcreate"] * 2
    names = [c for c in runner.ran("lvs") if "@kvagent" not in c]
    assert names == [("lvs", "--reportformat", "json", "-o", "lv_name,vg_name", "vg0")]
    converged = lvm_runner(lvs_json(("kv_kv_gpu-1_1", GIB, TAGS.format(ns=1)),
                                    ("kv_kv_gpu-1_2", GIB, TAGS.format(ns=2))))
    assert plan_of(cfg, context(cfg, converged)).steps == []
    assert [c for c in converged.ran("lvs") if "@kvagent" not in c] == []

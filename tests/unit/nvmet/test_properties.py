"""Properties of plan + apply over random desired/live pairs, on the kernel-like fake.

For any live tree (built by applying a random tree, plus foreign objects) and any
desired tree: applying the plan succeeds with the fake checking ordering rules; the
result is exactly the desired state inside the scope; nothing outside the scope is
touched; a second plan is empty and applying it performs zero configfs writes.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nvmet.applier import apply
from nvmet.fake import FakeConfigFS
from nvmet.model import Tree
from nvmet.nvmetcli import from_nvmetcli, to_nvmetcli
from nvmet.planner import Scope, plan
from nvmet.reader import read

from .trees import (
    FAKE_UNIVERSE,
    SCOPE,
    conforms,
    foreign_part,
    foreign_tree,
    merge,
    touches_foreign,
    trees,
)


def fresh_fake() -> FakeConfigFS:
    u = FAKE_UNIVERSE
    fs = FakeConfigFS(local_addresses={"127.0.0.1", "10.0.0.1"}, rdma_addresses={"10.0.0.1"})
    for dev in u.block:
        fs.add_device(dev, "block")
    for dev in u.nodirect:
        fs.add_device(dev, "file-nodirect")
    return fs


def build(tree: Tree) -> FakeConfigFS:
    """A fake whose live state is ``tree`` (applied from empty, owning everything)."""
    fs = fresh_fake()
    result = apply(plan(tree, read(fs), Scope.everything()), fs)
    assert result.ok, result.failed
    assert conforms(tree, read(fs), Scope.everything()) == []
    return fs


@settings(max_examples=300)
@given(live=trees(), desired=trees(), foreign=st.sampled_from([None, False, True]))
def test_apply_converges_in_scope_and_leaves_foreign_alone(live, desired, foreign) -> None:
    start = live if foreign is None else merge(live, foreign_tree(FAKE_UNIVERSE, foreign))
    fs = build(start)
    before = read(fs)
    fs.check_order = True
    fs.start_session()

    actions = plan(desired, before, SCOPE)
    result = apply(actions, fs)

    assert result.ok, [(str(a), str(e)) for a, e in result.failed]
    after = read(fs)
    assert conforms(desired, after, SCOPE) == []
    assert foreign_part(after, SCOPE) == foreign_part(before, SCOPE)
    assert touches_foreign([op.path for op in fs.ops], SCOPE) == []
    assert result.writes == len(actions) == len(fs.ops)
    # only differing attributes are written: every write changes the stored value
    # (except on objects this plan just created, whose defaults it may restate)
    created = {op.path for op in fs.ops if op.op == "mkdir"}
    redundant = [op for op in fs.ops if op.op == "write" and not op.changed
                 and not any(op.path.startswith(c + "/") for c in created)
                 and not op.path.endswith("/revalidate_size")]
    assert redundant == []

    again = plan(desired, after, SCOPE)
    assert again == []
    writes = fs.writes
    assert apply(again, fs).writes == 0
    assert fs.writes == writes


@settings(max_examples=100)
@given(live=trees(), desired=trees())
def test_plan_is_pure_and_deterministic(live, desired) -> None:
    fs = build(live)
    snapshot = read(fs)
    ops = len(fs.ops)
    first = plan(desired, snapshot, SCOPE)
    assert plan(desired, snapshot, SCOPE) == first
    assert read(fs) == snapshot and len(fs.ops) == ops


@settings(max_examples=100)
@given(tree=trees(), foreign=st.booleans())
def test_nvmetcli_round_trip_of_live_trees(tree, foreign) -> None:
    fs = build(merge(tree, foreign_tree(FAKE_UNIVERSE, True)) if foreign else tree)
    live = read(fs)
    assert from_nvmetcli(to_nvmetcli(live)) == live


@settings(max_examples=100)
@given(tree=trees())
def test_importing_an_export_reproduces_the_tree_elsewhere(tree) -> None:
    """nvmetcli export on one host, import + plan + apply on an empty one: same tree."""
    source = read(build(tree))
    target = fresh_fake()
    desired = from_nvmetcli(to_nvmetcli(source))
    result = apply(plan(desired, read(target), Scope.everything()), target)
    assert result.ok, result.failed
    assert to_nvmetcli(read(target)) == to_nvmetcli(source)

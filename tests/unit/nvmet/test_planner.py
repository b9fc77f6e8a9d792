"""Planner cases: order, minimal writes, device and port changes, scope, errors."""

from __future__ import annotations

import pytest

from nvmet.applier import apply
from nvmet.errors import FeatureMissing, OutOfScope, PlanError, ScopeConflict
from nvmet.fake import FakeConfigFS
from nvmet.ids import namespace_nguid, namespace_uuid
from nvmet.model import Host, Namespace, Port, Referral, Subsystem, Tree
from nvmet.planner import Scope, plan, revalidate_action
from nvmet.reader import features, read

PREFIX = "nqn.2026-11.io.kvagent"
S = f"{PREFIX}:node1:pool0:gpu1"
S2 = f"{PREFIX}:node1:pool1:gpu1"
H = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555555"
H2 = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-666666666666"
FOREIGN = "nqn.2019-05.com.example:other"
FH = "nqn.2014-08.org.nvmexpress:uuid:99999999-2222-4333-8444-555555555555"
SCOPE = Scope.owned(subsystem_prefix=PREFIX, port_ids=[1, 2], hosts=[H, H2])
TCP = {"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "4420"}


def fake() -> FakeConfigFS:
    return FakeConfigFS(devices={"/dev/nullb0": "block", "/dev/nullb1": "block",
                                 "/tmp/f.img": "file-nodirect"},
                        local_addresses={"127.0.0.1", "10.0.0.1"})


def ns(nsid: int = 1, path: str = "/dev/nullb0", **kw) -> Namespace:
    return Namespace(nsid, device_path=path, device_uuid=namespace_uuid(S, nsid),
                     device_nguid=namespace_nguid(S, nsid), enable=True, **kw)


def pool(*namespaces: Namespace, hosts=frozenset({H}), **attrs) -> Tree:
    return Tree(hosts=[Host(h) for h in hosts],
                subsystems=[Subsystem(S, attrs=attrs, namespaces=namespaces or [ns()],
                                      allowed_hosts=hosts)],
                ports=[Port(1, addr=TCP, subsystems={S})])


def built(tree: Tree, scope: Scope | None = None) -> FakeConfigFS:
    fs = fake()
    result = apply(plan(tree, read(fs), scope or Scope.everything()), fs)
    assert result.ok, result.failed
    fs.start_session()
    return fs


def steps(actions) -> list[tuple[str, str, str | None]]:
    """(op, path relative to the object, value) for compact assertions."""
    return [(a.op, a.path, a.value) for a in actions]


def test_cold_create_follows_the_kernel_order() -> None:
    actions = plan(pool(), Tree(), SCOPE)
    got = steps(actions)
    assert got == [
        ("mkdir", f"hosts/{H}", None),
        ("mkdir", f"subsystems/{S}", None),
        ("mkdir", f"subsystems/{S}/namespaces/1", None),
        ("write", f"subsystems/{S}/namespaces/1/device_path", "/dev/nullb0"),
        ("write", f"subsystems/{S}/namespaces/1/device_uuid", namespace_uuid(S, 1)),
        ("write", f"subsystems/{S}/namespaces/1/device_nguid", namespace_nguid(S, 1)),
        ("write", f"subsystems/{S}/namespaces/1/enable", "1"),
        ("symlink", f"subsystems/{S}/allowed_hosts/{H}", f"hosts/{H}"),
        ("mkdir", "ports/1", None),
        ("write", "ports/1/addr_trtype", "tcp"),
        ("write", "ports/1/addr_adrfam", "ipv4"),
        ("write", "ports/1/addr_traddr", "127.0.0.1"),
        ("write", "ports/1/addr_trsvcid", "4420"),
        ("symlink", f"ports/1/subsystems/{S}", f"subsystems/{S}"),
    ]
    assert all(a.description for a in actions)


def test_converged_input_gives_an_empty_plan_and_zero_writes() -> None:
    fs = built(pool(model="kvagent"))
    assert plan(pool(model="kvagent"), read(fs), SCOPE) == []
    assert apply([], fs).writes == 0


def test_friendly_values_compare_equal_to_what_the_kernel_shows() -> None:
    fs = built(pool(allow_any_host=False, version="1.3"))
    same = pool(Namespace(1, device_path="/dev/nullb0",
                          device_uuid=namespace_uuid(S, 1).upper(), enable="1",
                          buffered_io="false", ana_grpid="1"),
                allow_any_host="no", version="1.3.0")
    assert plan(same, read(fs), SCOPE) == []


def test_only_differing_attributes_are_written() -> None:
    fs = built(pool(model="kvagent", version="1.3"))
    actions = plan(pool(model="other", version="1.3"), read(fs), SCOPE)
    assert steps(actions) == [("write", f"subsystems/{S}/attr_model", "other")]


def test_device_change_is_disable_write_enable() -> None:
    fs = built(pool())
    actions = plan(pool(ns(path="/dev/nullb1")), read(fs), SCOPE)
    base = f"subsystems/{S}/namespaces/1"
    assert steps(actions) == [("write", f"{base}/enable", "0"),
                              ("write", f"{base}/device_path", "/dev/nullb1"),
                              ("write", f"{base}/enable", "1")]
    assert apply(actions, fs).ok
    assert read(fs).subsystems[S].namespaces[1].device_path == "/dev/nullb1"


def test_device_change_keeps_enable_when_not_mentioned() -> None:
    fs = built(pool())
    desired = pool(Namespace(1, device_path="/tmp/f.img", buffered_io=True))
    actions = plan(desired, read(fs), SCOPE)
    assert [a.value for a in actions] == ["0", "/tmp/f.img", "1", "1"]
    assert actions[-1].path.endswith("/enable")
    assert apply(actions, fs).ok
    live = read(fs).subsystems[S].namespaces[1]
    assert (live.enable, live.buffered_io, live.device_path) == (True, True, "/tmp/f.img")


def test_ana_grpid_changes_without_disabling() -> None:
    fs = built(pool())
    actions = plan(pool(ns(ana_grpid=2)), read(fs), SCOPE)
    assert steps(actions) == [("write", f"subsystems/{S}/namespaces/1/ana_grpid", "2")]


def test_device_change_and_disable_writes_enable_once() -> None:
    fs = built(pool())
    actions = plan(pool(Namespace(1, device_path="/dev/nullb1", enable=False)), read(fs), SCOPE)
    assert [a.value for a in actions] == ["0", "/dev/nullb1"]


def test_disable_only() -> None:
    fs = built(pool())
    actions = plan(pool(Namespace(1, enable=False)), read(fs), SCOPE)
    assert steps(actions) == [("write", f"subsystems/{S}/namespaces/1/enable", "0")]


def test_linked_port_address_change_recreates_the_port() -> None:
    fs = built(pool())
    moved = Tree(hosts=[Host(H)], subsystems=pool().subsystems,
                 ports=[Port(1, addr={**TCP, "trsvcid": "4421"}, subsystems={S})])
    actions = plan(moved, read(fs), SCOPE)
    assert steps(actions) == [
        ("unlink", f"ports/1/subsystems/{S}", None),
        ("rmdir", "ports/1", None),
        ("mkdir", "ports/1", None),
        ("write", "ports/1/addr_trtype", "tcp"),
        ("write", "ports/1/addr_adrfam", "ipv4"),
        ("write", "ports/1/addr_traddr", "127.0.0.1"),
        ("write", "ports/1/addr_trsvcid", "4421"),
        ("symlink", f"ports/1/subsystems/{S}", f"subsystems/{S}"),
    ]
    assert apply(actions, fs).ok


def test_linked_port_param_change_recreates_the_port() -> None:
    fs = built(pool())
    tuned = Tree(hosts=[Host(H)], subsystems=pool().subsystems,
                 ports=[Port(1, addr=TCP, params={"inline_data_size": 8192}, subsystems={S})])
    actions = plan(tuned, read(fs), SCOPE)
    assert ("rmdir", "ports/1", None) in steps(actions)
    assert apply(actions, fs).ok
    assert read(fs).ports[1].params["inline_data_size"] == "8192"


def test_unlinked_port_is_changed_in_place() -> None:
    fs = built(Tree(ports=[Port(2, addr=TCP)]))
    actions = plan(Tree(ports=[Port(2, addr={**TCP, "trsvcid": "4422"})]), read(fs), SCOPE)
    assert steps(actions) == [("write", "ports/2/addr_trsvcid", "4422")]


def test_delete_everything_is_bottom_up() -> None:
    fs = built(Tree(hosts=[Host(H)], subsystems=[Subsystem(
        S, namespaces=[ns(1), ns(2, "/dev/nullb1")], allowed_hosts={H})],
        ports=[Port(1, addr=TCP, subsystems={S}, ana_groups={2: "optimized"},
                    referrals=[Referral("r", addr={"trtype": "tcp", "traddr": "10.1.1.1"})])]))
    actions = plan(Tree(), read(fs), SCOPE)
    assert steps(actions) == [
        ("unlink", f"ports/1/subsystems/{S}", None),
        ("rmdir", "ports/1/referrals/r", None),
        ("rmdir", "ports/1/ana_groups/2", None),
        ("rmdir", "ports/1", None),
        ("unlink", f"subsystems/{S}/allowed_hosts/{H}", None),
        ("write", f"subsystems/{S}/namespaces/1/enable", "0"),
        ("rmdir", f"subsystems/{S}/namespaces/1", None),
        ("write", f"subsystems/{S}/namespaces/2/enable", "0"),
        ("rmdir", f"subsystems/{S}/namespaces/2", None),
        ("rmdir", f"subsystems/{S}", None),
        ("rmdir", f"hosts/{H}", None),
    ]
    assert all(a.op != "rmdir" or a.path.count("/") >= 1 for a in actions)
    assert apply(actions, fs).ok and read(fs).is_empty()


def foreign_world() -> Tree:
    return Tree(hosts=[Host(FH), Host(H)],
                subsystems=[Subsystem(FOREIGN, namespaces=[Namespace(1, "/dev/nullb1",
                                                                     enable=True)],
                                      allowed_hosts={FH, H})],
                ports=[Port(7, addr={**TCP, "trsvcid": "5000"}, subsystems={FOREIGN})])


def test_foreign_objects_are_never_touched() -> None:
    world = Tree(hosts={**foreign_world().hosts, **pool().hosts},
                 subsystems={**foreign_world().subsystems, **pool().subsystems},
                 ports={**foreign_world().ports, **pool().ports})
    fs = built(world)
    actions = plan(Tree(), read(fs), SCOPE)
    assert not [a for a in actions if FOREIGN in a.path or "ports/7" in a.path
                or FH in a.path]
    assert f"hosts/{H}" not in [a.path for a in actions], "a foreign subsystem still allows H"
    assert apply(actions, fs).ok
    live = read(fs)
    assert set(live.subsystems) == {FOREIGN} and set(live.ports) == {7}
    assert set(live.hosts) == {FH, H}


def test_desired_objects_outside_the_scope_are_an_error() -> None:
    with pytest.raises(OutOfScope, match="outside the scope"):
        plan(foreign_world(), Tree(), SCOPE)
    with pytest.raises(OutOfScope, match="port 9"):
        plan(Tree(ports=[Port(9, addr=TCP)]), Tree(), SCOPE)


def test_a_change_that_would_touch_foreign_links_is_a_conflict() -> None:
    mixed = Tree(subsystems=[Subsystem(FOREIGN), Subsystem(S)],
                 ports=[Port(1, addr=TCP, subsystems={FOREIGN, S})])
    fs = built(mixed)
    with pytest.raises(ScopeConflict, match="port 1 is not desired but links foreign"):
        plan(Tree(), read(fs), SCOPE)
    # keeping the port and dropping only our link is fine
    keep = Tree(subsystems=[Subsystem(S)], ports=[Port(1, addr=TCP)])
    assert steps(plan(keep, read(fs), SCOPE)) == [("unlink", f"ports/1/subsystems/{S}", None)]
    exported_by_foreign = Tree(subsystems=[Subsystem(S)],
                               ports=[Port(7, addr=TCP, subsystems={S})])
    fs = built(exported_by_foreign)
    with pytest.raises(ScopeConflict, match="foreign ports"):
        plan(Tree(), read(fs), SCOPE)


@pytest.mark.parametrize(("desired", "message"), [
    (Tree(subsystems=[Subsystem(S, allowed_hosts={H})]), "does not declare in hosts"),
    (Tree(subsystems=[Subsystem(f"{PREFIX}:bad name")]), "whitespace"),
    (Tree(subsystems=[Subsystem(S, namespaces=[Namespace(0)])]), "nsid 0"),
    (Tree(hosts=[Host(H)], subsystems=[Subsystem(S, attrs={"allow_any_host": True},
                                                 allowed_hosts={H})]), "allow_any_host=1"),
    (Tree(ports=[Port(1, addr=TCP, subsystems={S})]), "does not declare"),
    (Tree(subsystems=[Subsystem(S, namespaces=[Namespace(1, enable=True)])]),
     "enable needs a device_path"),
    (Tree(ports=[Port(1, ana_groups={200: "optimized"})]), "ANA group 200"),
])
def test_invalid_desired_states_are_refused(desired, message) -> None:
    with pytest.raises(PlanError, match=message) as info:
        plan(desired, Tree(), SCOPE)
    assert "nothing was changed" in info.value.hint


def test_a_feature_the_kernel_lacks_is_a_clear_error() -> None:
    fs = built(pool())  # 6.1 profile: hosts have no dhchap_key
    feats = features(fs, kernel="6.1.0-57-amd64")
    desired = Tree(hosts=[Host(H, attrs={"dhchap_key": "DHHC-1:00:abc:"})],
                   subsystems=pool().subsystems, ports=pool().ports)
    with pytest.raises(FeatureMissing) as info:
        plan(desired, read(fs), SCOPE, features=feats)
    err = info.value
    assert err.feature.startswith("DH-HMAC-CHAP") and err.kernel == "6.1.0-57-amd64"
    assert "6.1.0-57-amd64" in err.message and err.attribute == "dhchap_key"
    # without feature knowledge the plan is made; the kernel would answer ENOENT
    actions = plan(desired, read(fs), SCOPE)
    result = apply(actions, fs)
    assert [type(e).__name__ for e in result.errors] == ["NotFound"]
    assert "does not exist" in result.errors[0].hint


def test_revalidate_size_is_written_last_for_enabled_namespaces() -> None:
    fs = built(pool())
    actions = plan(pool(), read(fs), SCOPE, revalidate=[(S, 1)])
    assert steps(actions) == [("write", f"subsystems/{S}/namespaces/1/revalidate_size", "1")]
    assert apply(actions, fs).ok
    assert plan(pool(Namespace(1, enable=False)), read(fs), SCOPE, revalidate=[(S, 1)])[-1] \
        .path.endswith("/enable")
    with pytest.raises(PlanError, match="revalidate_size"):
        plan(pool(), read(fs), SCOPE, revalidate=[(S, 7)])
    assert revalidate_action(S, 1).path == f"subsystems/{S}/namespaces/1/revalidate_size"


def test_allow_any_host_and_allowed_hosts_are_ordered_for_the_kernel() -> None:
    fs = built(Tree(subsystems=[Subsystem(S, attrs={"allow_any_host": True})]))
    to_hosts = Tree(hosts=[Host(H)], subsystems=[Subsystem(S, allowed_hosts={H})])
    actions = plan(to_hosts, read(fs), SCOPE)
    assert steps(actions) == [("mkdir", f"hosts/{H}", None),
                              ("write", f"subsystems/{S}/attr_allow_any_host", "0"),
                              ("symlink", f"subsystems/{S}/allowed_hosts/{H}", f"hosts/{H}")]
    assert apply(actions, fs).ok
    fs.start_session()
    back = Tree(hosts=[Host(H)], subsystems=[Subsystem(S, attrs={"allow_any_host": 1})])
    actions = plan(back, read(fs), SCOPE)
    assert [a.op for a in actions] == ["unlink", "write"]
    assert apply(actions, fs).ok


def test_cntlid_range_is_written_in_a_valid_order() -> None:
    fs = built(Tree(subsystems=[Subsystem(S, attrs={"cntlid_max": 100})]))
    high = Tree(subsystems=[Subsystem(S, attrs={"cntlid_min": 200, "cntlid_max": 300})])
    actions = plan(high, read(fs), SCOPE)
    assert [a.path.rsplit("_", 1)[-1] for a in actions] == ["max", "min"]
    assert apply(actions, fs).ok
    low = Tree(subsystems=[Subsystem(S, attrs={"cntlid_min": 5, "cntlid_max": 50})])
    actions = plan(low, read(fs), SCOPE)
    assert [a.path.rsplit("_", 1)[-1] for a in actions] == ["min", "max"]
    assert apply(actions, fs).ok


def test_ana_groups_and_referrals() -> None:
    port = Port(1, addr=TCP, ana_groups={1: "optimized", 2: "inaccessible"},
                referrals=[Referral("r1", addr={"trtype": "tcp", "adrfam": "ipv4",
                                                "traddr": "10.1.1.1", "trsvcid": "4420"},
                                    enable=True)])
    fs = built(Tree(ports=[port]))
    assert plan(Tree(ports=[port]), read(fs), SCOPE) == []
    moved = Port(1, addr=TCP, ana_groups={1: "non-optimized"},
                 referrals=[Referral("r1", addr={"traddr": "10.1.1.2"})])
    actions = plan(Tree(ports=[moved]), read(fs), SCOPE)
    assert steps(actions) == [
        ("rmdir", "ports/1/ana_groups/2", None),
        ("write", "ports/1/ana_groups/1/ana_state", "non-optimized"),
        ("write", "ports/1/referrals/r1/enable", "0"),
        ("write", "ports/1/referrals/r1/addr_traddr", "10.1.1.2"),
        ("write", "ports/1/referrals/r1/enable", "1"),
    ]
    assert apply(actions, fs).ok
    untouched = Port(1, addr=TCP)  # ana_groups/referrals None: left alone
    assert plan(Tree(ports=[untouched]), read(fs), SCOPE) == []


def test_link_actions_depend_on_port_subsystem_and_addresses() -> None:
    actions = plan(pool(), Tree(), SCOPE)
    link = actions[-1]
    assert link.op == "symlink" and link.path.startswith("ports/1/subsystems/")
    assert {"ports/1", f"subsystems/{S}", "ports/1/addr_traddr"} <= link.after
    assert link.context["traddr"] == "127.0.0.1"
    enable = next(a for a in actions if a.path.endswith("/enable"))
    assert f"subsystems/{S}/namespaces/1/device_uuid" in enable.after


def test_a_second_subsystem_can_be_added_while_the_first_is_exported() -> None:
    fs = built(pool())
    two = Tree(hosts=[Host(H)], subsystems=[*pool().subsystems.values(),
                                            Subsystem(S2, allowed_hosts={H})],
               ports=[Port(1, addr=TCP, subsystems={S, S2})])
    actions = plan(two, read(fs), SCOPE)
    assert steps(actions) == [("mkdir", f"subsystems/{S2}", None),
                              ("symlink", f"subsystems/{S2}/allowed_hosts/{H}", f"hosts/{H}"),
                              ("symlink", f"ports/1/subsystems/{S2}", f"subsystems/{S2}")]

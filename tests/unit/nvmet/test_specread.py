"""The planner's read (``read(fs, spec=read_spec(desired, features))``): it reads only the
files the planner needs, each once; it sees every drift of a compared attribute; an
attribute only a desired tree mentions needs no reader change."""

from __future__ import annotations

import errno as E
import os
import uuid
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvmet.applier import apply
from nvmet.configfs import RealConfigFS
from nvmet.errors import FeatureMissing, ReadError
from nvmet.fake import KERNEL_6_1, KERNEL_NEWER, FakeConfigFS
from nvmet.liveread import read
from nvmet.model import NS_DISABLED_ONLY, Host, Namespace, Port, Referral, Subsystem, Tree
from nvmet.planner import Scope, plan
from nvmet.reader import features
from nvmet.readspec import ReadSpec, read_spec
from nvmet.specread import read_more

from .test_properties import build
from .test_target_cmd import materialize
from .trees import FAKE_UNIVERSE, SCOPE, conforms, foreign_tree, merge, trees

SUB = "nqn.2026-11.io.kvagent.test:node1:pool0"
SUB2 = "nqn.2026-11.io.kvagent.test:node1:pool1"
HOST = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001"


def sample() -> Tree:
    """Two subsystems, four namespaces, a port with ANA groups and a referral."""
    return Tree(
        hosts=[Host(HOST)],
        subsystems=[
            Subsystem(SUB, attrs={"allow_any_host": False, "model": "kv"}, allowed_hosts={HOST},
                      namespaces=[Namespace(n, device_path=f"/dev/nullb{n - 1}", enable=True,
                                            device_uuid=str(uuid.UUID(int=n)))
                                  for n in (1, 2, 3)]),
            Subsystem(SUB2, namespaces=[Namespace(7, device_path="/dev/nullb3")])],
        ports=[Port(1, addr={"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1",
                             "trsvcid": "4420"}, params={"inline_data_size": 8192},
                    subsystems={SUB}, ana_groups={1: "optimized", 2: "inaccessible"},
                    referrals=[Referral("r1", addr={"trtype": "tcp", "adrfam": "ipv4",
                                                    "traddr": "10.9.9.9", "trsvcid": "4420"},
                                        enable=True)])],
    )


def fake_with(tree: Tree, profile=KERNEL_6_1) -> FakeConfigFS:
    fs = FakeConfigFS(profile=profile)
    for i in range(4):
        fs.add_device(f"/dev/nullb{i}")
    result = apply(plan(tree, read(fs), Scope.everything()), fs)
    assert result.ok, result.failed
    return fs


def kind_of(path: str) -> tuple[str, str]:
    """(ReadSpec field, file name) of an attribute file path."""
    parts = path.split("/")
    kind = {("hosts", 3): "hosts", ("subsystems", 3): "subsystems",
            ("subsystems", 5): "namespaces", ("ports", 3): "ports"}.get((parts[0], len(parts)))
    if kind is None:
        kind = parts[2]  # ports/<id>/ana_groups|referrals/<name>/<file>
    return kind, parts[-1]


def test_reads_only_the_planners_files_each_once() -> None:
    desired = sample()
    fs = fake_with(desired)
    feats = features(fs)
    spec = read_spec(desired, feats)
    assert spec.namespaces == {"enable", "device_path", "device_uuid"}
    assert spec.subsystems == {"attr_allow_any_host", "attr_model"}
    assert spec.ports == {"addr_trtype", "addr_adrfam", "addr_traddr", "addr_trsvcid",
                          "param_inline_data_size"}
    fs.files_read.clear()

    live = read(fs, spec=spec)

    assert plan(desired, live, Scope.everything(), feats) == []
    assert set(fs.files_read.values()) == {1}, "every file is read once"
    outside = [p for p in fs.files_read if kind_of(p)[1] not in getattr(spec, kind_of(p)[0])]
    assert outside == []
    # exactly the spec's files of every live object: 4 namespaces, 2 subsystems, 1 port,
    # 2 ANA groups, 1 referral
    assert len(fs.files_read) == 4 * 3 + 2 * 2 + 5 + 2 * 1 + 5
    fs.files_read.clear()
    read(fs)
    assert {"attr_serial", "ana_grpid", "buffered_io", "addr_treq"} <= {
        kind_of(p)[1] for p in fs.files_read}, "the full read still reads everything"


def project(tree: Tree, spec: ReadSpec) -> Tree:
    """``tree`` (a full read) with only the attribute files ``spec`` names."""

    def ns(n: Namespace) -> Namespace:
        keep = spec.namespaces
        return Namespace(
            n.nsid, **{f: getattr(n, f) if f in keep else None for f in (
                "device_path", "device_uuid", "device_nguid", "enable", "ana_grpid",
                "buffered_io")}, attrs={k: v for k, v in n.attrs.items() if k in keep})

    def port(p: Port) -> Port:
        return replace(
            p, addr={k: v for k, v in p.addr.items() if f"addr_{k}" in spec.ports},
            params={k: v for k, v in p.params.items() if f"param_{k}" in spec.ports},
            ana_groups={g: s if "ana_state" in spec.ana_groups else ""
                        for g, s in (p.ana_groups or {}).items()},
            referrals=[Referral(r.name, addr={k: v for k, v in r.addr.items()
                                              if f"addr_{k}" in spec.referrals},
                                enable=r.enable if "enable" in spec.referrals else None)
                       for r in (p.referrals or {}).values()])

    return Tree(
        hosts=[Host(h.nqn, {k: v for k, v in h.attrs.items() if k in spec.hosts})
               for h in tree.hosts.values()],
        subsystems=[replace(s, attrs={k: v for k, v in s.attrs.items()
                                      if f"attr_{k}" in spec.subsystems},
                            namespaces=[ns(n) for n in s.namespaces.values()])
                    for s in tree.subsystems.values()],
        ports=[port(p) for p in tree.ports.values()])


@settings(max_examples=100)
@given(live=trees(), desired=trees(), foreign=st.booleans())
def test_spec_read_is_the_full_read_narrowed_and_plans_the_same(live, desired, foreign) -> None:
    fs = build(merge(live, foreign_tree(FAKE_UNIVERSE, True)) if foreign else live)
    feats = features(fs)
    spec = read_spec(desired, feats)
    full = read(fs)
    fs.files_read.clear()
    narrow = read(fs, spec=spec)
    # counted on the fake: no file outside the spec, none twice
    assert not fs.files_read or max(fs.files_read.values()) == 1
    assert [p for p in fs.files_read if kind_of(p)[1] not in getattr(spec, kind_of(p)[0])] == []
    assert narrow == project(full, spec)
    assert plan(desired, narrow, SCOPE, feats) == plan(desired, full, SCOPE, feats)
    # completing a read of the planner's own files gives the same tree
    base = ReadSpec.planner()
    assert read_more(fs, read(fs, spec=base), base, spec) == narrow


# ---------------------------------------------------------------- drift of one attribute

def compared(desired: Tree) -> list[tuple[str, str]]:
    """(path, desired value) of every attribute file the desired tree mentions."""
    out = [(f"hosts/{n}/{k}", v) for n, h in desired.hosts.items() for k, v in h.attrs.items()]
    for nqn, sub in desired.subsystems.items():
        out += [(f"subsystems/{nqn}/attr_{k}", v) for k, v in sub.attrs.items()]
        for nsid, ns in sub.namespaces.items():
            out += [(f"subsystems/{nqn}/namespaces/{nsid}/{k}", v) for k, v in ns.files().items()]
    for pid, port in desired.ports.items():
        out += [(f"ports/{pid}/addr_{k}", v) for k, v in port.addr.items()]
        out += [(f"ports/{pid}/param_{k}", v) for k, v in port.params.items()]
        for g, state in (port.ana_groups or {}).items():
            out.append((f"ports/{pid}/ana_groups/{g}/ana_state", state))
        for name, ref in (port.referrals or {}).items():
            out += [(f"ports/{pid}/referrals/{name}/addr_{k}", v) for k, v in ref.addr.items()]
            if ref.enable is not None:
                out.append((f"ports/{pid}/referrals/{name}/enable", "1" if ref.enable else "0"))
    return out


def drifted(name: str, value: str) -> str:
    """A value different from ``value`` for attribute file ``name``."""
    if value in ("0", "1") and name not in ("ana_grpid",) and not name.startswith("param_"):
        return "0" if value == "1" else "1"
    if name in ("device_uuid", "device_nguid"):
        return "0d4a1bc2-1111-4222-8333-000000000000" if value[-1] != "0" else \
            "0d4a1bc2-1111-4222-8333-000000000001"
    if name == "ana_state":
        return "optimized" if value != "optimized" else "inaccessible"
    if value.lstrip("-").isdigit():
        return str(int(value) + 1)
    return value + "-drift"


@settings(max_examples=300)
@given(tree=trees(), data=st.data())
def test_a_drift_in_any_compared_attribute_is_seen_and_fixed_alone(tree, data) -> None:
    targets = compared(tree)
    if not targets:
        return
    fs = build(tree)
    path, want = data.draw(st.sampled_from(targets))
    fs.poke(path, drifted(path.rsplit("/", 1)[1], want))
    feats = features(fs)

    actions = plan(tree, read(fs, spec=read_spec(tree, feats)), SCOPE, feats)

    fixes = [a for a in actions if a.path == path]
    assert [(a.op, a.value) for a in fixes] == [("write", want)], actions
    parent, name = path.rsplit("/", 1)
    others = [(a.op, a.path, a.value) for a in actions if a.path != path]
    enable = f"{parent}/enable"
    if others and path.startswith("ports/") and "/ana_groups/" not in path \
            and "/referrals/" not in path:
        # an address/parameter of a port that exports subsystems: the port is re-created
        pid = path.split("/")[1]
        assert all(p == f"ports/{pid}" or p.startswith(f"ports/{pid}/") for _, p, _ in others)
    elif others:
        # a namespace device attribute (or a referral address) while enabled: the triple
        assert name in NS_DISABLED_ONLY or "/referrals/" in path, actions
        assert [(a.op, a.path, a.value) for a in actions] == [
            ("write", enable, "0"), ("write", path, want), ("write", enable, "1")]
    result = apply(actions, fs)
    assert result.ok, result.failed
    assert conforms(tree, read(fs), SCOPE) == []


# ---------------------------------------------------------------- attributes of newer kernels

def test_an_attribute_only_a_desired_tree_mentions_is_read_and_compared() -> None:
    """dhchap_key (hosts, issue 14), addr_treq (ports) and an attribute no code in nvmet
    has ever heard of: mention them in a desired tree and they are read and compared."""
    profile = {k: dict(v) for k, v in KERNEL_NEWER.items()}
    profile["subsystem"]["attr_frobnicate"] = "0"
    key = "DHHC-1:00:ia6zGodOr5SEG44qDLnzD5uNb0eXVxYnJpvXBVgykzd1Xyt8:"
    desired = Tree(
        hosts=[Host(HOST, attrs={"dhchap_key": key})],
        subsystems=[Subsystem(SUB, attrs={"frobnicate": "1"}, allowed_hosts={HOST})],
        ports=[Port(1, addr={"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1",
                             "trsvcid": "4420", "treq": "required"})])
    fs = fake_with(desired, profile)
    fs.poke(f"hosts/{HOST}/dhchap_key", "")
    fs.poke(f"subsystems/{SUB}/attr_frobnicate", "0")
    fs.poke("ports/1/addr_treq", "not required")
    feats = features(fs)
    fs.files_read.clear()

    live = read(fs, spec=read_spec(desired, feats))

    assert live.hosts[HOST].attrs == {"dhchap_key": ""}
    assert live.subsystems[SUB].attrs["frobnicate"] == "0"
    assert live.ports[1].addr["treq"] == "not required"
    assert {(a.path, a.value) for a in plan(desired, live, Scope.everything(), feats)} == {
        (f"hosts/{HOST}/dhchap_key", key), (f"subsystems/{SUB}/attr_frobnicate", "1"),
        ("ports/1/addr_treq", "required")}
    # without the desired tree mentioning them they are not read at all
    fs.files_read.clear()
    read(fs, spec=read_spec(None, feats))
    assert not {p.rsplit("/", 1)[1] for p in fs.files_read} & {
        "dhchap_key", "attr_frobnicate", "addr_treq"}


def test_features_drop_files_this_kernel_lacks_and_the_planner_refuses_them() -> None:
    desired = Tree(hosts=[Host(HOST, attrs={"dhchap_key": "DHHC-1:00:x:"})])
    fs = fake_with(Tree(hosts=[Host(HOST)]))  # 6.1: no dhchap
    feats = features(fs)
    spec = read_spec(desired, feats)
    assert spec.hosts == frozenset()
    fs.files_read.clear()
    live = read(fs, spec=spec)
    assert not fs.files_read, "no attempt to open a file the kernel does not have"
    with pytest.raises(FeatureMissing):
        plan(desired, live, Scope.everything(), feats)


def test_a_missing_attribute_is_left_out_without_features() -> None:
    desired = Tree(hosts=[Host(HOST, attrs={"dhchap_key": "DHHC-1:00:x:"})])
    fs = fake_with(Tree(hosts=[Host(HOST)]))
    assert read(fs, spec=read_spec(desired)).hosts[HOST].attrs == {}


# ---------------------------------------------------------------- failures and the real seam

class FailOn(FakeConfigFS):
    def __init__(self, bad: str, code: int):
        super().__init__()
        self.bad, self.code = bad, code

    def read(self, path: str) -> str:
        if path.endswith(self.bad):
            raise OSError(self.code, "injected", path)
        return super().read(path)


@pytest.mark.parametrize("code", [E.EIO, E.EACCES])
def test_a_failed_read_names_the_file(code) -> None:
    fs = FailOn("namespaces/5/device_path", code)
    fs.mkdir(f"subsystems/{SUB}")
    fs.mkdir(f"subsystems/{SUB}/namespaces/5")
    with pytest.raises(ReadError) as info:
        read(fs, spec=read_spec())
    assert info.value.errno == code
    assert info.value.path == f"subsystems/{SUB}/namespaces/5/device_path"


def test_real_configfs_reads_the_same_as_the_fake(tmp_path) -> None:
    desired = sample()
    fake = fake_with(desired)
    real = RealConfigFS(materialize(fake, tmp_path) / "nvmet")
    spec = read_spec(desired, features(fake)) | ReadSpec(namespaces={"resv_enable"})
    assert read(real, spec=spec) == read(fake, spec=spec)
    assert real.writes == 0


def test_real_read_attrs_leaves_out_missing_files_and_fails_for_a_gone_directory(
        tmp_path) -> None:
    (tmp_path / "hosts" / "h").mkdir(parents=True)
    (tmp_path / "hosts" / "h" / "a").write_text("1\n")
    fs = RealConfigFS(tmp_path)
    assert fs.read_attrs("hosts/h", ["a", "nope"]) == {"a": "1"}
    with pytest.raises(FileNotFoundError) as info:
        fs.read_attrs("hosts/gone", ["a"])
    assert info.value.filename == "hosts/gone"
    os.symlink(tmp_path / "hosts" / "h", tmp_path / "hosts" / "link")
    (tmp_path / "hosts" / "f").write_text("x")
    assert fs.children("hosts") == (["h"], ["link"], ["f"])
    (tmp_path / "hosts" / "g").mkdir()
    (tmp_path / "hosts" / "g" / "a").write_text("2\n")
    assert fs.read_each("hosts", ["h", "g"], ["a", "nope"]) == [{"a": "1"}, {"a": "2"}]
    with pytest.raises(FileNotFoundError) as info:
        fs.read_each("hosts", ["h", "gone"], ["a"])
    assert info.value.filename == "hosts/gone"


texts = st.one_of(st.sampled_from(["", "(null)", " (null)", "1", "0", "2", " /dev/x ",
                                   "/dev/nullb0", "7", "0d4a1bc2-1111-4222-8333-444455556666",
                                   "0D4A1BC2-1111-4222-8333-444455556666", "y"]),
                  st.text(max_size=6))


@settings(max_examples=300)
@given(files=st.dictionaries(st.sampled_from(
    ["device_path", "device_uuid", "device_nguid", "enable", "buffered_io", "resv_enable",
     "p2pmem"]), texts), grp=st.one_of(st.none(), st.integers(1, 128)))
def test_namespace_from_files_is_the_constructor(files, grp) -> None:
    """The reader's fast constructor builds exactly what the checked constructor does."""
    if grp is not None:
        files["ana_grpid"] = str(grp)
    path = files.get("device_path")
    rest = {k: v for k, v in files.items() if k not in (
        "device_path", "device_uuid", "device_nguid", "enable", "buffered_io", "ana_grpid")}
    expected = Namespace(
        5, device_path=None if path in (None, "(null)", "") else path,
        device_uuid=files.get("device_uuid"), device_nguid=files.get("device_nguid"),
        enable=None if "enable" not in files else files["enable"] == "1",
        ana_grpid=grp, attrs=rest,
        buffered_io=None if "buffered_io" not in files else files["buffered_io"] == "1")
    got = Namespace.from_files(5, files)
    assert got == expected and hash(got) == hash(expected)


@pytest.mark.parametrize("name", ["01", "²", "١", "x"])
def test_a_namespace_directory_that_is_not_a_plain_number_is_a_read_error(tmp_path,
                                                                          name) -> None:
    desired = sample()
    root = materialize(fake_with(desired), tmp_path) / "nvmet"
    (root / "subsystems" / SUB2 / "namespaces" / name).mkdir()
    for spec in (read_spec(desired), None):
        with pytest.raises(ReadError, match="plain decimal"):
            read(RealConfigFS(root), spec=spec)


def open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def test_real_read_each_closes_every_file_in_batches_and_on_errors(tmp_path) -> None:
    """Files are closed in batches (close_range over runs of consecutive fds): none is
    left open, after a whole read or a failed one, and no fd that is not the reader's
    is closed (here: one held open between the reader's)."""
    from nvmet import configfs

    count = configfs.CLOSE_BATCH * 2 + 5
    for i in range(count):
        d = tmp_path / "namespaces" / str(i + 1)
        d.mkdir(parents=True)
        for name in ("a", "b"):
            (d / name).write_text(f"{i}{name}\n")
    fs = RealConfigFS(tmp_path)
    before = open_fds()
    got = fs.read_each("namespaces", [str(i + 1) for i in range(count)], ["a", "b"])
    assert got == [{"a": f"{i}a", "b": f"{i}b"} for i in range(count)]
    assert open_fds() == before
    (tmp_path / "namespaces" / "100" / "b").unlink()
    (tmp_path / "namespaces" / "100" / "b").mkdir()  # read() of a directory: EISDIR
    with pytest.raises(IsADirectoryError) as info:
        fs.read_each("namespaces", [str(i + 1) for i in range(count)], ["a", "b"])
    assert info.value.filename == "namespaces/100/b"
    assert open_fds() == before
    # A run of fds with someone else's fd in the middle: theirs stays open.
    fds = [os.open(tmp_path / "namespaces/1/a", os.O_RDONLY) for _ in range(3)]
    keep = fds.pop(1)
    configfs.close_fds(fds)
    assert fds == [] and keep in open_fds() and open_fds() == before | {keep}
    os.close(keep)

"""The reader on a fake rebuilt from the reference 6.1 capture, failures, features."""

from __future__ import annotations

import errno as E

import pytest

from nvmet.errors import NvmetUnavailable, ReadError
from nvmet.fake import KERNEL_NEWER, FakeConfigFS
from nvmet.reader import PROBE_NQN, features, read

from .capture import capture_fake

POOL0 = "nqn.2026-11.io.kvagent:pool0"
HOST = "nqn.2014-08.org.nvmexpress:uuid:7655a38e-e173-4d42-875a-c7e065e83747"


def test_reads_the_captured_tree() -> None:
    tree = read(capture_fake())
    assert set(tree.hosts) == {HOST}
    assert set(tree.subsystems) == {POOL0, "bad name"}
    pool = tree.subsystems[POOL0]
    assert pool.attrs["serial"] == "96029581a21342812a2a"
    assert pool.attrs["model"] == "Linux" and pool.attrs["qid_max"] == "128"
    assert pool.allowed_hosts == {HOST}
    ns1, ns2 = pool.namespaces[1], pool.namespaces[2]
    assert (ns1.device_path, ns1.enable, ns1.device_uuid) == (
        "/dev/nullb0", True, "777c9365-0b21-4484-b476-bfe48dabf593")
    assert ns1.device_nguid == "00000000-0000-0000-0000-000000000000"
    assert (ns2.device_path, ns2.enable, ns2.device_uuid) == (
        "$WORK/f1.img", False, "0d4a1bc2-1111-4222-8333-444455556666")
    assert ns1.ana_grpid == 1 and ns1.buffered_io is False
    assert "revalidate_size" not in ns1.attrs  # write-only: skipped, not an error
    p1, p9 = tree.ports[1], tree.ports[9]
    assert p1.addr == {"adrfam": "ipv4", "traddr": "127.0.0.1", "treq": "not specified",
                       "trsvcid": "4420", "trtype": "tcp"}
    assert p1.params == {"inline_data_size": "16384", "pi_enable": "0"}
    assert p1.subsystems == {POOL0} and p9.subsystems == frozenset()
    assert p9.addr["traddr"] == "192.0.2.77"
    assert p1.ana_groups == {1: "optimized"} and p1.referrals == {}


def test_unset_device_path_reads_as_none() -> None:
    fs = FakeConfigFS()
    fs.mkdir("subsystems/nqn.2026-11.io.kvagent:x")
    fs.mkdir("subsystems/nqn.2026-11.io.kvagent:x/namespaces/5")
    assert fs.read("subsystems/nqn.2026-11.io.kvagent:x/namespaces/5/device_path") == "(null)"
    ns = read(fs).subsystems["nqn.2026-11.io.kvagent:x"].namespaces[5]
    assert ns.device_path is None and ns.enable is False


class Failing(FakeConfigFS):
    """A fake whose reads of one path fail, like a racing rmdir or an I/O error."""

    def __init__(self, bad: str, code: int):
        super().__init__()
        self.bad, self.code = bad, code

    def read(self, path: str) -> str:
        if path.endswith(self.bad):
            raise OSError(self.code, "injected", path)
        return super().read(path)


@pytest.mark.parametrize("code", [E.EIO, E.ENOENT, E.EACCES])
def test_a_failed_read_raises_never_an_empty_tree(code) -> None:
    fs = Failing("attr_model", code)
    fs.mkdir("subsystems/nqn.2026-11.io.kvagent:x")
    with pytest.raises(ReadError) as info:
        read(fs)
    assert info.value.errno == code
    assert info.value.path == "subsystems/nqn.2026-11.io.kvagent:x/attr_model"


def test_missing_nvmet_is_unavailable_with_a_hint(tmp_path) -> None:
    from nvmet.configfs import RealConfigFS

    with pytest.raises(NvmetUnavailable) as info:
        read(RealConfigFS(tmp_path / "nvmet"))
    assert "modprobe nvmet" in info.value.hint
    (tmp_path / "nvmet" / "hosts").mkdir(parents=True)
    with pytest.raises(NvmetUnavailable, match="lacks"):
        read(RealConfigFS(tmp_path / "nvmet"))


def test_non_decimal_port_directory_is_a_read_error() -> None:
    fs = FakeConfigFS()
    fs.mkdir("ports/0x10")  # the kernel parses it as port 16
    with pytest.raises(ReadError, match="decimal"):
        read(fs)


def test_features_on_6_1_from_existing_objects() -> None:
    f = features(capture_fake(), kernel="6.1.0-57-amd64")
    assert f.dhchap is False and f.tsas is False and f.reservations is False
    assert f.qid_max is True
    assert f.has("referral", "addr_portid") is None  # no referral to look at


def test_features_unknown_without_objects_then_probed() -> None:
    fs = FakeConfigFS()
    assert features(fs).dhchap is None
    f = features(fs, probe=True)
    assert f.dhchap is False and f.has("referral", "addr_portid") is True
    assert read(fs).is_empty(), "the probe removes what it made"
    assert [op.op for op in fs.ops].count("mkdir") == [op.op for op in fs.ops].count("rmdir")
    assert any(PROBE_NQN in op.path for op in fs.ops)


def test_features_on_a_newer_kernel() -> None:
    fs = FakeConfigFS(profile=KERNEL_NEWER)
    f = features(fs, probe=True)
    assert f.dhchap is True and f.tsas is True and f.reservations is True

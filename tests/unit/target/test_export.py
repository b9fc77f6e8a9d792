"""From pools to nvmet objects: per-host subsystems, shared ones, ACLs, ids, ports."""

from __future__ import annotations

from typing import Any

import yaml

from agent.config import parse_config
from agent.config.model import Config
from agent.records import Storage, TargetRecords
from agent.target.backings.base import Volume
from agent.target.desired import grantees, pool_layout
from agent.target.export import desired_hosts, desired_port, export_pool, serial_for
from nvmet.model import Namespace

H1 = "nqn.2014-08.org.nvmexpress:uuid:2b7e1a3c-0d4f-4b6a-9c1e-5f2a7d9e0b11"
H2 = "nqn.2014-08.org.nvmexpress:uuid:6c3f2b4d-1e5a-4c7b-8d2f-6a3b8e0f1c22"
PREFIX = "nqn.2026-11.io.kvagent:stor"


def config(**pool: Any) -> Config:
    base = {"name": "kv", "ports": ["t", "r"],
            "backing": {"kind": "file", "directory": "/srv/kv"},
            "namespaces": {"count": 2, "size": "4MiB"},
            "hosts": [{"name": "gpu-1", "nqn": H1}, {"name": "gpu-2", "nqn": H2}]}
    base.update(pool)
    data = {"version": 1, "node": {"name": "stor"}, "target": {
        "ports": [{"name": "t", "id": 1, "transport": "tcp", "address": "10.0.0.1"},
                  {"name": "r", "id": 2, "transport": "rdma", "address": "fd00::1",
                   "service": 4421, "inline_data_size": 16384},
                  {"name": "unused", "id": 3, "transport": "tcp", "address": "10.0.0.2"}],
        "pools": [base]}}
    return parse_config(yaml.safe_dump(data))


def volumes(hosts: list[str | None], count: int = 2, size: int | None = 4 << 20,
            buffered: bool = False) -> list[Volume]:
    return [Volume("kv", h, n, path := f"/srv/kv/kv/{h or 'shared'}/ns{n}.img", size,
                   ids(h, n)[0], ids(h, n)[1], Storage("file", path), buffered)
            for h in hosts for n in range(1, count + 1)]


def ids(host: str | None, nsid: int) -> tuple[str, str]:
    """Identities as a driver would have recorded them with the storage."""
    tag = f"{(host or 'shared').replace('gpu-', '0'):0>4}"[:4] + f"{nsid:04d}"
    return (f"00000000-0000-4000-8000-0000{tag}",
            f"00000000-0000-4000-9000-0000{tag}")


def export(cfg: Config, vols: list[Volume], live: frozenset[str] = frozenset(), **kw: Any):
    pool = cfg.target.pools[0]
    hosts = [h for h in grantees(pool)]
    return export_pool(cfg, pool, hosts, vols, live, **kw)


def test_each_host_gets_its_own_subsystem_namespaces_and_acl() -> None:
    cfg = config()
    pool = cfg.target.pools[0]
    assert grantees(pool) == ["gpu-1", "gpu-2"]
    assert pool_layout(cfg, pool, TargetRecords()) == {f"{PREFIX}:kv:gpu-1": (1, 2),
                                                       f"{PREFIX}:kv:gpu-2": (1, 2)}
    out = export(cfg, volumes(["gpu-1", "gpu-2"]))
    assert out.ports == (1, 2)
    assert out.hosts == tuple(sorted([H1, H2]))
    subs = {s.nqn: s for s in out.subsystems}
    one, two = subs[f"{PREFIX}:kv:gpu-1"], subs[f"{PREFIX}:kv:gpu-2"]
    assert one.allowed_hosts == {H1} and two.allowed_hosts == {H2}
    assert [ns.device_path for ns in one.namespaces.values()] == [
        "/srv/kv/kv/gpu-1/ns1.img", "/srv/kv/kv/gpu-1/ns2.img"]
    assert [ns.device_path for ns in two.namespaces.values()] == [
        "/srv/kv/kv/gpu-2/ns1.img", "/srv/kv/kv/gpu-2/ns2.img"]
    for sub in (one, two):
        assert sub.attrs["allow_any_host"] == "0"
        assert sub.attrs["model"] == "kvagent" and sub.attrs["serial"] == serial_for(sub.nqn)
        host = sub.nqn.rsplit(":", 1)[1]
        for ns in sub.namespaces.values():
            # The identity recorded with the storage, not one derived from the position.
            assert (ns.device_uuid, ns.device_nguid) == ids(host, ns.nsid)
            assert ns.enable is True and ns.buffered_io is False
    assert len(serial_for(one.nqn)) == 20 and serial_for(one.nqn) != serial_for(two.nqn)


def test_model_and_serial_are_written_only_when_the_subsystem_is_new() -> None:
    cfg = config()
    existing = frozenset({f"{PREFIX}:kv:gpu-1"})
    subs = {s.nqn: s for s in export(cfg, volumes(["gpu-1", "gpu-2"]), existing).subsystems}
    assert "model" not in subs[f"{PREFIX}:kv:gpu-1"].attrs
    assert "serial" not in subs[f"{PREFIX}:kv:gpu-1"].attrs
    assert subs[f"{PREFIX}:kv:gpu-2"].attrs["model"] == "kvagent"


def test_shared_pool_is_one_subsystem_for_all_hosts() -> None:
    cfg = config(shared=True)
    pool = cfg.target.pools[0]
    assert grantees(pool) == [None]
    (sub,) = export(cfg, volumes([None])).subsystems
    assert sub.nqn == f"{PREFIX}:kv"
    assert sub.allowed_hosts == {H1, H2} and sub.attrs["allow_any_host"] == "0"


def test_allow_any_host_is_explicit_and_lists_no_hosts() -> None:
    cfg = config(shared=True, allow_any_host=True, hosts=[])
    (sub,) = export(cfg, volumes([None])).subsystems
    assert sub.attrs["allow_any_host"] == "1" and sub.allowed_hosts == frozenset()


def test_no_hosts_exports_nothing() -> None:
    for cfg in (config(hosts=[]), config(hosts=[], shared=True)):
        pool = cfg.target.pools[0]
        assert grantees(pool) == [] and pool_layout(cfg, pool, TargetRecords()) == {}
        out = export(cfg, [])
        assert out.subsystems == () and out.hosts == ()


def test_device_volumes_leave_buffered_io_alone_and_files_can_ask_for_it() -> None:
    cfg = config()
    devices = export(cfg, volumes(["gpu-1"], 1, size=None))
    (ns,) = devices.subsystems[0].namespaces.values()
    assert ns.buffered_io is None and "buffered_io" not in ns.files()
    files = export(cfg, volumes(["gpu-1"], 1, buffered=True))
    assert files.subsystems[0].namespaces[1].buffered_io is True


def test_kept_namespaces_replace_their_volumes_exactly() -> None:
    """A refused change keeps the live namespace as it is, whatever the volume says."""
    cfg = config()
    live = Namespace(2, device_path="/old/place", device_uuid=ids("gpu-1", 9)[0],
                     enable=True)
    out = export(cfg, volumes(["gpu-1"]), kept={("gpu-1", 2): live})
    sub = next(s for s in out.subsystems if s.nqn.endswith(":gpu-1"))
    assert sub.namespaces[2] is live
    assert sub.namespaces[1].device_path == "/srv/kv/kv/gpu-1/ns1.img"


def test_ports_carry_family_service_and_params() -> None:
    cfg = config()
    tcp, rdma, _ = cfg.target.ports
    port = desired_port(rdma, ["nqn.a", "nqn.b"])
    assert port.id == 2 and port.subsystems == {"nqn.a", "nqn.b"}
    assert dict(port.addr) == {"trtype": "rdma", "adrfam": "ipv6", "traddr": "fd00::1",
                               "trsvcid": "4421"}
    assert dict(port.params) == {"inline_data_size": "16384"}
    plain = desired_port(tcp, [])
    assert dict(plain.addr)["adrfam"] == "ipv4" and dict(plain.params) == {}
    assert [h.nqn for h in desired_hosts([H2, H1, H2])] == sorted([H1, H2])


def test_device_pool_hosts_without_a_device_get_no_subsystem() -> None:
    cfg = config(backing={"kind": "device", "devices": [
        {"path": "/dev/disk/by-id/nvme-eui.01", "host": "gpu-2"}]}, namespaces=None)
    pool = cfg.target.pools[0]
    layout = pool_layout(cfg, pool, TargetRecords())
    assert layout == {f"{PREFIX}:kv:gpu-2": (1,)}
    path = "/dev/disk/by-id/nvme-eui.01"
    vols = [Volume("kv", "gpu-2", 1, path, None, *ids("gpu-2", 1), Storage("device", path))]
    (sub,) = export_pool(cfg, pool, ["gpu-2"], vols, frozenset()).subsystems
    assert sub.nqn == f"{PREFIX}:kv:gpu-2" and sub.allowed_hosts == {H2}
    shared = config(shared=True, namespaces=None, backing={"kind": "device", "devices": [
        {"path": path}]})
    assert pool_layout(shared, shared.target.pools[0], TargetRecords()) == {f"{PREFIX}:kv": (1,)}

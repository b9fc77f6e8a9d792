"""NVMe/TCP TLS on the storage host (fake configfs with the real kernels' profiles): the
port's addr_tsas/addr_treq, the PSKs in the .nvme keyring (nvme-cli, faked), refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.config import parse_config
from agent.config.model import Config
from agent.dhchap import write_secret
from agent.system import keyring
from agent.tlspsk import generate_psk, identity, read_psk
from nvmet.fake import KERNEL_6_1, KERNEL_6_12, FakeConfigFS

from .helpers import H1, H2, Target, file_pool

DISCOVERY = "nqn.2014-08.org.nvmexpress.discovery"


@pytest.fixture
def kernel_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake /proc/keys and a /proc with a tlshd process."""
    keys = tmp_path / "proc-keys"
    keys.write_text("")
    proc = tmp_path / "proc"
    (proc / "412").mkdir(parents=True)
    (proc / "412" / "comm").write_text("tlshd\n")
    (proc / "412" / "cmdline").write_bytes(b"/usr/sbin/tlshd\0")
    monkeypatch.setattr(keyring, "PROC_KEYS", str(keys))
    monkeypatch.setattr(keyring, "PROC", str(proc))
    return keys


def tls_config(root: Path, tls: str = "required", *, hosts_tls: bool = True,
               plain_pool: bool = False) -> Config:
    keys = root / "keys"
    keys.mkdir(exist_ok=True)
    pool: dict[str, Any] = file_pool(root, count=1, ports=("s",))
    for h in pool["hosts"]:
        path = keys / f"{h['name']}.psk"
        if not path.exists():
            write_secret(str(path), generate_psk())
        if hosts_tls:
            h["tls"] = {"key_file": str(path)}
    pools = [pool]
    if plain_pool:
        pools.append(file_pool(root, name="plain", count=1, ports=("lo",)))
    data = {"version": 1, "node": {"name": "stor", "state_dir": str(root / "state"),
                                   "run_dir": str(root / "run")},
            "target": {"address_wait": "0s", "pools": pools, "ports": [
                {"name": "lo", "id": 1, "transport": "tcp", "address": "127.0.0.1"},
                {"name": "s", "id": 2, "transport": "tcp", "address": "127.0.0.1",
                 "service": 4430, "tls": tls}]}}
    return parse_config(yaml.safe_dump(data))


def tls_target(root: Path, kernel_keys: Path, profile: Any = KERNEL_6_12) -> Target:
    target = Target(root)
    target.fs = FakeConfigFS(check_order=True, profile=profile)

    def insert(argv: tuple[str, ...], _input: str | None) -> Any:
        opt = {argv[i]: argv[i + 1] for i in range(2, len(argv) - 1) if argv[i].startswith("--")}
        psk = read_psk_text(opt["--keydata"])
        with open(kernel_keys, "a") as f:
            f.write(f"1a2b3c4d I--Q---     1 perm 3b010000     0     0 psk       "
                    f"{identity(psk, opt['--hostnqn'], opt['--subsysnqn'])}: 32\n")
        from agent.system.run import CommandResult
        return CommandResult(argv, 0, "Inserted TLS key 1a2b3c4d\n", "")
    target.runner.on_call(["nvme", "check-tls-key"], insert)
    return target


def read_psk_text(text: str) -> Any:
    from agent.dhchap import Secret
    return Secret(text)


def test_a_tls_port_is_written_with_tls_and_its_hosts_psks_are_inserted_once(
        tmp_path: Path, kernel_keys: Path) -> None:
    target = tls_target(tmp_path, kernel_keys)
    cfg = tls_config(tmp_path, plain_pool=True)
    first = target.run(cfg)
    assert first.ok, first.errors
    assert target.fs.read("ports/2/addr_tsas") == "tls1.3"
    assert target.fs.read("ports/2/addr_treq") == "required"
    assert target.fs.read("ports/1/addr_tsas") == "none"  # the plain port says so
    assert target.fs.read("ports/1/addr_treq") == "not specified"
    inserted = target.runner.ran("nvme", "check-tls-key")
    pairs = {(a[a.index("--hostnqn") + 1], a[a.index("--subsysnqn") + 1]) for a in inserted}
    subs = {s for _, s in pairs} - {DISCOVERY}
    assert {h for h, _ in pairs} == {H1, H2} and len(subs) == 2
    assert {(h, DISCOVERY) for h in (H1, H2)} <= pairs and len(inserted) == 4
    psk = read_psk(str(tmp_path / "keys/gpu-1.psk"))
    assert not any(psk.text in repr(a) for a in first.to_json()["actions"])
    again = target.run(cfg)
    assert again.ok and again.configfs_writes == 0
    assert len(target.runner.ran("nvme", "check-tls-key")) == 4  # converged: nothing run


def test_a_rotated_or_vanished_psk_is_inserted_again(tmp_path: Path, kernel_keys: Path) -> None:
    target = tls_target(tmp_path, kernel_keys)
    cfg = tls_config(tmp_path)
    assert target.run(cfg).ok
    write_secret(str(tmp_path / "keys/gpu-1.psk"), generate_psk(2), replace=True)
    rotated = target.run(tls_config(tmp_path))
    assert rotated.ok and len(target.runner.ran("nvme", "check-tls-key")) == 6
    kernel_keys.write_text("")  # a reboot: the keyring is empty again
    assert target.run(cfg).ok and len(target.runner.ran("nvme", "check-tls-key")) == 10


def test_turning_tls_off_rewrites_the_port(tmp_path: Path, kernel_keys: Path) -> None:
    target = tls_target(tmp_path, kernel_keys)
    assert target.run(tls_config(tmp_path)).ok
    off = target.run(tls_config(tmp_path, tls="none", hosts_tls=False))
    assert off.ok, off.errors
    assert target.fs.read("ports/2/addr_tsas") == "none"
    assert target.fs.read("ports/2/addr_treq") == "not specified"


def test_tls_on_a_kernel_without_it_fails_those_pools_and_names_the_option(
        tmp_path: Path, kernel_keys: Path) -> None:
    target = tls_target(tmp_path, kernel_keys, KERNEL_6_1)
    result = target.run(tls_config(tmp_path, plain_pool=True))
    [err] = result.errors
    assert err.pool == "kv" and "no NVMe/TCP TLS" in err.message
    assert "CONFIG_NVME_TARGET_TCP_TLS" in (err.hint or "")
    assert not target.fs.exists("ports/2")  # never a port without the TLS it asks for
    assert target.fs.exists("ports/1") and target.runner.ran("nvme", "check-tls-key") == []


def test_tls_without_tlshd_fails_those_pools(tmp_path: Path, kernel_keys: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "proc/412/comm").write_text("bash\n")
    (tmp_path / "proc/412/cmdline").write_bytes(b"bash\0")
    target = tls_target(tmp_path, kernel_keys)
    result = target.run(tls_config(tmp_path, plain_pool=True))
    assert [e.pool for e in result.errors] == ["kv"]
    assert "tlshd" in result.errors[0].message and "tlshd.conf" in (result.errors[0].hint or "")


def test_old_nvme_cli_is_a_clear_error(tmp_path: Path, kernel_keys: Path) -> None:
    target = Target(tmp_path)
    target.fs = FakeConfigFS(check_order=True, profile=KERNEL_6_12)
    target.runner.on(["nvme", "check-tls-key"], returncode=1,
                     stderr="check-tls-key: unrecognized option '--hostnqn'\n")
    result = target.run(tls_config(tmp_path))
    assert result.errors and all("check-tls-key --insert" in e.message for e in result.errors)
    assert "nvme-cli 2.4" in (result.errors[0].hint or "")


def test_config_refuses_tls_on_rdma_and_tls_pools_without_host_keys(tmp_path: Path) -> None:
    from agent.config import ConfigError
    with pytest.raises(ConfigError) as no_key:
        tls_config(tmp_path, hosts_tls=False)
    assert "hosts[0].tls" in str(no_key.value) and "needs tls.key_file" in str(no_key.value)
    data = {"version": 1, "target": {"ports": [
        {"name": "r", "id": 1, "transport": "rdma", "address": "10.0.0.1", "tls": "required"}]}}
    with pytest.raises(ConfigError) as rdma:
        parse_config(yaml.safe_dump(data))
    assert "ports[0].tls" in str(rdma.value) and "NVMe/TCP" in str(rdma.value)


@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(min_size=32, max_size=32))
def test_random_psks_never_appear_in_plan_apply_log_status_or_metrics(
        tmp_path_factory, monkeypatch, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    import base64
    import io
    import zlib

    from agent.cli.apply_cmd import _text
    from agent.dhchap import Secret
    from agent.health.collect import collect
    from agent.health.metrics import render_metrics
    from agent.health.status import render_status_text, to_status_json
    from agent.log import configure_logging
    from tests.unit.fakerunner import FakeRunner

    root = tmp_path_factory.mktemp("tls")
    keys = root / "proc-keys"
    keys.write_text("")
    (root / "proc/412").mkdir(parents=True)
    (root / "proc/412/comm").write_text("tlshd\n")
    monkeypatch.setattr(keyring, "PROC_KEYS", str(keys))
    monkeypatch.setattr(keyring, "PROC", str(root / "proc"))
    blob = raw + zlib.crc32(raw).to_bytes(4, "little")
    psk = Secret(f"NVMeTLSkey-1:01:{base64.b64encode(blob).decode()}:")
    (root / "keys").mkdir()
    for name in ("gpu-1", "gpu-2"):
        write_secret(str(root / f"keys/{name}.psk"), psk)
    cfg = tls_config(root)
    target = tls_target(root, keys)
    agent_log = io.StringIO()
    configure_logging(1, stream=agent_log)
    outputs = []
    try:
        for dry_run in (True, False):
            result = target.run(cfg, dry_run=dry_run)
            assert result.ok, result.errors
            outputs += [repr(result.to_json()), _text(result)]
    finally:
        configure_logging()
    assert target.runner.ran("nvme", "check-tls-key")  # the keys were given to nvme-cli
    snap = collect(cfg, FakeRunner(), fs=target.fs, drives=False)
    outputs += [repr(to_status_json(snap)), render_status_text(snap),
                render_metrics(snap).decode(), agent_log.getvalue()]
    for text in outputs:
        assert psk.text not in text and base64.b64encode(raw).decode()[:16] not in text

"""DH-HMAC-CHAP on the storage host (fake configfs with Debian 13's 6.12 profile)."""

from __future__ import annotations

import io
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.dhchap import generate, read_secret, write_secret
from agent.log import configure_logging
from nvmet.fake import KERNEL_6_1, KERNEL_6_12, FakeConfigFS

from .helpers import H1, H2, Target, config, file_pool


def keyed(tmp_path: Path, name: str) -> str:
    path = tmp_path / "keys" / name
    path.parent.mkdir(exist_ok=True)
    write_secret(str(path), generate())
    return str(path)


def auth_pool(tmp_path: Path, name: str = "kv", ctrl: bool = False, **auth: str) -> dict:
    pool = file_pool(tmp_path, name=name, count=1)
    pool["hosts"][0]["auth"] = {"key_file": str(tmp_path / "keys/h1.key"), **auth}
    if ctrl:
        pool["hosts"][0]["auth"]["ctrl_key_file"] = str(tmp_path / "keys/c1.key")
    return pool


def on_612(tmp_path: Path) -> Target:
    target = Target(tmp_path)
    target.fs = FakeConfigFS(check_order=True, profile=KERNEL_6_12)
    return target


def test_host_secrets_are_written_converge_and_are_never_shown(tmp_path: Path) -> None:
    key, ctrl = keyed(tmp_path, "h1.key"), keyed(tmp_path, "c1.key")
    target = on_612(tmp_path)
    cfg = config(tmp_path, [auth_pool(tmp_path, ctrl=True, hash="sha512", dhgroup="ffdhe4096")])
    planned = target.run(cfg, dry_run=True)
    secrets = (read_secret(key).text, read_secret(ctrl).text)
    assert planned.ok and not any(s in repr(planned.to_json()) for s in secrets)
    first = target.run(cfg)
    assert first.ok, first.errors
    assert not any(s in repr(first.to_json()) for s in secrets)
    host = f"hosts/{H1}"
    assert target.fs.read(f"{host}/dhchap_key") == secrets[0]
    assert target.fs.read(f"{host}/dhchap_ctrl_key") == secrets[1]
    assert target.fs.read(f"{host}/dhchap_hash") == "hmac(sha512)"
    assert target.fs.read(f"{host}/dhchap_dhgroup") == "ffdhe4096"
    assert target.fs.read(f"hosts/{H2}/dhchap_key") == ""  # the other host has no auth
    again = target.run(cfg)
    assert again.ok and again.configfs_writes == 0


def test_a_rotated_key_file_is_written_alone(tmp_path: Path) -> None:
    key = keyed(tmp_path, "h1.key")
    target = on_612(tmp_path)
    cfg = config(tmp_path, [auth_pool(tmp_path)])
    assert target.run(cfg).ok
    write_secret(key, generate(), replace=True)
    rotated = target.run(cfg)
    assert rotated.ok and rotated.configfs_writes == 1
    assert target.fs.read(f"hosts/{H1}/dhchap_key") == read_secret(key).text
    assert target.ops("write")[-1] == ("write", f"hosts/{H1}/dhchap_key")


def test_rotating_both_secrets_at_once_warns_that_controllers_reconnect(
        tmp_path: Path) -> None:
    key, ctrl = keyed(tmp_path, "h1.key"), keyed(tmp_path, "c1.key")
    target = on_612(tmp_path)
    cfg = config(tmp_path, [auth_pool(tmp_path, ctrl=True)])
    assert target.run(cfg).ok
    out = io.StringIO()
    configure_logging(0, stream=out)
    try:
        write_secret(ctrl, generate(), replace=True)  # one secret: no warning
        assert target.run(cfg).configfs_writes == 1
        assert "at once" not in out.getvalue()
        write_secret(key, generate(), replace=True)
        write_secret(ctrl, generate(), replace=True)
        both = target.run(cfg)
    finally:
        configure_logging()
    assert both.ok and both.configfs_writes == 2
    assert "both DH-HMAC-CHAP secrets of a host change at once" in out.getvalue()
    assert read_secret(key).text not in out.getvalue()


def test_bad_or_missing_secret_fails_that_pool_alone(tmp_path: Path) -> None:
    keyed(tmp_path, "h1.key")
    target = on_612(tmp_path)
    other = file_pool(tmp_path, name="other", count=1, hosts=(("gpu-2", H2),))
    cfg = config(tmp_path, [auth_pool(tmp_path), other])
    assert target.run(cfg).ok
    (tmp_path / "keys/h1.key").chmod(0o644)
    result = target.run(cfg)
    [err] = result.errors
    assert err.pool == "kv" and "mode 0644" in err.message and H1 in err.message
    assert result.configfs_writes == 0  # kv kept as it is, other converged


def test_turning_auth_off_is_refused_with_the_way_to_do_it(tmp_path: Path) -> None:
    keyed(tmp_path, "h1.key")
    target = on_612(tmp_path)
    assert target.run(config(tmp_path, [auth_pool(tmp_path)])).ok
    result = target.run(config(tmp_path, [file_pool(tmp_path, count=1)]))
    [err] = result.errors
    assert "cannot remove a secret" in err.message and "remove the host" in (err.hint or "")
    assert result.configfs_writes == 0
    assert target.fs.read(f"hosts/{H1}/dhchap_key").startswith("DHHC-1:")


def test_auth_on_a_kernel_without_target_auth_is_refused_clearly(tmp_path: Path) -> None:
    keyed(tmp_path, "h1.key")
    target = Target(tmp_path)
    target.fs = FakeConfigFS(check_order=True, profile=KERNEL_6_1)
    # First apply: no host exists to show the kernel's host attributes (they are probed).
    result = target.run(config(tmp_path, [auth_pool(tmp_path)]))
    [err] = result.errors
    assert err.pool == "kv" and "no DH-HMAC-CHAP" in err.message
    assert "CONFIG_NVME_TARGET_AUTH" in (err.hint or "")
    assert not target.fs.list("subsystems") or all(
        "kv" not in e.name for e in target.fs.list("subsystems"))
    assert target.fs.list("ports") == [] or target.fs.exists("ports/1")  # probe removed
    plain = target.run(config(tmp_path, [file_pool(tmp_path, count=1)]))
    assert plain.ok  # hosts now exist: known without a probe
    again = target.run(config(tmp_path, [auth_pool(tmp_path)]))
    assert [e.pool for e in again.errors] == ["kv"] and again.configfs_writes == 0


@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.binary(min_size=32, max_size=32), ctrl=st.binary(min_size=32, max_size=32))
def test_random_secrets_never_appear_in_plan_apply_log_status_or_metrics(
        tmp_path_factory, key: bytes, ctrl: bytes, caplog) -> None:  # type: ignore[no-untyped-def]
    import base64
    import io
    import logging
    import zlib

    from agent.cli.apply_cmd import _text
    from agent.dhchap import Secret
    from agent.log import configure_logging

    def secret(raw: bytes) -> Secret:
        blob = raw + zlib.crc32(raw).to_bytes(4, "little")
        return Secret(f"DHHC-1:00:{base64.b64encode(blob).decode()}:")

    tmp_path = tmp_path_factory.mktemp("auth")
    (tmp_path / "keys").mkdir()
    write_secret(str(tmp_path / "keys/h1.key"), secret(key))
    write_secret(str(tmp_path / "keys/c1.key"), secret(ctrl))
    texts = (secret(key).text, secret(ctrl).text)
    target = on_612(tmp_path)
    cfg = config(tmp_path, [auth_pool(tmp_path, ctrl=True)])
    caplog.set_level(logging.DEBUG)  # the nvmet library logs with logging
    agent_log = io.StringIO()  # kvagent's own log (structlog), at debug
    configure_logging(1, stream=agent_log)
    outputs = []
    try:
        for dry_run in (True, False):
            result = target.run(cfg, dry_run=dry_run)
            assert result.ok, result.errors
            outputs += [repr(result.to_json()), _text(result)]
    finally:
        configure_logging()
    from agent.health.collect import collect
    from agent.health.metrics import render_metrics
    from agent.health.status import render_status_text, to_status_json
    from tests.unit.fakerunner import FakeRunner
    snap = collect(cfg, FakeRunner(), fs=target.fs, drives=False)
    outputs += [repr(to_status_json(snap)), render_status_text(snap),
                render_metrics(snap).decode()]
    outputs += [caplog.text, agent_log.getvalue()]
    assert "dhchap_key = <secret>" in caplog.text  # the log did see the secret writes
    assert target.fs.read(f"hosts/{H1}/dhchap_key") == texts[0]
    for text in outputs:
        assert not any(s in text for s in texts)
        assert not any(base64.b64encode(raw).decode()[:16] in text for raw in (key, ctrl))


def test_a_hand_made_host_entry_of_someone_elses_subsystem_keeps_its_secret(
        tmp_path: Path) -> None:
    """Issue 24, item 5: an admin's host entry (their secret, allowed by their subsystem)
    got kvagent's secret written over it. Now that pool fails, their entry is untouched;
    the pool's other hosts and other pools go on."""
    keyed(tmp_path, "h1.key")
    target = on_612(tmp_path)
    theirs = "nqn.2020-01.org.example:their-subsystem"
    secret = "DHHC-1:00:dGhlaXItb3duLXNlY3JldC10aGVpci1vd24tc2VjcmV0LXRoZWlycw==:"
    target.fs.mkdir(f"hosts/{H1}")
    target.fs.write(f"hosts/{H1}/dhchap_key", secret)
    target.fs.mkdir(f"subsystems/{theirs}")
    target.fs.symlink(f"hosts/{H1}", f"subsystems/{theirs}/allowed_hosts/{H1}")
    other = file_pool(tmp_path, name="other", count=1, hosts=(("gpu-2", H2),))
    result = target.run(config(tmp_path, [auth_pool(tmp_path), other]))
    [err] = result.errors
    assert err.pool == "kv" and "not made by kvagent" in err.message and theirs in err.message
    assert target.fs.read(f"hosts/{H1}/dhchap_key") == secret
    assert target.fs.exists(f"subsystems/{theirs}/allowed_hosts/{H1}")


def test_a_hand_made_host_entry_no_subsystem_allows_keeps_its_secret(tmp_path: Path) -> None:
    """An admin's host entry with its own secret, allowed by no subsystem yet: not
    kvagent's to overwrite either. With the same secret in the pool's key file it is taken
    over as it is."""
    key_file = keyed(tmp_path, "h1.key")
    target = on_612(tmp_path)
    theirs = generate()
    target.fs.mkdir(f"hosts/{H1}")
    target.fs.write(f"hosts/{H1}/dhchap_key", theirs.text)
    result = target.run(config(tmp_path, [auth_pool(tmp_path)]))
    [err] = result.errors
    assert "not made by kvagent" in err.message and "secrets of its own" in err.message
    assert target.fs.read(f"hosts/{H1}/dhchap_key") == theirs.text
    Path(key_file).unlink()
    write_secret(key_file, theirs)
    result = target.run(config(tmp_path, [auth_pool(tmp_path)]))
    assert result.ok, result.errors
    assert target.fs.read(f"hosts/{H1}/dhchap_key") == theirs.text

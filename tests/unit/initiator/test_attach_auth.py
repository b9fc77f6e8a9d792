"""DH-HMAC-CHAP secrets in the GPU host's pass (fake host: attach_fakes.py): a plan shows
a rotation and writes nothing; the pass then gives the live controller the new secret.
The kernel's side: tests/kernel/test_auth.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.dhchap import generate, read_secret, write_secret

from .attach_fakes import PREFIX, Export, FakeHost, fabrics_host
from .test_attach_reconcile import pool_yaml, run

NQN = f"{PREFIX}:store1:kv:gpu0"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    return fabrics_host(tmp_path, monkeypatch, [Export(NQN, [1])])


def test_a_plan_shows_a_new_secret_and_writes_none(host: FakeHost, tmp_path: Path) -> None:
    key = str(tmp_path / "host.key")
    write_secret(key, generate())
    pools = pool_yaml(host, subsystem=NQN).replace(
        "      engines:", f"      auth: {{key_file: {key}}}\n      engines:")
    assert run(host, pools).ok
    [opts] = host.fabrics_writes
    assert opts["dhchap_secret"] == read_secret(key).text
    secret = host.root / "sys/class/nvme/nvme2/dhchap_secret"
    old = secret.read_text().strip()

    write_secret(key, generate(), replace=True)
    plan = run(host, pools, dry_run=True)
    assert [(a.kind, a.subject, a.detail) for a in plan.actions if a.status == "planned"] == [
        ("nvme.auth", "nvme2", "new DH-HMAC-CHAP secret: re-authenticate")]
    assert secret.read_text().strip() == old

    done = run(host, pools)
    assert done.ok, done.errors
    assert secret.read_text().strip() == read_secret(key).text
    assert len(host.fabrics_writes) == 1  # the same controller

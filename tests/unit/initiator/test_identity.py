"""Host identity: read, create when missing (never overwrite), warn about shared identities."""

from __future__ import annotations

import json
import stat
import uuid
from pathlib import Path

import pytest
import structlog

from agent.initiator.identity import (
    UUID_NQN_PREFIX,
    IdentityError,
    ensure_host_identity,
    identity_warnings,
)
from agent.log import configure_logging

FIXED = uuid.UUID("5b1f0e3c-8a54-4d1e-9d0b-3c2f1a7e6b44")


def fixed() -> uuid.UUID:
    return FIXED


def write(d: Path, name: str, text: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(text)


def test_both_missing_are_created_with_one_uuid(tmp_path: Path) -> None:
    d = tmp_path / "etc/nvme"  # the directory itself does not exist yet
    ident = ensure_host_identity(d, new_uuid=fixed)
    assert ident.hostnqn == UUID_NQN_PREFIX + str(FIXED)
    assert ident.hostid == str(FIXED)
    assert (d / "hostnqn").read_text() == ident.hostnqn + "\n"
    assert (d / "hostid").read_text() == ident.hostid + "\n"
    for name in ("hostnqn", "hostid"):
        assert stat.S_IMODE((d / name).stat().st_mode) == 0o644
    assert sorted(ident.created) == sorted([str(d / "hostnqn"), str(d / "hostid")])
    assert not ident.suspect
    assert sorted(p.name for p in d.iterdir()) == ["hostid", "hostnqn"]  # no temp files left


def test_second_run_reads_and_changes_nothing(tmp_path: Path) -> None:
    first = ensure_host_identity(tmp_path, new_uuid=fixed)
    before = {p.name: (p.read_text(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    second = ensure_host_identity(tmp_path, new_uuid=uuid.uuid4)
    after = {p.name: (p.read_text(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    assert (second.hostnqn, second.hostid) == (first.hostnqn, first.hostid)
    assert second.created == () and before == after


def test_missing_hostid_takes_the_nqns_uuid(tmp_path: Path) -> None:
    u = "7655a38e-e173-4d42-875a-c7e065e83747"
    write(tmp_path, "hostnqn", UUID_NQN_PREFIX + u + "\n")
    ident = ensure_host_identity(tmp_path, new_uuid=fixed)
    assert ident.hostid == u and ident.created == (str(tmp_path / "hostid"),)
    assert (tmp_path / "hostnqn").read_text() == UUID_NQN_PREFIX + u + "\n"


def test_missing_hostid_with_a_named_nqn_gets_a_new_uuid(tmp_path: Path) -> None:
    write(tmp_path, "hostnqn", "nqn.2026-11.io.example:gpu7")
    ident = ensure_host_identity(tmp_path, new_uuid=fixed)
    assert (ident.hostnqn, ident.hostid) == ("nqn.2026-11.io.example:gpu7", str(FIXED))
    assert not ident.suspect


def test_missing_hostnqn_is_made_from_the_hostid(tmp_path: Path) -> None:
    u = "318f24f5-4255-45ad-893e-adea9577c6ef"
    write(tmp_path, "hostid", u)
    ident = ensure_host_identity(tmp_path, new_uuid=fixed)
    assert ident.hostnqn == UUID_NQN_PREFIX + u
    assert ident.created == (str(tmp_path / "hostnqn"),)


def test_disagreeing_uuid_and_hostid_warn_loudly(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # The reference capture's VM had exactly this pair (nvme-list-subsys.json).
    write(tmp_path, "hostnqn",
          "nqn.2014-08.org.nvmexpress:uuid:7655a38e-e173-4d42-875a-c7e065e83747\n")
    write(tmp_path, "hostid", "318f24f5-4255-45ad-893e-adea9577c6ef\n")
    configure_logging(json_lines=True)
    try:
        ident = ensure_host_identity(tmp_path)
    finally:
        structlog.reset_defaults()
    assert ident.suspect
    [warning] = ident.warnings
    assert "disagree" in warning
    records = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]
    assert any(r["level"] == "warning" and "HOST IDENTITY" in r["event"] for r in records)
    assert ident.created == ()  # nothing rewritten


def test_well_known_default_nqn_is_flagged(tmp_path: Path) -> None:
    zero = "00000000-0000-0000-0000-000000000000"
    write(tmp_path, "hostnqn", UUID_NQN_PREFIX + zero)
    write(tmp_path, "hostid", zero)
    ident = ensure_host_identity(tmp_path)
    assert ident.suspect
    assert any("well-known default" in w for w in ident.warnings)
    assert any("all-zero" in w for w in ident.warnings)


def test_uppercase_hostid_matching_the_nqn_is_fine() -> None:
    u = "318f24f5-4255-45ad-893e-adea9577c6ef"
    assert identity_warnings(UUID_NQN_PREFIX + u, u.upper()) == ()


@pytest.mark.parametrize(("name", "text", "expect"), [
    ("hostnqn", "", "empty"),
    ("hostnqn", "not an nqn", "whitespace"),
    ("hostid", "definitely-not-a-uuid", "not a uuid"),
])
def test_unusable_files_are_an_error_and_left_alone(tmp_path: Path, name: str, text: str,
                                                    expect: str) -> None:
    write(tmp_path, name, text)
    with pytest.raises(IdentityError, match=expect) as info:
        ensure_host_identity(tmp_path, new_uuid=fixed)
    assert str(tmp_path / name) in info.value.message
    assert (tmp_path / name).read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # nothing else created


def test_a_file_created_concurrently_is_not_overwritten(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    real_link = os.link
    theirs = UUID_NQN_PREFIX + "0c0ffee0-0000-4000-8000-000000000001"

    def racing_link(src, dst, *a, **k):
        if str(dst).endswith("hostnqn") and not os.path.exists(dst):
            Path(dst).write_text(theirs + "\n")  # someone else won the race
        return real_link(src, dst, *a, **k)

    monkeypatch.setattr(os, "link", racing_link)
    ident = ensure_host_identity(tmp_path, new_uuid=fixed)
    assert ident.hostnqn == theirs
    assert (tmp_path / "hostnqn").read_text() == theirs + "\n"
    assert str(tmp_path / "hostnqn") not in ident.created
    assert ident.suspect  # their NQN's uuid differs from the hostid we wrote

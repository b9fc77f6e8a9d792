"""TLS pre-shared keys: the NVMe PSK interchange format, files, keys CLI, the keyring
record (converged passes run nothing) and the redaction of --keydata."""

from __future__ import annotations

import base64
import json
import subprocess
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.main import main
from agent.dhchap import Secret, write_secret
from agent.errors import KvagentError
from agent.system import keyring
from agent.system.keyring import PskKeyring, psk_descriptions, tlshd_running
from agent.system.run import CommandResult, shown
from agent.tlspsk import generate_psk, identity, psk_problem, read_psk
from tests.unit.fakerunner import FakeRunner

REPO = Path(__file__).resolve().parents[2]
NVME_213 = REPO / "build/tls/bin/nvme"  # scripts/fetch-tls-tools


def test_format_checks() -> None:
    good = generate_psk().text
    assert psk_problem(good) is None and psk_problem(generate_psk(2).text) is None
    assert "not a TLS PSK" in (psk_problem("DHHC-1:00:AAAA:") or "")
    assert "hash '03'" in (psk_problem(good.replace(":01:", ":03:")) or "")
    assert "needs 48 bytes" in (psk_problem(good.replace(":01:", ":02:")) or "")
    body = good.split(":")[2]
    flipped = body[:5] + ("A" if body[5] != "A" else "B") + body[6:]
    assert "CRC" in (psk_problem(f"NVMeTLSkey-1:01:{flipped}:") or "")


def test_nvme_cli_makes_the_same_interchange_text() -> None:
    """nvme-cli 2.13 (fetched by scripts/setup) turns the same key bytes into the same text."""
    assert NVME_213.exists(), f"{NVME_213} is missing: scripts/setup fetches it " \
        "(scripts/fetch-tls-tools)"
    key = bytes(range(32))
    out = subprocess.run([str(NVME_213), "gen-tls-key", "--secret", key.hex(), "--hmac", "1"],
                         capture_output=True, text=True, timeout=30, check=True)
    blob = key + zlib.crc32(key).to_bytes(4, "little")
    assert out.stdout.strip() == f"NVMeTLSkey-1:01:{base64.b64encode(blob).decode()}:"


def test_keys_cli_makes_and_shows_a_psk_without_printing_it(tmp_path: Path) -> None:
    path = tmp_path / "gpu-1.psk"
    runner = CliRunner()
    made = runner.invoke(main, ["-o", "json", "keys", "generate", "--tls", str(path)])
    assert made.exit_code == 0, made.output
    psk = read_psk(str(path))
    info = json.loads(made.stdout)
    assert info == {**info, "kind": "tls-psk", "hmac": "sha256",
                    "fingerprint": psk.fingerprint}
    assert psk.text not in made.output and (path.stat().st_mode & 0o777) == 0o600
    shown_ = runner.invoke(main, ["keys", "show", str(path)])
    assert shown_.exit_code == 0 and "TLS PSK" in shown_.stdout and psk.text not in shown_.output
    bad = runner.invoke(main, ["keys", "generate", "--tls", "--hmac", "sha512",
                               str(tmp_path / "x")])
    assert bad.exit_code == 2 and "sha256 or sha384" in bad.stderr
    assert not (tmp_path / "x").exists()


def test_keydata_is_redacted() -> None:
    psk = generate_psk().text
    assert shown(["nvme", "check-tls-key", "--keydata", psk]) == [
        "nvme", "check-tls-key", "--keydata", "<secret>"]


def test_the_keyring_record_makes_a_converged_pass_run_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = tmp_path / "keys"
    keys.write_text("0aa0e7a1 I------     1 perm 1f1f0000     0     0 keyring   .nvme: 1\n")
    monkeypatch.setattr(keyring, "PROC_KEYS", str(keys))
    psk = Secret(generate_psk().text)
    ident = identity(psk, "nqn.h", "nqn.s")
    assert ident == "NVMe0R01 nqn.h nqn.s"

    def insert(argv: tuple[str, ...], _input: str | None) -> CommandResult:
        with open(keys, "a") as f:
            f.write(f"1a2b3c4d I--Q---     1 perm 3b010000     0     0 psk       {ident}: 32\n")
        return CommandResult(argv, 0, "Inserted TLS key 1a2b3c4d\n", "")
    runner = FakeRunner().on_call(["nvme", "check-tls-key"], insert)
    ring = PskKeyring(runner, str(tmp_path / "state"))
    assert ring.missing(psk, "nqn.h", "nqn.s")
    ring.insert(psk, "nqn.h", "nqn.s")
    assert psk_descriptions() == {ident}
    assert not ring.missing(psk, "nqn.h", "nqn.s")
    assert psk.text not in (tmp_path / "state/tls-psks.json").read_text()
    assert ring.missing(Secret(generate_psk().text), "nqn.h", "nqn.s")  # rotated
    keys.write_text("")
    assert ring.missing(psk, "nqn.h", "nqn.s")  # vanished (a reboot)


def test_an_nvme_cli_without_insert_is_a_clear_error(tmp_path: Path) -> None:
    runner = FakeRunner().on(["nvme", "check-tls-key"], returncode=1,
                             stderr="check-tls-key: unrecognized option '--hostnqn'\n")
    with pytest.raises(KvagentError) as err:
        PskKeyring(runner, str(tmp_path)).insert(Secret(generate_psk().text), "h", "s")
    assert "check-tls-key --insert" in err.value.message and "2.4" in (err.value.hint or "")


def test_tlshd_is_found_by_its_process_name(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyring, "PROC", str(tmp_path))
    (tmp_path / "self").mkdir()
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "comm").write_text("bash\n")
    (tmp_path / "7" / "cmdline").write_bytes(b"bash\0-c\0tlshd is not me\0")
    assert not tlshd_running()
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "comm").write_text("ld-linux-x86-64\n")
    (tmp_path / "8" / "cmdline").write_bytes(b"/r/ld-linux-x86-64.so.2\0--library-path\0"
                                             b"/r/lib\0/r/usr/sbin/tlshd\0-c\0/etc/t\0")
    assert tlshd_running()
    (tmp_path / "8" / "cmdline").write_bytes(b"")
    (tmp_path / "9").mkdir()
    (tmp_path / "9" / "comm").write_text("tlshd\n")
    assert tlshd_running()


def test_psk_files_follow_the_secret_file_rules(tmp_path: Path) -> None:
    path = tmp_path / "k.psk"
    write_secret(str(path), generate_psk())
    path.chmod(0o644)
    with pytest.raises(KvagentError) as err:
        read_psk(str(path))
    assert "chmod 600" in err.value.message

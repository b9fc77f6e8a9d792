"""DH-HMAC-CHAP secrets: the DHHC-1 format, the file rules, and ``kvagent keys``."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.main import main
from agent.dhchap import generate, read_secret, secret_file_problem, secret_problem, write_secret
from agent.errors import KvagentError

#: What Debian 12's nvme-cli 2.3 printed in the 6.12 VM (nvme gen-dhchap-key -n NQN).
NVME_CLI_KEY = "DHHC-1:00:o71XL3dXa/kKh0AzaxNiDhEfzBRkl6AMyDu8pVg7SgIOxh5C:"


def test_generated_secrets_have_the_format_nvme_cli_and_the_kernel_use() -> None:
    assert secret_problem(NVME_CLI_KEY) is None
    for transform, length in ((0, 32), (0, 48), (0, 64), (1, 32), (2, 48), (3, 64)):
        text = generate(transform, length).text
        assert text.startswith(f"DHHC-1:{transform:02d}:") and text.endswith(":")
        blob = base64.b64decode(text.split(":")[2])
        assert len(blob) == length + 4
        assert zlib.crc32(blob[:-4]).to_bytes(4, "little") == blob[-4:]
        assert secret_problem(text) is None
    with pytest.raises(ValueError):
        generate(3, 32)


@pytest.mark.parametrize(("text", "words"), [
    ("garbage", "not a DH-HMAC-CHAP secret"),
    ("DHHC-1:00:AAAA:", "0-byte key"),  # nvmet itself accepts this one
    ("DHHC-1:07:" + NVME_CLI_KEY.split(":")[2] + ":", "transform '07'"),
    ("DHHC-1:01:" + base64.b64encode(bytes(range(48)) + b"1234").decode() + ":", "needs 32"),
    ("DHHC-1:00:" + base64.b64encode(bytes(range(32)) + b"abcd").decode() + ":", "CRC"),
    ("DHHC-1:00:!!!!:", "base64"),
])
def test_bad_secrets_are_named_without_showing_them(text: str, words: str) -> None:
    problem = secret_problem(text)
    assert problem is not None and words in problem
    key = text.split(":")[2] if text.count(":") == 3 else text
    assert len(key) < 5 or key not in problem


def test_secret_files_are_root_only_regular_files(tmp_path: Path) -> None:
    path = tmp_path / "host.key"
    write_secret(str(path), generate())
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    secret = read_secret(str(path))
    assert secret.text in path.read_text() and secret.text not in repr(secret)
    with pytest.raises(KvagentError, match="never overwrites"):
        write_secret(str(path), generate())
    write_secret(str(path), generate(), replace=True)
    assert read_secret(str(path)).text != secret.text
    path.chmod(0o640)
    assert "mode 0640" in (secret_file_problem(str(path)) or "")
    path.chmod(0o600)
    link = tmp_path / "link.key"
    link.symlink_to(path)
    assert "symlink" in (secret_file_problem(str(link)) or "")
    assert "does not exist" in (secret_file_problem(str(tmp_path / "none")) or "")
    path.write_text("DHHC-1:00:AAAA:\n")
    assert "0-byte key" in (secret_file_problem(str(path)) or "")


def test_keys_cli_generates_shows_and_never_prints_the_secret(tmp_path: Path) -> None:
    path = tmp_path / "gpu-1.key"
    runner = CliRunner()
    made = runner.invoke(main, ["-o", "json", "keys", "generate", "--hmac", "sha512", str(path)])
    assert made.exit_code == 0, made.output
    secret = read_secret(str(path))
    assert secret.text not in made.output
    info = json.loads(made.stdout)
    assert info["hmac"] == "sha512" and info["fingerprint"] == secret.fingerprint
    again = runner.invoke(main, ["keys", "generate", str(path)])
    assert again.exit_code == 2 and "exists" in again.stderr
    assert read_secret(str(path)).text == secret.text  # nothing changed
    bad = runner.invoke(main, ["keys", "generate", "--hmac", "sha384", "--length", "32",
                               str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--length" in bad.stderr and not (tmp_path / "x").exists()
    nowhere = runner.invoke(main, ["keys", "generate", str(tmp_path / "no/such/dir/k")])
    assert nowhere.exit_code == 2 and "does not exist" in nowhere.stderr
    shown = runner.invoke(main, ["keys", "show", str(path)])
    assert shown.exit_code == 0 and secret.fingerprint in shown.stdout
    assert secret.text not in shown.output
    path.chmod(0o644)
    refused = runner.invoke(main, ["keys", "show", str(path)])
    assert refused.exit_code == 2 and "chmod 600" in refused.stderr


def test_nvme_cli_accepts_the_generated_format() -> None:
    """nvme-cli's gen-dhchap-key --secret takes our key bytes and makes the same DHHC-1
    text (same base64 and CRC layout). nvme-cli is part of the test setup (scripts/setup):
    missing or failing, it fails this test, never skips it."""
    key = bytes(range(32))
    assert shutil.which("nvme"), "nvme-cli is not installed (scripts/setup installs it)"
    out = subprocess.run(["nvme", "gen-dhchap-key", "--secret", key.hex(), "-n",
                          "nqn.2014-08.org.example:h"], capture_output=True, text=True,
                         timeout=10, check=False)
    assert out.returncode == 0, f"nvme gen-dhchap-key: {out.stderr.strip()}"
    blob = key + zlib.crc32(key).to_bytes(4, "little")
    assert out.stdout.strip() == f"DHHC-1:00:{base64.b64encode(blob).decode()}:"

"""``kvagent target show`` / ``export`` over a configfs-like directory tree."""

from __future__ import annotations

import json
import os
from pathlib import Path

from click.testing import CliRunner

from agent.cli.main import main
from nvmet.configfs import RealConfigFS, join
from nvmet.fake import FakeConfigFS
from nvmet.nvmetcli import dumps
from nvmet.reader import read

from .capture import capture_fake

POOL0 = "nqn.2026-11.io.kvagent:pool0"


def materialize(fake: FakeConfigFS, root: Path) -> Path:
    """Write the fake's tree as plain directories, files (with modes) and symlinks."""
    nvmet = root / "nvmet"

    def walk(path: str) -> None:
        (nvmet / path).mkdir(parents=True, exist_ok=True)
        for e in fake.list(path):
            p = join(path, e.name)
            if e.kind == "dir":
                walk(p)
            elif e.kind == "link":
                os.symlink(nvmet / fake.readlink(p), nvmet / p)
            else:
                (nvmet / p).write_text((fake.read(p) if e.readable else "") + "\n")
                os.chmod(nvmet / p, (0o400 if e.readable else 0) | 0o200)

    walk("")
    return root


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_show_text_and_json(tmp_path) -> None:
    root = materialize(capture_fake(), tmp_path)
    res = run("target", "show", "--configfs", str(root))
    assert res.exit_code == 0, res.output
    assert POOL0 in res.output and "ns 1    enabled  /dev/nullb0" in res.output
    assert "1     tcp ipv4 127.0.0.1:4420" in res.output
    res = run("-o", "json", "target", "show", "--configfs", str(root))
    data = json.loads(res.output)
    assert data["changed"] is False
    sub = next(s for s in data["subsystems"] if s["nqn"] == POOL0)
    assert [n["nsid"] for n in sub["namespaces"]] == [1, 2]
    assert sub["namespaces"][0]["device_uuid"] == "777c9365-0b21-4484-b476-bfe48dabf593"


def test_real_configfs_reads_the_same_tree_as_the_fake(tmp_path) -> None:
    fake = capture_fake()
    root = materialize(fake, tmp_path)
    assert read(RealConfigFS(root / "nvmet")) == read(fake)


def test_export_nvmetcli_to_stdout_and_file(tmp_path) -> None:
    fake = capture_fake()
    root = materialize(fake, tmp_path)
    res = run("target", "export", "--format", "nvmetcli", "--configfs", str(root))
    assert res.exit_code == 0
    assert res.output == dumps(read(fake))
    out = tmp_path / "config.json"
    res = run("-o", "json", "target", "export", "-f", str(out), "--configfs", str(root))
    assert json.loads(res.output)["file"] == str(out)
    assert out.read_text() == dumps(read(fake))


def test_missing_nvmet_is_exit_1_with_how_to_fix(tmp_path) -> None:
    res = CliRunner().invoke(main, ["target", "show", "--configfs", str(tmp_path)])
    assert res.exit_code == 1
    assert "not available" in res.output and "modprobe nvmet" in res.output
    assert "Traceback" not in res.output


def test_configfs_comes_from_the_config_file(tmp_path) -> None:
    root = materialize(capture_fake(), tmp_path / "cfs")
    cfg = tmp_path / "kvagent.yaml"
    cfg.write_text(f"version: 1\nnode: {{name: stor-01, configfs: {root}}}\n")
    res = run("-c", str(cfg), "-o", "json", "target", "show")
    assert res.exit_code == 0, res.output
    assert POOL0 in {s["nqn"] for s in json.loads(res.output)["subsystems"]}
    # --configfs overrides the config file
    res = CliRunner().invoke(main, ["-c", str(cfg), "target", "show", "--configfs",
                                    str(tmp_path / "nowhere")])
    assert res.exit_code == 1 and "nowhere" in res.output


SECRET = "DHHC-1:00:ZmFrZS1zZWNyZXQtZm9yLXRoZS10ZXN0LW9ubHktMTIzNDU2Nzg5MDEyMzQ1:"
CTRL_SECRET = "DHHC-1:00:Y3RybC1zZWNyZXQtZm9yLXRoZS10ZXN0LW9ubHktMTIzNDU2Nzg5MDEyMzQ1:"
HOST = "nqn.2014-08.org.nvmexpress:uuid:11e85052-8716-44d9-b10e-1c51bae17688"


def with_secret_host(tmp_path: Path) -> Path:
    """The captured tree plus a host with DH-HMAC-CHAP secrets in its attributes."""
    root = materialize(capture_fake(), tmp_path)
    host = root / "nvmet/hosts" / HOST
    host.mkdir(parents=True, exist_ok=True)
    for name, value in (("dhchap_key", SECRET), ("dhchap_ctrl_key", CTRL_SECRET),
                        ("dhchap_hash", "hmac(sha256)")):
        (host / name).write_text(value + "\n")
    return root


def test_show_never_prints_a_secret(tmp_path) -> None:
    root = with_secret_host(tmp_path)
    for fmt in ("text", "json"):
        res = run("-o", fmt, "target", "show", "--configfs", str(root))
        assert res.exit_code == 0, res.output
        assert SECRET not in res.output and CTRL_SECRET not in res.output
        assert "dhchap_key" in res.output and "<set>" in res.output
    host = next(h for h in json.loads(res.output)["hosts"] if h["nqn"] == HOST)
    assert host["attrs"] == {"dhchap_key": "<set>", "dhchap_ctrl_key": "<set>",
                             "dhchap_hash": "hmac(sha256)"}


def test_export_file_is_private_and_never_written_through_a_link(tmp_path) -> None:
    root = with_secret_host(tmp_path)
    out = tmp_path / "config.json"
    out.write_text("old")
    os.chmod(out, 0o644)
    old_umask = os.umask(0o022)
    try:
        res = run("target", "export", "-f", str(out), "--configfs", str(root))
    finally:
        os.umask(old_umask)
    assert res.exit_code == 0, res.output
    assert SECRET in out.read_text()  # a restore needs it
    assert out.stat().st_mode & 0o777 == 0o600
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "link.json"
    link.symlink_to(victim)
    res = CliRunner().invoke(main, ["target", "export", "-f", str(link), "--configfs",
                                    str(root)])
    assert res.exit_code == 1 and "cannot write" in res.output
    assert victim.read_text() == "keep"

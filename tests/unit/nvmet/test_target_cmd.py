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

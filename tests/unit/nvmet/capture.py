"""Rebuild the reference 6.1 capture (fixtures/kernel-6.1) as a FakeConfigFS."""

from __future__ import annotations

from pathlib import Path

from nvmet.fake import FakeConfigFS

FIXTURES = Path(__file__).parent / "fixtures" / "kernel-6.1"
ROOT = "/sys/kernel/config/nvmet/"


def _is_link_location(path: str) -> bool:
    parts = path.split("/")
    return (len(parts) == 4 and parts[0] == "subsystems" and parts[2] == "allowed_hosts") or (
        len(parts) == 4 and parts[0] == "ports" and parts[2] == "subsystems")


def captured_values() -> dict[str, str]:
    """path (relative to the nvmet root) -> value, for every value the capture could read."""
    out = {}
    for line in (FIXTURES / "configfs-values.txt").read_text().splitlines():
        path, _, value = line.partition("\t")
        if path.startswith(ROOT) and not value.startswith("cat:"):
            out[path[len(ROOT):]] = value
    return out


def capture_fake() -> FakeConfigFS:
    """The captured tree: mkdir what the listing shows, set the captured values, link."""
    fs = FakeConfigFS(devices={"/dev/nullb0": "block"})
    paths = [line[len(ROOT):] for line in (FIXTURES / "configfs-populated.txt").read_text()
             .splitlines() if line.startswith(ROOT)]
    links = []
    for path in paths:
        if fs.exists(path):
            continue
        if _is_link_location(path):
            links.append(path)
        else:
            fs.mkdir(path)
    for path, value in captured_values().items():
        fs.poke(path, value)
    for path in links:
        parts = path.split("/")
        kind = "hosts" if parts[2] == "allowed_hosts" else "subsystems"
        fs.symlink(f"{kind}/{parts[3]}", path)
    fs.ops.clear()
    return fs

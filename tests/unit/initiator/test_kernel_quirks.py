"""The loopback NVMe/TCP + THP 'always' warning."""

from __future__ import annotations

from pathlib import Path

from agent.initiator.kernel_quirks import loopback_tcp_warning, thp_mode


def test_thp_mode_reads_the_selected_mode(tmp_path: Path) -> None:
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert thp_mode(f) == "madvise"
    assert thp_mode(tmp_path / "missing") is None


def test_warns_only_for_loopback_tcp_with_thp_always() -> None:
    assert "madvise" in loopback_tcp_warning("tcp", "127.0.0.1", "always")
    assert loopback_tcp_warning("tcp", "::1", "always")
    assert loopback_tcp_warning("tcp", "127.0.0.1", "madvise") is None
    assert loopback_tcp_warning("rdma", "127.0.0.1", "always") is None
    assert loopback_tcp_warning("tcp", "10.0.0.11", "always") is None

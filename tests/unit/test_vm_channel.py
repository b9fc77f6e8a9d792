"""tests/vmhost/vm_channel.py on the host: its server in a thread, the client against it."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from tests.vmhost import vm_channel
from tests.vmhost.vm_channel import Channel, ChannelError


@pytest.fixture
def chan(tmp_path: Path):
    server = threading.Thread(target=vm_channel.serve, args=(tmp_path,), daemon=True)
    server.start()
    client = Channel(tmp_path)
    client.wait_ready(10)
    yield client
    client.stop()
    server.join(10)
    assert not server.is_alive(), "stop ends the server"


def test_run_returns_status_output_and_takes_stdin(chan: Channel) -> None:
    rc, out, err = chan.run("cat; echo oops >&2; exit 3", stdin=b"\x00bytes\xff")
    assert (rc, out, err) == (3, b"\x00bytes\xff", b"oops\n")
    assert chan.check("pwd", cwd="/") == "/\n"
    with pytest.raises(ChannelError, match="exited 1"):
        chan.check("echo why; false")


def test_a_request_past_its_time_is_answered_124(chan: Channel) -> None:
    rc, _, err = chan.run("sleep 5", timeout=0.3)
    assert rc == 124 and b"timed out" in err
    assert chan.run("echo next")[1] == b"next\n", "the server goes on"


def test_put_and_fetch_copy_files_both_ways(chan: Channel, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(bytes(range(256)) * 10)
    chan.put(str(src), str(tmp_path / "in-guest.bin"))
    chan.fetch(str(tmp_path / "in-guest.bin"), str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
    assert not list((tmp_path / "chan/files").iterdir()), "staged copies are removed"
    with pytest.raises(ChannelError):
        chan.fetch(str(tmp_path / "missing"), str(tmp_path / "x"))


def test_a_dead_vm_fails_the_wait_at_once(tmp_path: Path) -> None:
    vm = subprocess.Popen(["true"])
    vm.wait()
    with pytest.raises(ChannelError, match="exited"):
        Channel(tmp_path, vm).wait_ready(30)
    with pytest.raises(ChannelError, match="exited"):
        Channel(tmp_path, vm).run("true")

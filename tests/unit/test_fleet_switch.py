"""scripts/fleet's private network (its ``_hub`` process): a learning switch whose sends
never wait, so one machine that stops reading (rebooting) cannot stall the others. The
fleet's test saw that stall: during one GPU machine's reboot the other lost its storage
for 35 s (keep-alive timeouts on both ends) while the old hub blocked on a full socket."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

FLEET = Path(__file__).resolve().parents[2] / "scripts/fleet"
MAC = {name: bytes([0x52, 0x54, 0, 0x77, 0, i]) for i, name in enumerate(("a", "b", "c"), 1)}
BROADCAST = b"\xff" * 6


def frame(dst: bytes, src: bytes, payload: bytes) -> bytes:
    return dst + src + b"\x08\x00" + payload


@pytest.fixture
def machines() -> Iterator[dict[str, socket.socket]]:
    """Three machines' ends (what QEMU's dgram netdev binds) and the switch between them,
    in a short directory (a unix socket's path has at most 107 bytes)."""
    tmp_path = Path(tempfile.mkdtemp(prefix="kvsw-"))
    ends = {}
    for name in MAC:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(str(tmp_path / f"{name}.sock"))
        s.settimeout(5)
        ends[name] = s
    switch = subprocess.Popen([sys.executable, str(FLEET), "_hub", str(tmp_path), *MAC])
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"hub-{n}.sock").exists() for n in MAC):
        assert time.monotonic() < deadline and switch.poll() is None, "the switch did not start"
        time.sleep(0.05)
    ends["_dir"] = tmp_path  # type: ignore[assignment]
    yield ends
    switch.terminate()
    switch.wait(timeout=10)
    for s in ends.values():
        if isinstance(s, socket.socket):
            s.close()
    shutil.rmtree(tmp_path, ignore_errors=True)


def send(ends: dict, name: str, data: bytes) -> None:
    ends[name].sendto(data, str(ends["_dir"] / f"hub-{name}.sock"))


def test_unicast_goes_to_the_learned_port_only_and_a_stalled_port_stalls_nothing(
        machines: dict) -> None:
    # a and b announce themselves (broadcast: every other machine gets it)
    send(machines, "a", frame(BROADCAST, MAC["a"], b"hello from a"))
    assert machines["b"].recv(65536).endswith(b"hello from a")
    assert machines["c"].recv(65536).endswith(b"hello from a")
    send(machines, "b", frame(MAC["a"], MAC["b"], b"b to a"))
    assert machines["a"].recv(65536).endswith(b"b to a")
    machines["c"].settimeout(0.5)
    with pytest.raises(TimeoutError):  # learned: c does not get b's frames to a
        machines["c"].recv(65536)

    # c stops reading (a reboot): frames flooded to it fill its queue. a and b keep
    # talking; before, the switch blocked on c's full socket and a never got b's frames.
    for i in range(2000):
        send(machines, "b", frame(BROADCAST, MAC["b"], b"flood %d" % i))
        machines["a"].recv(65536)
    for i in range(50):
        send(machines, "b", frame(MAC["a"], MAC["b"], b"still %d" % i))
        assert machines["a"].recv(65536).endswith(b"still %d" % i)


def fleet_cli(ends: dict, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(FLEET), args[0], str(ends["_dir"]), *args[1:]],
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_partition_drops_frames_between_two_machines_both_ways_until_healed(
        machines: dict) -> None:
    for name, mac in MAC.items():  # each announces itself: the switch learns all three
        send(machines, name, frame(BROADCAST, mac, b"hi"))
    for name in MAC:
        for _ in range(2):
            machines[name].recv(65536)
    assert fleet_cli(machines, "cut", "a", "b").returncode == 0
    machines["a"].settimeout(0.5)
    machines["b"].settimeout(0.5)
    send(machines, "a", frame(MAC["b"], MAC["a"], b"a to b"))
    send(machines, "b", frame(BROADCAST, MAC["b"], b"b to all"))
    with pytest.raises(TimeoutError):
        machines["b"].recv(65536)
    with pytest.raises(TimeoutError):
        machines["a"].recv(65536)
    assert machines["c"].recv(65536).endswith(b"b to all")  # c still hears b
    send(machines, "c", frame(MAC["a"], MAC["c"], b"c to a"))
    assert machines["a"].recv(65536).endswith(b"c to a")

    assert fleet_cli(machines, "heal").returncode == 0
    send(machines, "a", frame(MAC["b"], MAC["a"], b"a to b again"))
    assert machines["b"].recv(65536).endswith(b"a to b again")

    bad = fleet_cli(machines, "cut", "a", "nosuch")
    assert bad.returncode != 0 and "two different machines" in bad.stderr, bad.stderr

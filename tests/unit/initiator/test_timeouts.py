"""Controller timeouts: what differs from a pool's config, in the order it is written."""

from __future__ import annotations

import pytest

from agent.config import parse_config
from agent.fabrics import FabricsAddress
from agent.initiator.nvme.options import FabricsOptions
from agent.initiator.sysfs import Controller
from agent.initiator.timeouts import Drift, Timeouts, drift, fix, unsupported

NQN = "nqn.2026-11.io.kvagent:store1:kv:gpu0"


def ctrl(reconnect_delay: str | None = "2", ctrl_loss_tmo: str | None = "off",
         fast_io_fail_tmo: str | None = "off") -> Controller:
    return Controller("nvme4", FabricsAddress.from_sysfs("tcp", "traddr=10.0.0.1,trsvcid=4420"),
                      "live", NQN, reconnect_delay=reconnect_delay, ctrl_loss_tmo=ctrl_loss_tmo,
                      fast_io_fail_tmo=fast_io_fail_tmo)


def options(connect: str = "") -> FabricsOptions:
    cfg = parse_config(f"""
version: 1
initiator:
  pools:
    - name: kv
      target: {{transport: tcp, address: 10.0.0.1}}
      mount: /srv/kv
      connect: {{{connect}}}
""", "t.yaml")
    assert cfg.initiator is not None
    return FabricsOptions.from_config(cfg.initiator.pools[0].connect)


def test_the_default_is_five_seconds_and_forever() -> None:
    want = Timeouts.from_options(options())
    assert want == Timeouts(reconnect_delay=2, ctrl_loss_tmo=-1, fast_io_fail_tmo=5)
    assert not any("fast_io_fail" in t for t in options().kernel_options())  # sysfs: later


@pytest.mark.parametrize(("connect", "expected"), [
    ("fast_io_fail_tmo: 'off'", -1), ("fast_io_fail_tmo: 0", 0),
    ("fast_io_fail_tmo: 1500ms", 2), ("fast_io_fail_tmo: 1m", 60)])
def test_config_values(connect: str, expected: int) -> None:
    assert options(connect).fast_io_fail_tmo == expected


def test_bad_value_names_the_field() -> None:
    from agent.config import ConfigError

    with pytest.raises(ConfigError) as err:
        options("fast_io_fail_tmo: soon")
    assert "fast_io_fail_tmo" in str(err.value)


def test_a_controller_that_has_them_needs_nothing() -> None:
    assert drift(ctrl(fast_io_fail_tmo="5"), Timeouts(2, -1, 5)) == []


def test_off_is_written_as_minus_one() -> None:
    assert drift(ctrl(fast_io_fail_tmo="5"), Timeouts(None, None, -1)) == [
        Drift("nvme4", "fast_io_fail_tmo", "5", "-1", "off")]


def test_ctrl_loss_tmo_reads_back_in_whole_reconnects() -> None:
    assert drift(ctrl(ctrl_loss_tmo="6"), Timeouts(2, 5, None)) == []
    assert drift(ctrl(ctrl_loss_tmo="600"), Timeouts(2, 5, None)) == [
        Drift("nvme4", "ctrl_loss_tmo", "600", "5", "6")]


def test_reconnect_delay_first_then_ctrl_loss_tmo_again() -> None:
    got = drift(ctrl(reconnect_delay="10", ctrl_loss_tmo="60"), Timeouts(3, 60, None))
    assert [(d.attr, d.value, d.expected) for d in got] == [
        ("reconnect_delay", "3", "3"), ("ctrl_loss_tmo", "60", "60")]
    # forever stays forever whatever the delay: nothing to recompute
    got = drift(ctrl(reconnect_delay="10"), Timeouts(3, -1, None))
    assert [d.attr for d in got] == ["reconnect_delay"]


def test_missing_attributes_are_set_apart() -> None:
    got = drift(ctrl(fast_io_fail_tmo=None), Timeouts(2, -1, 5))
    assert unsupported(got) == got and got[0].attr == "fast_io_fail_tmo"


def test_a_refused_write_is_a_clear_error() -> None:
    from agent.errors import KvagentError

    class Refusing:
        def set_controller_attr(self, name: str, attr: str, value: str) -> None:
            raise OSError(19, "No such device")

    with pytest.raises(KvagentError) as err:
        fix(Refusing(), [Drift("nvme4", "fast_io_fail_tmo", "off", "5", "5")])  # type: ignore[arg-type]
    assert "cannot set fast_io_fail_tmo of controller nvme4 to 5: No such device" in str(
        err.value.message)

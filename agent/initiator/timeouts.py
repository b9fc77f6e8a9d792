"""A pool's controller timeouts, kept in sysfs: reconnect_delay, ctrl_loss_tmo,
fast_io_fail_tmo.

``fast_io_fail_tmo`` is what makes a KV cache fail fast: once a path has been lost
that long, the kernel fails its I/O (EIO) instead of queueing it, while it keeps
reconnecting for ``ctrl_loss_tmo``. With native multipath the namespace's head fails
I/O only when every path's timer has expired (``nvme_available_path``). Debian 12's
nvme-cli 2.3 has no option for it, so kvagent writes the controller's sysfs attribute
after the connect, and puts every attribute back when it drifted (an operator's
write, a controller connected by an older version): read, compare, write only what
differs — a converged pass writes nothing.

What the 6.1 kernel does with a write (tests/kernel/test_cache_failfast.py):

- ``fast_io_fail_tmo`` and ``ctrl_loss_tmo``: -1 turns them off and they read back
  ``off``; the text ``off`` itself is refused (EINVAL).
- ``ctrl_loss_tmo`` is kept as a number of reconnects: it reads back rounded up to a
  multiple of ``reconnect_delay`` (5 with a delay of 2 reads 6), and a new
  ``reconnect_delay`` does not recompute it: ``reconnect_delay`` goes first, and
  ``ctrl_loss_tmo`` is written again after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import KvagentError
from .nvme.options import FabricsOptions
from .sysfs import Controller, Sysfs

#: The attributes kept, in the order they are written.
ATTRIBUTES = ("reconnect_delay", "ctrl_loss_tmo", "fast_io_fail_tmo")


@dataclass(frozen=True)
class Timeouts:
    """What a pool's controllers should have (None: left as the kernel has it)."""

    reconnect_delay: int | None = None
    ctrl_loss_tmo: int | None = None  # -1: forever (reads back "off")
    fast_io_fail_tmo: int | None = None  # -1: off

    @classmethod
    def from_options(cls, options: FabricsOptions) -> Timeouts:
        return cls(options.reconnect_delay, options.ctrl_loss_tmo, options.fast_io_fail_tmo)


@dataclass(frozen=True)
class Drift:
    """One attribute of one controller that differs from what the pool asks for."""

    controller: str
    attr: str
    current: str | None  # as read (None: the kernel has no such attribute)
    value: str  # what is written
    expected: str  # what reads back afterwards

    def describe(self) -> str:
        return f"{self.attr} {self.current} -> {self.expected}"


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _timeout(value: int) -> tuple[str, str]:
    """(written, read back) for a timeout that -1 turns off."""
    return ("-1", "off") if value < 0 else (str(value), str(value))


def drift(ctrl: Controller, want: Timeouts) -> list[Drift]:
    """The writes that bring ``ctrl`` to ``want``, in order; empty when it is there."""
    out: list[Drift] = []
    delay = _int(ctrl.reconnect_delay)
    delay_changed = False
    if want.reconnect_delay is not None and delay != want.reconnect_delay:
        value = str(want.reconnect_delay)
        out.append(Drift(ctrl.name, "reconnect_delay", ctrl.reconnect_delay, value, value))
        delay, delay_changed = want.reconnect_delay, True
    if want.ctrl_loss_tmo is not None:
        value, expected = _timeout(want.ctrl_loss_tmo)
        if want.ctrl_loss_tmo >= 0 and delay:
            expected = str(math.ceil(want.ctrl_loss_tmo / delay) * delay)
        # A new reconnect_delay leaves the kernel's count of reconnects as it was.
        if ctrl.ctrl_loss_tmo != expected or (delay_changed and expected != "off"):
            out.append(Drift(ctrl.name, "ctrl_loss_tmo", ctrl.ctrl_loss_tmo, value, expected))
    if want.fast_io_fail_tmo is not None:
        value, expected = _timeout(want.fast_io_fail_tmo)
        if ctrl.fast_io_fail_tmo != expected:
            out.append(Drift(ctrl.name, "fast_io_fail_tmo", ctrl.fast_io_fail_tmo, value,
                             expected))
    return out


def unsupported(drifts: list[Drift]) -> list[Drift]:
    """The drifts of attributes this kernel does not have (they cannot be written)."""
    return [d for d in drifts if d.current is None]


def fix(sysfs: Sysfs, drifts: list[Drift]) -> None:
    """Write each drifted attribute (the kernel applies it to the live controller)."""
    for d in drifts:
        try:
            sysfs.set_controller_attr(d.controller, d.attr, d.value)
        except OSError as exc:
            raise KvagentError(
                f"cannot set {d.attr} of controller {d.controller} to {d.expected}: "
                f"{exc.strerror or exc}",
                "check dmesg; the controller may be going away (apply again)") from None

"""How kvagent asks for a connection: the options (:class:`FabricsOptions`), as
``/dev/nvme-fabrics`` tokens; this host's side as nvme-cli arguments (``nvme discover``);
the check that no value adds options of its
own (:func:`check_fabrics_values`); and the command that writes a request to
``/dev/nvme-fabrics`` (:func:`fabrics_write_command`, running :mod:`.fabrics_writer`).
"""

from __future__ import annotations

import errno
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from ...system.run import CommandTimeout, Runner
from .failures import PermanentConnectError


@dataclass(frozen=True)
class FabricsOptions:
    """A connect's tuning options; None leaves the kernel's default.

    ``ctrl_loss_tmo`` -1 means reconnect forever (sysfs then shows ``off``).
    ``fast_io_fail_tmo`` (-1: off) is written to the controller's sysfs attribute after
    the connect (:mod:`agent.initiator.timeouts`): nvme-cli 2.3 had no such option, and a
    controller that is already connected gets it the same way.
    """

    ctrl_loss_tmo: int | None = -1
    fast_io_fail_tmo: int | None = None
    reconnect_delay: int | None = None
    keep_alive_tmo: int | None = None
    nr_io_queues: int | None = None
    queue_size: int | None = None
    #: DH-HMAC-CHAP secrets (DHHC-1 text); never shown (repr, logs: agent.system.run.shown).
    dhchap_secret: str | None = field(default=None, repr=False)
    dhchap_ctrl_secret: str | None = field(default=None, repr=False)
    #: NVMe/TCP TLS 1.3 (the PSK is looked up in the .nvme keyring by the kernel).
    tls: bool = False

    @classmethod
    def from_config(cls, cfg: Any) -> FabricsOptions:
        """From a config ``ConnectOptions`` (durations in seconds, ``forever``)."""
        def secs(value: Any) -> int | None:
            if value is None:
                return None
            if value == "forever":
                return -1
            return max(1, round(float(value)))
        fast = getattr(cfg, "fast_io_fail_tmo", None)
        return cls(
            ctrl_loss_tmo=secs(getattr(cfg, "ctrl_loss_tmo", "forever")),
            fast_io_fail_tmo=(None if fast is None else -1 if fast == "off"
                              else round(float(fast))),
            reconnect_delay=secs(getattr(cfg, "reconnect_delay", None)),
            keep_alive_tmo=secs(getattr(cfg, "keep_alive_tmo", None)),
            nr_io_queues=getattr(cfg, "nr_io_queues", None),
            queue_size=getattr(cfg, "queue_size", None),
        )

    def kernel_options(self, host_iface: str | None = None,
                       host_traddr: str | None = None) -> list[str]:
        """The options as ``/dev/nvme-fabrics`` tokens (drivers/nvme/host/fabrics.c), with
        the host side of the address connected to (``host_iface``, ``host_traddr``)."""
        out = [f"{name}={value}" for name, value in (
            ("ctrl_loss_tmo", self.ctrl_loss_tmo), ("reconnect_delay", self.reconnect_delay),
            ("keep_alive_tmo", self.keep_alive_tmo), ("nr_io_queues", self.nr_io_queues),
            ("queue_size", self.queue_size), ("host_iface", host_iface),
            ("host_traddr", host_traddr), ("dhchap_secret", self.dhchap_secret),
            ("dhchap_ctrl_secret", self.dhchap_ctrl_secret)) if value is not None]
        if self.tls:
            out.append("tls")  # the kernel looks the PSK up in the .nvme keyring
        return out


#: What separates and ends the kernel's fabrics options (drivers/nvme/host/fabrics.c
#: splits the request on "," and "\n"); NUL ends it.
FABRICS_SEPARATORS = (",", "\n", "\0")


def check_fabrics_values(**values: object) -> None:
    """Refuse a value that would add options to the kernel's connect request.

    nvme-cli (and kvagent's own ``/dev/nvme-fabrics`` write) joins ``name=value`` options
    with ","; an NQN, address or interface with "," (from a config or a discovery record)
    would smuggle options in, e.g. ``nqn=x,traddr=203.0.113.9``. Secrets are named, never
    shown."""
    for name, value in values.items():
        if value is None:
            continue
        text = str(value)
        secret = "secret" in name  # DHHC-1 secrets are base64: "=" is theirs
        if any(sep in text for sep in FABRICS_SEPARATORS) or ("=" in text and not secret):
            shown = "(a secret)" if secret else repr(text)
            raise PermanentConnectError(
                f"refusing to connect: {name} {shown} contains ',', '=', a newline or NUL, "
                "which would add options to the kernel's connect request",
                "check the config, or the storage host's discovery records, for that value")


def host_args(hostnqn: str | None, hostid: str | None, host_traddr: str | None = None,
              host_iface: str | None = None) -> list[str]:
    """This host's side of a fabrics command as nvme-cli arguments (unset ones left out)."""
    out: list[str] = []
    for flag, value in (("--hostnqn", hostnqn), ("--hostid", hostid),
                        ("--host-traddr", host_traddr), ("--host-iface", host_iface)):
        if value:
            out += [flag, value]
    return out


FABRICS_DEV = "/dev/nvme-fabrics"
#: The program :func:`fabrics_write_command` runs (standard library only).
FABRICS_WRITER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fabrics_writer.py")


def fabrics_write_command(run: Runner, options: str, timeout: float) -> str:
    """Write connect options to ``/dev/nvme-fabrics`` and read its answer
    (``instance=N,cntlid=M``), in a command run by ``run``: the write blocks until the
    kernel has connected or failed, so it gets what every command gets, a time limit and
    SIGTERM (the runner kills it and raises :class:`~agent.progress.Stopping`; a write
    stuck in the kernel is left behind, never waited for). ``TimeoutError`` past
    ``timeout`` seconds, ``OSError`` with the kernel's errno when it refuses."""
    argv = [sys.executable, "-I", "-S", FABRICS_WRITER, FABRICS_DEV]
    try:
        result = run(argv, timeout=timeout, check=False, input=options)
    except CommandTimeout:
        raise TimeoutError(f"{FABRICS_DEV} did not answer within {timeout:g}s") from None
    if result.returncode == 0:
        return result.stdout
    m = re.search(r"errno (\d+)", result.stderr)
    code = int(m.group(1)) if m else errno.EIO
    raise OSError(code, os.strerror(code))

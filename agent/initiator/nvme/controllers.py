"""Controllers made and removed: a controller through ``/dev/nvme-fabrics`` (a first one,
or a further one to a connected subsystem and port), ``nvme disconnect``.

Each refuses values that would add options to the kernel's connect request
(:func:`~.options.check_fabrics_values`) and raises a typed
:class:`~.failures.ConnectError` on failure (:func:`~.failures.classify_connect_failure`).
Whether a controller is needed at all is :mod:`agent.initiator.connect`'s question.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable

from ...log import get_logger
from ...system.run import CommandResult, Runner
from .failures import TransientConnectError, classify_connect_failure, timeout_hint
from .kmsg import KernelLogReader
from .options import FABRICS_DEV, FabricsOptions, check_fabrics_values
from .output import NVME, NvmeCliError

# The log channel of nvme-cli's wrapper (its events are named as before the split).
log = get_logger("initiator.nvmecli")

#: Seconds nvme-cli may take for a connect or discover (the kernel's own connect
#: timeout is ~60 s for an unreachable TCP target; we give up a little earlier
#: and retry, rather than hang an apply pass).
CONNECT_TIMEOUT = 45.0


def parse_disconnect(text: str) -> int | None:
    """How many controllers ``nvme disconnect -n`` says it disconnected."""
    m = re.search(r"disconnected\s+(\d+)\s+controller", text)
    return int(m.group(1)) if m else None


def add_controller(write: Callable[[str, float], str], kernel_log: KernelLogReader,
                   transport: str, traddr: str, trsvcid: str | int, subsysnqn: str, *,
                   hostnqn: str, hostid: str | None = None, host_iface: str | None = None,
                   host_traddr: str | None = None, options: FabricsOptions | None = None,
                   timeout: float | None = None,
                   connect_timeout: float = CONNECT_TIMEOUT, duplicate: bool = True) -> str:
    """A controller made through the kernel's ``/dev/nvme-fabrics``; returns its name.
    ``duplicate``: a further controller to a subsystem and port this host is connected
    to (``duplicate_connect``); without it the kernel refuses with EALREADY when this
    host identity has one there (:class:`AlreadyConnected`). ``write`` writes the options
    and returns the kernel's answer (:func:`~.options.fabrics_write_command`); it may take
    ``timeout`` seconds (at most ``connect_timeout``).

    Not ``nvme connect``: nvme-cli 2.3 reads the host's whole NVMe topology for every
    connect (17 ms more per controller already there, under TCG) and keeps a file open
    per namespace while it does (EMFILE past 1,024 namespaces, the default limit of open
    files); it refuses ``--duplicate-connect``; and 2.13 (libnvme 1.13) was seen giving a
    further controller the connected one's controller secret instead of the one passed
    (kernel tier, 6.12). Failures raise a :class:`ConnectError` subclass as
    :func:`connect` does; the options, secrets among them, are never logged."""
    opts = options or FabricsOptions()
    check_fabrics_values(transport=transport, traddr=traddr, trsvcid=trsvcid,
                         nqn=subsysnqn, hostnqn=hostnqn, hostid=hostid,
                         host_iface=host_iface, host_traddr=host_traddr,
                         dhchap_secret=opts.dhchap_secret,
                         dhchap_ctrl_secret=opts.dhchap_ctrl_secret)
    tokens = [f"transport={transport}", f"traddr={traddr}", f"trsvcid={trsvcid}",
              f"nqn={subsysnqn}", f"hostnqn={hostnqn}",
              *([f"hostid={hostid}"] if hostid else []),
              *opts.kernel_options(host_iface, host_traddr),
              *(["duplicate_connect"] if duplicate else [])]
    limit = connect_timeout if timeout is None else min(timeout, connect_timeout)
    mark = kernel_log.mark()
    argv = ("write", FABRICS_DEV)
    try:
        answer = write(",".join(tokens), limit)
    except TimeoutError:
        kernel_log.since(mark)
        raise TransientConnectError(
            f"{FABRICS_DEV} connect timed out after {limit:g}s",
            timeout_hint(dhchap=opts.dhchap_secret is not None,
                         dhchap_ctrl=opts.dhchap_ctrl_secret is not None)) from None
    except OSError as exc:
        kernel = kernel_log.since(mark)
        result = CommandResult(argv, 1, "", f"Failed to write to {FABRICS_DEV}: "
                               f"{os.strerror(exc.errno or errno.EIO)}\n")
        raise classify_connect_failure(result, kernel, "connect") from None
    kernel_log.since(mark)
    m = re.search(r"instance=(\d+)", answer)
    if not m:
        raise NvmeCliError(f"{FABRICS_DEV} answered {answer.strip()!r}, not instance=N",
                           "see dmesg")
    return f"nvme{m.group(1)}"


def disconnect(run: Runner, *, device: str | None = None, nqn: str | None = None,
               timeout: float) -> int | None:
    """Disconnect one controller (``device``: ``nvme3``) or every one of ``nqn``,
    within ``timeout`` seconds.

    nvme-cli 2.3 exits 0 even when it could not disconnect; its stderr is
    checked instead. A device that is already gone counts as done.
    """
    if bool(device) == bool(nqn):
        raise ValueError("give exactly one of device or nqn")
    argv = [NVME, "disconnect"] + (["--device", os.path.basename(device)] if device
                                   else ["--nqn", nqn or ""])
    result = run(argv, timeout=timeout, check=False)
    text = f"{result.stderr}\n{result.stdout}"
    low = text.lower()
    if device and ("did not find device" in low or "no such file or directory" in low):
        log.info("controller already gone", device=device)
        return 0
    if result.returncode != 0 or "failed to disconnect" in low:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        raise NvmeCliError(f"nvme disconnect {device or nqn} failed: "
                           f"{lines[-1] if lines else 'exit ' + str(result.returncode)}",
                           "see dmesg; the controller may be busy")
    return parse_disconnect(result.stdout) if nqn else 1

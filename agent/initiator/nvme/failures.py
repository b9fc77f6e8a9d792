"""Why a connect or discover failed: typed errors, classified from what nvme-cli and the
kernel print, and :func:`run_fabrics`, the fabrics command run that raises them.

Connect failures are classified from what nvme-cli 2.3 and the 6.1 kernel actually
print (tests/unit/initiator/fixtures/nvme-2.3/connect-*): see
:func:`classify_connect_failure`.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterable, Sequence

from ...errors import KvagentError
from ...system.run import CommandResult, CommandTimeout, Runner
from .kmsg import KernelLogReader


class ConnectError(KvagentError):
    """``nvme connect`` (or ``discover``) failed. ``permanent`` says whether retrying can help."""

    permanent = False

    def __init__(self, message: str, hint: str | None = None, *,
                 result: CommandResult | None = None, kernel: Sequence[str] = (),
                 errno_name: str | None = None, status: int | None = None):
        super().__init__(message, hint)
        self.result = result
        self.kernel = tuple(kernel)
        self.errno_name = errno_name
        self.status = status


class TransientConnectError(ConnectError):
    """Worth retrying: the target is starting, the network flapped, a timeout."""


class PermanentConnectError(ConnectError):
    """Retrying cannot help: refused host, unknown subsystem, bad options, missing module."""

    permanent = True


class AlreadyConnected(ConnectError):
    """nvme-cli refused because it thinks a controller to this subsystem/port exists.

    nvme-cli 2.3 compares transport, address, service and subsystem NQN only
    (not the host NQN), and exits 1 like any other error; callers re-check sysfs.
    """


#: strerror texts nvme-cli prints after "Failed to write to /dev/nvme-fabrics: ".
_TRANSIENT_ERRNOS = {
    errno.ECONNREFUSED, errno.ETIMEDOUT, errno.ECONNRESET, errno.EAGAIN, errno.EINTR,
    errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EHOSTDOWN, errno.ECONNABORTED, errno.EBUSY,
    errno.ENETDOWN,
}
_PERMANENT_ERRNOS = {
    errno.EIO, errno.EINVAL, errno.ENODEV, errno.ENOENT, errno.EPERM, errno.EACCES,
    errno.EPROTONOSUPPORT, errno.EOPNOTSUPP, errno.EKEYREJECTED, errno.ENOKEY,
}
_STRERROR = {os.strerror(e).lower(): e for e in _TRANSIENT_ERRNOS | _PERMANENT_ERRNOS
             | {errno.EALREADY}}
#: NVMe Fabrics Connect status codes (command specific, SCT 1) -> meaning.
CONNECT_STATUS = {
    0x180: "incompatible format",
    0x181: "controller busy",
    0x182: "invalid connect parameters (unknown subsystem NQN or bad host NQN)",
    0x183: "restart discovery",
    0x184: "host not allowed (not in the subsystem's allowed_hosts)",
    0x370: "host path error: the connection went down before the target answered",
}
_DNR = 0x4000
_STATUS_RE = re.compile(r"failed to connect (?:queue|admin queue)?:?\s*\d*\s*ret=(-?\d+)")


def _errno_in(text: str) -> int | None:
    low = text.lower()
    for message, number in _STRERROR.items():
        if message in low:
            return number
    return None


def kernel_status(lines: Iterable[str]) -> int | None:
    """The NVMe status of a failed Connect (``failed to connect queue: 0 ret=16772``)."""
    for line in lines:
        m = _STATUS_RE.search(line)
        if m:
            return int(m.group(1))
    return None


def kernel_reason(lines: Sequence[str]) -> str | None:
    """The most telling kernel line about a failed connect (host side preferred)."""
    keys = ("not allowed", "invalid data parameter", "invalid subsystem", "no handler found",
            "failed to connect socket", "identify", "failed to connect", "connect")
    for key in keys:
        for line in lines:
            if key in line.lower():
                return line.strip()
    return lines[-1].strip() if lines else None


def classify_connect_failure(result: CommandResult, kernel: Sequence[str] = (),
                             what: str = "connect") -> ConnectError:
    """Turn a failed ``nvme connect``/``discover`` into a typed error.

    Observed on Debian 6.1 + nvme-cli 2.3 (fixtures/nvme-2.3/):

    - host not in allowed_hosts, unknown subsystem NQN: exit 1,
      ``Failed to write to /dev/nvme-fabrics: Input/output error``; the kernel
      logs ``Connect for subsystem … is not allowed`` / ``Connect Invalid Data
      Parameter`` and ``failed to connect queue: 0 ret=<status>`` with the DNR
      (do not retry) bit set → permanent.
    - nothing listening (target not up yet, port not linked): ``Connection
      refused`` → transient; ``Network is unreachable`` → transient.
    - a controller to the same subsystem and port exists: ``already connected``
      (exit 1; newer releases exit with EALREADY) → :class:`AlreadyConnected`.
    """
    out = f"{result.stderr}\n{result.stdout}".strip()
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    detail = lines[0] if lines else f"exit {result.returncode}"
    reason = kernel_reason(kernel)
    status = kernel_status(kernel)
    err = _errno_in(out)
    if result.returncode in (errno.EALREADY, 70) or "already connected" in out.lower() \
            or err == errno.EALREADY:
        return AlreadyConnected(f"nvme {what}: already connected", result=result,
                                kernel=kernel, errno_name="EALREADY")
    if "unrecognized option '--tls'" in out:
        return PermanentConnectError(
            f"nvme {what}: this host's nvme-cli has no --tls (NVMe/TCP TLS)",
            "TLS needs nvme-cli 2.4 or later (Debian 13 has 2.13; Debian 12's 2.3 has no "
            "TLS), or remove tls from this initiator pool", result=result, kernel=kernel)
    name = errno.errorcode.get(err) if err is not None else None
    message = f"nvme {what} failed: {detail}"
    if "--tls" in result.argv and err == errno.ENOKEY:
        return PermanentConnectError(
            message, "no TLS pre-shared key for this host and subsystem in the .nvme "
            "keyring (kvagent puts it there from tls.key_file before connecting: see "
            "/proc/keys)", result=result, kernel=kernel, errno_name=name)
    if reason:
        message += f"; kernel: {reason}"
    if status is not None and status >= 0:
        meaning = CONNECT_STATUS.get(status & 0x7FF)
        if meaning:
            message += f" (NVMe status {status:#x}: {meaning})"
        if status & _DNR or (status & 0x7FF) in (0x182, 0x184):
            return PermanentConnectError(message, _hint(status, err), result=result,
                                         kernel=kernel, errno_name=name, status=status)
        return TransientConnectError(message, _retry_hint(status), result=result,
                                     kernel=kernel, errno_name=name, status=status)
    if err in _TRANSIENT_ERRNOS:
        return TransientConnectError(message, _hint(None, err), result=result, kernel=kernel,
                                     errno_name=name)
    if any("authentication failed" in line for line in kernel):
        # A rejected DH-HMAC-CHAP secret: EKEYREJECTED, or EIO when the target drops the
        # connection before the host has read its verdict (seen on 6.12 under load).
        err = errno.EKEYREJECTED
    return PermanentConnectError(message, _hint(None, err), result=result, kernel=kernel,
                                 errno_name=name)


def _retry_hint(status: int) -> str:
    """Why a Connect without the do-not-retry bit is worth retrying."""
    if (status & 0x700) == 0x300:  # path-related: set by this host, not the target
        return ("the connection to the target dropped during the connect (the network, a "
                "target restart, or a target that closed it after refusing this host, e.g. "
                "a DH-HMAC-CHAP refusal on 6.12); retrying")
    return "the target asked us to retry later"


def _hint(status: int | None, err: int | None) -> str:
    if status is not None and (status & 0x7FF) == 0x184:
        return ("add this host's NQN to the pool's hosts on the storage host "
                "(the target's allowed_hosts)")
    if status is not None and (status & 0x7FF) == 0x182:
        return "check the subsystem NQN (does the storage host export it to this host?)"
    return {
        errno.ECONNREFUSED: "nothing listens there yet: is the storage host's port up "
                            "and the subsystem linked to it?",
        errno.ENETUNREACH: "no route to the target address from this host",
        errno.EHOSTUNREACH: "no route to the target address from this host",
        errno.ETIMEDOUT: "the target did not answer in time",
        errno.ECONNRESET: "the target dropped the connection: a port with TLS required "
                          "drops one that does not start TLS (give this pool tls.key_file), "
                          "or the target went away",
        errno.EINVAL: "the kernel rejected the connect options; see the kernel line",
        errno.ENODEV: "load the transport module (modprobe nvme-tcp / nvme-rdma)",
        errno.ENOENT: "load nvme-fabrics (modprobe nvme-fabrics)",
        errno.EACCES: "run as root",
        errno.EPERM: "run as root",
        errno.EIO: "the target refused the connect; see the kernel line (dmesg)",
        errno.EKEYREJECTED: "DH-HMAC-CHAP failed: this pool's auth.key_file must hold the "
                            "secret the storage host has for this host NQN (its pool's "
                            "hosts[].auth.key_file); kvagent keys show FILE prints a "
                            "fingerprint to compare on both hosts",
        errno.ENOKEY: "the storage host requires DH-HMAC-CHAP from this host NQN: give this "
                      "pool auth.key_file (the secret of the storage host's hosts[].auth)",
    }.get(err or -1, "see dmesg for the kernel's reason")


def timeout_hint(*, dhchap: bool = False, dhchap_ctrl: bool = False) -> str:
    """Why a connect may time out: the target not answering, or a DH-HMAC-CHAP secret
    the storage host does not have (``dhchap``: the host's, ``dhchap_ctrl``: the
    controller's was given)."""
    hint = "the target did not answer; it may be starting"
    if dhchap_ctrl:
        return hint + (" (or the controller secret, auth.ctrl_key_file, differs from the "
                       "storage host's: the kernel then waits instead of failing)")
    if dhchap:
        # A rejected secret whose verdict the host did not read before the target
        # dropped the connection: the kernel waits for its admin timeout (60 s)
        # instead of failing (seen on 6.12 under load).
        return hint + (" (or DH-HMAC-CHAP failed and the target dropped the connection "
                       "before the host read why: " + _hint(None, errno.EKEYREJECTED) + ")")
    return hint


def run_fabrics(run: Runner, kernel_log: KernelLogReader, argv: list[str], what: str,
                timeout: float) -> CommandResult:
    """Run a fabrics command (``nvme discover``) within ``timeout``
    seconds; its failure raises the :class:`ConnectError` it is, with the kernel's lines."""
    mark = kernel_log.mark()
    try:
        result = run(argv, timeout=timeout, check=False)
    except CommandTimeout as exc:
        kernel_log.since(mark)
        raise TransientConnectError(f"nvme {what} timed out after {exc.timeout:g}s",
                                    timeout_hint()) from None
    if result.returncode != 0:
        kernel = kernel_log.since(mark)
        raise classify_connect_failure(result, kernel, what)
    kernel_log.since(mark)
    return result

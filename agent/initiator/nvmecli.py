"""A thin wrapper over nvme-cli: argv lists through a Runner, JSON parsed tolerantly.

nvme-cli's JSON changed shape across 2.x releases (fixtures of each version
under tests/unit/initiator/fixtures/, with their sources in its README):

- ``discover``: 2.3 prints ``{"genctr", "records": [...]}``; other releases add
  ``"device"`` and record fields (``eflags``); spacing differs.
- ``list-subsys``: 2.x prints a list of host objects ``[{"HostNQN", "HostID",
  "Subsystems": [{"Name", "NQN", ["IOPolicy", ...], "Paths": [...]}]}]``, one
  per host identity; 1.x printed ``{"Subsystems": [...]}``.
- ``list``: up to 2.10 a flat ``{"Devices": [{"NameSpace": 1, "DevicePath": ...}]}``;
  from 2.11 the nested host → subsystem → controller → namespace layout that
  2.3 printed only for ``list -v``.

Parsers look keys up case-insensitively, ignore fields they do not know and
skip entries they cannot make sense of, so a new nvme-cli degrades to "less
information", not to a crash.

Connect failures are classified from what nvme-cli 2.3 and the 6.1 kernel
actually print (fixtures/nvme-2.3/connect-*): see :func:`classify_connect_failure`.
"""

from __future__ import annotations

import errno
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import KvagentError
from ..fabrics import FabricsAddress
from ..log import get_logger
from ..system.run import CommandResult, CommandTimeout, Runner, default_runner

log = get_logger("initiator.nvmecli")

NVME = "nvme"
DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery"
#: Seconds nvme-cli may take for a connect or discover (the kernel's own connect
#: timeout is ~60 s for an unreachable TCP target; we give up a little earlier
#: and retry, rather than hang an apply pass).
CONNECT_TIMEOUT = 45.0
LIST_TIMEOUT = 30.0


# ----------------------------------------------------------------- errors

class NvmeCliError(KvagentError):
    """nvme-cli failed in a way that is not a connect classification (bad output, ...)."""


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


# ------------------------------------------------------------------ values

@dataclass(frozen=True)
class NvmeCliVersion:
    """``nvme version``: nvme-cli and libnvme versions."""

    raw: str
    version: tuple[int, ...]
    libnvme: tuple[int, ...] | None

    @property
    def text(self) -> str:
        return ".".join(str(p) for p in self.version)


@dataclass(frozen=True)
class DiscoveryEntry:
    """One record of a discovery log page."""

    #: its ``trtype``, ``traddr`` and ``trsvcid``
    address: FabricsAddress
    adrfam: str | None
    subtype: str
    subnqn: str
    portid: int | None = None
    treq: str | None = None
    sectype: str | None = None
    eflags: str | None = None

    @property
    def is_nvm_subsystem(self) -> bool:
        """An I/O subsystem (not the discovery controller itself or a referral)."""
        sub = self.subtype.lower()
        if "discovery" in sub or "referral" in sub:
            return False
        return self.subnqn != DISCOVERY_NQN


@dataclass(frozen=True)
class SubsysPath:
    """A controller (path) of a subsystem as ``nvme list-subsys`` reports it."""

    name: str
    #: its ``Transport`` and ``Address`` (as sysfs shows them)
    address: FabricsAddress
    state: str | None
    ana_state: str | None = None


@dataclass(frozen=True)
class ListedSubsystem:
    """One subsystem of ``nvme list-subsys``, under the host identity it was listed for."""

    name: str | None
    nqn: str
    hostnqn: str | None
    hostid: str | None
    iopolicy: str | None
    paths: tuple[SubsysPath, ...]


@dataclass(frozen=True)
class ListedNamespace:
    """One namespace block device of ``nvme list``."""

    device: str
    nsid: int | None
    subsysnqn: str | None = None
    controller: str | None = None
    serial: str | None = None
    model: str | None = None
    firmware: str | None = None
    used_bytes: int | None = None
    physical_size: int | None = None
    sector_size: int | None = None


@dataclass(frozen=True)
class FabricsOptions:
    """``nvme connect`` tuning options; None leaves the kernel's default.

    ``ctrl_loss_tmo`` -1 means reconnect forever (sysfs then shows ``off``).
    ``fast_io_fail_tmo`` (-1: off) is not an nvme-cli option (2.3 has none): it is
    written to the controller's sysfs attribute after the connect
    (:mod:`agent.initiator.timeouts`), never passed on the command line.
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

    def argv(self, host_iface: str | None = None, host_traddr: str | None = None) -> list[str]:
        """The options as ``nvme connect`` arguments, with the host side of the address
        connected to (``--host-iface``, ``--host-traddr``) among them."""
        out: list[str] = []
        for flag, value in (("--ctrl-loss-tmo", self.ctrl_loss_tmo),
                            ("--reconnect-delay", self.reconnect_delay),
                            ("--keep-alive-tmo", self.keep_alive_tmo),
                            ("--nr-io-queues", self.nr_io_queues),
                            ("--queue-size", self.queue_size),
                            ("--host-iface", host_iface),
                            ("--host-traddr", host_traddr),
                            ("--dhchap-secret", self.dhchap_secret),
                            ("--dhchap-ctrl-secret", self.dhchap_ctrl_secret)):
            if value is not None:
                out += [flag, str(value)]
        if self.tls:
            out.append("--tls")
        return out

    def kernel_options(self, host_iface: str | None = None,
                       host_traddr: str | None = None) -> list[str]:
        """The same options as ``/dev/nvme-fabrics`` tokens (drivers/nvme/host/fabrics.c)."""
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


# ------------------------------------------------------------------ parsing

def extract_json(text: str) -> Any:
    """The first JSON value in ``text`` (nvme-cli may print warnings before it)."""
    decoder = json.JSONDecoder()
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    for start in sorted(starts):
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        return value
    raise NvmeCliError("nvme-cli printed no JSON", "run the command by hand with -o json")


def _get(obj: Any, *names: str) -> Any:
    """``obj[name]`` for the first of ``names`` present, keys compared case-insensitively."""
    if not isinstance(obj, Mapping):
        return None
    lowered = {str(k).lower(): v for k, v in obj.items()}
    for name in names:
        if name.lower() in lowered:
            return lowered[name.lower()]
    return None


def _str(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip(), 0)
    except (TypeError, ValueError):
        return None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def parse_version(text: str) -> NvmeCliVersion:
    """Parse ``nvme version`` (``nvme version 2.3 (git 2.3)\\nlibnvme version 1.3 ...``)."""
    def numbers(label: str) -> tuple[int, ...] | None:
        m = re.search(rf"^{label} version\s+v?(\d+(?:\.\d+)*)", text, re.MULTILINE)
        return tuple(int(p) for p in m.group(1).split(".")) if m else None
    version = numbers("nvme")
    if version is None:
        raise NvmeCliError(f"cannot read the nvme-cli version from {text.strip()[:80]!r}")
    return NvmeCliVersion(raw=text.strip(), version=version, libnvme=numbers("libnvme"))


def parse_discover(text: str) -> list[DiscoveryEntry]:
    """Records of ``nvme discover -o json``; records without address or NQN are skipped."""
    data = extract_json(text)
    records = _get(data, "records") if isinstance(data, Mapping) else data
    out = []
    for item in _list(records):
        if not isinstance(item, Mapping):
            continue
        rec = {str(k).lower(): v for k, v in item.items()}
        traddr, subnqn = _str(rec.get("traddr")), _str(rec.get("subnqn"))
        if not traddr or not subnqn:
            continue
        out.append(DiscoveryEntry(
            address=FabricsAddress.from_discovery(rec), adrfam=_str(rec.get("adrfam")),
            subtype=_str(rec.get("subtype")) or "", subnqn=subnqn,
            portid=_int(rec.get("portid")), treq=_str(rec.get("treq")),
            sectype=_str(rec.get("sectype")), eflags=_str(rec.get("eflags")),
        ))
    return out


def parse_connect(text: str) -> str | None:
    """The controller name ``nvme connect -o json`` printed (``{"device": "nvme2"}``)."""
    if not text.strip():
        return None
    try:
        data = extract_json(text)
    except NvmeCliError:
        return None
    return _str(_get(data, "device"))


def _paths(items: Any) -> tuple[SubsysPath, ...]:
    out = []
    for p in _list(items):
        name = _str(_get(p, "Name", "Controller"))
        if not name:
            continue
        out.append(SubsysPath(
            name=name, address=FabricsAddress.from_sysfs(_str(_get(p, "Transport")) or "",
                                                         _str(_get(p, "Address")) or ""),
            state=_str(_get(p, "State")), ana_state=_str(_get(p, "ANAState")),
        ))
    return tuple(out)


def _subsystems(items: Any, hostnqn: str | None, hostid: str | None) -> list[ListedSubsystem]:
    out: list[ListedSubsystem] = []
    for s in _list(items):
        nqn = _str(_get(s, "NQN", "SubsystemNQN"))
        if nqn is None:
            # nvme-cli 1.x printed a subsystem's Paths as a separate object after it.
            paths = _paths(_get(s, "Paths"))
            if out and paths:
                last = out[-1]
                out[-1] = ListedSubsystem(last.name, last.nqn, last.hostnqn, last.hostid,
                                          last.iopolicy, last.paths + paths)
            continue
        out.append(ListedSubsystem(
            name=_str(_get(s, "Name", "Subsystem")), nqn=nqn, hostnqn=hostnqn, hostid=hostid,
            iopolicy=_str(_get(s, "IOPolicy")), paths=_paths(_get(s, "Paths")),
        ))
    return out


def parse_list_subsys(text: str) -> list[ListedSubsystem]:
    """Subsystems of ``nvme list-subsys -o json`` (2.x host list, or 1.x object)."""
    data = extract_json(text)
    hosts = data if isinstance(data, list) else [data]
    out: list[ListedSubsystem] = []
    for host in hosts:
        if not isinstance(host, Mapping):
            continue
        if _get(host, "Subsystems") is None and _get(host, "NQN") is not None:
            out += _subsystems([host], None, None)  # a bare subsystem object
            continue
        out += _subsystems(_get(host, "Subsystems"), _str(_get(host, "HostNQN")),
                           _str(_get(host, "HostID")))
    return out


def _flat_namespace(d: Any) -> ListedNamespace | None:
    device = _str(_get(d, "DevicePath"))
    if not device:
        return None
    return ListedNamespace(
        device=device, nsid=_int(_get(d, "NameSpace", "Namespace", "NSID")),
        subsysnqn=_str(_get(d, "SubsystemNQN")), serial=_str(_get(d, "SerialNumber")),
        model=_str(_get(d, "ModelNumber")), firmware=_str(_get(d, "Firmware")),
        used_bytes=_int(_get(d, "UsedBytes")), physical_size=_int(_get(d, "PhysicalSize")),
        sector_size=_int(_get(d, "SectorSize")),
    )


def _nested_namespace(ns: Any, subsysnqn: str | None, ctrl: Any) -> ListedNamespace | None:
    name = _str(_get(ns, "NameSpace", "Namespace"))
    if not name or name.isdigit():
        return None
    return ListedNamespace(
        device=name if name.startswith("/") else f"/dev/{name}", nsid=_int(_get(ns, "NSID")),
        subsysnqn=subsysnqn, controller=_str(_get(ctrl, "Controller")) if ctrl else None,
        serial=_str(_get(ctrl, "SerialNumber")) if ctrl else None,
        model=_str(_get(ctrl, "ModelNumber")) if ctrl else None,
        firmware=_str(_get(ctrl, "Firmware")) if ctrl else None,
        used_bytes=_int(_get(ns, "UsedBytes")), physical_size=_int(_get(ns, "PhysicalSize")),
        sector_size=_int(_get(ns, "SectorSize")),
    )


def parse_list(text: str) -> list[ListedNamespace]:
    """Namespaces of ``nvme list -o json``: the flat (≤2.10) or nested (≥2.11, ``-v``) layout."""
    data = extract_json(text)
    out: list[ListedNamespace] = []
    seen: set[str] = set()

    def add(ns: ListedNamespace | None) -> None:
        if ns and ns.device not in seen:
            seen.add(ns.device)
            out.append(ns)

    for dev in _list(_get(data, "Devices")):
        if _get(dev, "Subsystems") is None:
            add(_flat_namespace(dev))
            continue
        for sub in _list(_get(dev, "Subsystems")):
            nqn = _str(_get(sub, "SubsystemNQN", "NQN"))
            ctrls = _list(_get(sub, "Controllers"))
            for ctrl in ctrls:
                for ns in _list(_get(ctrl, "Namespaces")):
                    add(_nested_namespace(ns, nqn, ctrl))
            # Multipath heads are listed under the subsystem, not a controller.
            first = ctrls[0] if ctrls else None
            for ns in _list(_get(sub, "Namespaces")):
                add(_nested_namespace(ns, nqn, first))
    return out


def parse_disconnect(text: str) -> int | None:
    """How many controllers ``nvme disconnect -n`` says it disconnected."""
    m = re.search(r"disconnected\s+(\d+)\s+controller", text)
    return int(m.group(1)) if m else None


# ---------------------------------------------------------- classification

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


# ------------------------------------------------------------ kernel log

class KernelLog:
    """Reads new kernel log records from ``/dev/kmsg`` (host-side NVMe lines only).

    ``mark()`` before a command, ``since(mark)`` after it. Without access to
    the kernel log it returns nothing (the errors then carry nvme-cli's text only).
    """

    _KEEP = re.compile(r"^(nvme |nvme_fabrics|nvme_tcp|nvme_rdma|nvme_fc|nvme_core)")

    def __init__(self, path: str = "/dev/kmsg"):
        self.path = path

    def mark(self) -> int | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            os.lseek(fd, 0, os.SEEK_END)
            # The sequence number of the next record is what we want; /dev/kmsg
            # cannot tell it without reading, so remember the fd position instead.
            return fd
        except OSError:
            os.close(fd)
            return None

    def since(self, mark: int | None) -> list[str]:
        if mark is None:
            return []
        lines: list[str] = []
        try:
            while True:
                try:
                    record = os.read(mark, 8192)
                except BlockingIOError:
                    break
                except BrokenPipeError:
                    continue  # records were overwritten; keep reading
                if not record:
                    break
                text = record.decode(errors="replace")
                _, _, message = text.partition(";")
                message = message.split("\n", 1)[0].strip()
                if self._KEEP.match(message):
                    lines.append(message)
        except OSError:
            pass
        finally:
            os.close(mark)
        return lines


class NoKernelLog:
    """A kernel log that shows nothing (tests, or hosts without /dev/kmsg access)."""

    def mark(self) -> None:
        return None

    def since(self, mark: object) -> list[str]:
        return []


# -------------------------------------------------------------- the wrapper

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


class NvmeCli:
    """nvme-cli commands kvagent needs, through a :class:`Runner`."""

    def __init__(self, runner: Runner | None = None, *, kernel_log: Any = None,
                 connect_timeout: float = CONNECT_TIMEOUT, list_timeout: float = LIST_TIMEOUT,
                 fabrics_write: Callable[[str, float], str] | None = None):
        self.run = runner or default_runner()
        #: writes options to /dev/nvme-fabrics and returns its answer, within a time
        #: limit (a seam for tests; by default a command: :func:`fabrics_write_command`)
        self.fabrics_write = fabrics_write or (
            lambda options, timeout: fabrics_write_command(self.run, options, timeout))
        self.kernel_log = kernel_log if kernel_log is not None else KernelLog()
        self.connect_timeout = connect_timeout
        self.list_timeout = list_timeout

    def version(self) -> NvmeCliVersion:
        return parse_version(self.run([NVME, "version"], timeout=self.list_timeout).stdout)

    @staticmethod
    def _host_args(hostnqn: str | None, hostid: str | None, host_traddr: str | None = None,
                   host_iface: str | None = None) -> list[str]:
        out: list[str] = []
        for flag, value in (("--hostnqn", hostnqn), ("--hostid", hostid),
                            ("--host-traddr", host_traddr), ("--host-iface", host_iface)):
            if value:
                out += [flag, value]
        return out

    def _fabrics(self, argv: list[str], what: str) -> CommandResult:
        mark = self.kernel_log.mark()
        try:
            result = self.run(argv, timeout=self.connect_timeout, check=False)
        except CommandTimeout as exc:
            self.kernel_log.since(mark)
            hint = "the target did not answer; it may be starting"
            if "--dhchap-ctrl-secret" in argv:
                hint += (" (or the controller secret, auth.ctrl_key_file, differs from the "
                         "storage host's: the kernel then waits instead of failing)")
            elif "--dhchap-secret" in argv:
                # A rejected secret whose verdict the host did not read before the target
                # dropped the connection: the kernel waits for its admin timeout (60 s)
                # instead of failing (seen on 6.12 under load).
                hint += (" (or DH-HMAC-CHAP failed and the target dropped the connection "
                         "before the host read why: " + _hint(None, errno.EKEYREJECTED) + ")")
            raise TransientConnectError(f"nvme {what} timed out after {exc.timeout:g}s",
                                        hint) from None
        if result.returncode != 0:
            kernel = self.kernel_log.since(mark)
            raise classify_connect_failure(result, kernel, what)
        self.kernel_log.since(mark)
        return result

    def discover(self, transport: str, traddr: str, trsvcid: str | int, *,
                 hostnqn: str | None = None, hostid: str | None = None,
                 host_traddr: str | None = None,
                 host_iface: str | None = None, tls: bool = False) -> list[DiscoveryEntry]:
        """The discovery log of ``traddr:trsvcid`` as this host (it lists only what we may
        use); ``tls``: over NVMe/TCP TLS (a port with TLS required asks it of discovery)."""
        check_fabrics_values(transport=transport, traddr=traddr, trsvcid=trsvcid,
                             hostnqn=hostnqn, hostid=hostid, host_traddr=host_traddr,
                             host_iface=host_iface)
        argv = [NVME, "discover", "--transport", transport, "--traddr", traddr,
                "--trsvcid", str(trsvcid), *self._host_args(hostnqn, hostid, host_traddr,
                                                            host_iface),
                *(["--tls"] if tls else []), "--output-format", "json"]
        result = self._fabrics(argv, "discover")
        return parse_discover(result.stdout)

    def connect(self, transport: str, traddr: str, trsvcid: str | int, subsysnqn: str, *,
                hostnqn: str | None = None, hostid: str | None = None,
                host_iface: str | None = None, host_traddr: str | None = None,
                options: FabricsOptions | None = None,
                duplicate: bool = False) -> str | None:
        """``nvme connect``; returns the new controller's name when nvme-cli reports it.

        Raises a :class:`ConnectError` subclass on failure (see
        :func:`classify_connect_failure`). ``duplicate`` passes
        ``--duplicate-connect`` (needed for a second host identity on the same port).
        """
        opts = options or FabricsOptions()
        check_fabrics_values(transport=transport, traddr=traddr, trsvcid=trsvcid,
                             nqn=subsysnqn, hostnqn=hostnqn, hostid=hostid,
                             host_iface=host_iface, host_traddr=host_traddr,
                             dhchap_secret=opts.dhchap_secret,
                             dhchap_ctrl_secret=opts.dhchap_ctrl_secret)
        argv = [NVME, "connect", "--transport", transport, "--traddr", traddr,
                "--trsvcid", str(trsvcid), "--nqn", subsysnqn,
                *self._host_args(hostnqn, hostid), *opts.argv(host_iface, host_traddr)]
        if duplicate:
            argv.append("--duplicate-connect")
        argv += ["--output-format", "json"]
        result = self._fabrics(argv, "connect")
        return parse_connect(result.stdout)

    def add_controller(self, transport: str, traddr: str, trsvcid: str | int, subsysnqn: str,
                       *, hostnqn: str, hostid: str | None = None,
                       host_iface: str | None = None, host_traddr: str | None = None,
                       options: FabricsOptions | None = None,
                       timeout: float | None = None) -> str:
        """A further controller to a subsystem and port this host is connected to, through
        the kernel's ``/dev/nvme-fabrics`` with ``duplicate_connect``; returns its name.
        The write may take ``timeout`` seconds (at most the connect timeout).

        Not ``nvme connect --duplicate-connect``: nvme-cli 2.3 refuses it, and 2.13 (libnvme
        1.13) was seen giving the new controller the connected one's controller secret
        instead of the one passed (kernel tier, 6.12). Failures raise a
        :class:`ConnectError` subclass as :meth:`connect` does; the options, secrets among
        them, are never logged."""
        opts = options or FabricsOptions()
        check_fabrics_values(transport=transport, traddr=traddr, trsvcid=trsvcid,
                             nqn=subsysnqn, hostnqn=hostnqn, hostid=hostid,
                             host_iface=host_iface, host_traddr=host_traddr,
                             dhchap_secret=opts.dhchap_secret,
                             dhchap_ctrl_secret=opts.dhchap_ctrl_secret)
        tokens = [f"transport={transport}", f"traddr={traddr}", f"trsvcid={trsvcid}",
                  f"nqn={subsysnqn}", f"hostnqn={hostnqn}",
                  *([f"hostid={hostid}"] if hostid else []),
                  *opts.kernel_options(host_iface, host_traddr), "duplicate_connect"]
        limit = self.connect_timeout if timeout is None else min(timeout,
                                                                 self.connect_timeout)
        mark = self.kernel_log.mark()
        argv = ("write", FABRICS_DEV)
        try:
            answer = self.fabrics_write(",".join(tokens), limit)
        except TimeoutError:
            self.kernel_log.since(mark)
            raise TransientConnectError(
                f"{FABRICS_DEV} connect timed out after {limit:g}s",
                "the target did not answer; a controller secret that differs from the "
                "storage host's makes the kernel wait instead of failing") from None
        except OSError as exc:
            kernel = self.kernel_log.since(mark)
            result = CommandResult(argv, 1, "", f"Failed to write to {FABRICS_DEV}: "
                                   f"{os.strerror(exc.errno or errno.EIO)}\n")
            raise classify_connect_failure(result, kernel, "connect") from None
        self.kernel_log.since(mark)
        m = re.search(r"instance=(\d+)", answer)
        if not m:
            raise NvmeCliError(f"{FABRICS_DEV} answered {answer.strip()!r}, not instance=N",
                               "see dmesg")
        return f"nvme{m.group(1)}"

    def disconnect(self, *, device: str | None = None, nqn: str | None = None,
                   timeout: float | None = None) -> int | None:
        """Disconnect one controller (``device``: ``nvme3``) or every one of ``nqn``,
        within ``timeout`` seconds (default: the list timeout).

        nvme-cli 2.3 exits 0 even when it could not disconnect; its stderr is
        checked instead. A device that is already gone counts as done.
        """
        if bool(device) == bool(nqn):
            raise ValueError("give exactly one of device or nqn")
        argv = [NVME, "disconnect"] + (["--device", os.path.basename(device)] if device
                                       else ["--nqn", nqn or ""])
        result = self.run(argv, timeout=self.list_timeout if timeout is None else timeout,
                          check=False)
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

    def list_subsys(self) -> list[ListedSubsystem]:
        result = self.run([NVME, "list-subsys", "--output-format", "json"],
                          timeout=self.list_timeout)
        return parse_list_subsys(result.stdout) if result.stdout.strip() else []

    def list_devices(self) -> list[ListedNamespace]:
        """``nvme list`` (the namespaces' block devices)."""
        result = self.run([NVME, "list", "--output-format", "json"], timeout=self.list_timeout)
        return parse_list(result.stdout) if result.stdout.strip() else []

    def list_ns(self, controller: str) -> list[int]:
        """Active namespace ids of a controller (Identify active NS list), e.g. ``nvme2``."""
        result = self.run([NVME, "list-ns", f"/dev/{controller}"], timeout=self.list_timeout)
        return parse_list_ns(result.stdout)


def parse_list_ns(text: str) -> list[int]:
    """nsids from ``nvme list-ns`` text output (``[   0]:0x1`` per line) or its JSON form."""
    stripped = text.strip()
    if stripped.startswith("{"):
        data = json.loads(stripped)
        return sorted(int(e["nsid"]) for e in data.get("nsid_list", []))
    return sorted(int(m.group(1), 16) for m in re.finditer(r"\]\s*:\s*0x([0-9a-fA-F]+)", text))

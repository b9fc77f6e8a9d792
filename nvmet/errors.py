"""Typed nvmet errors: the kernel's errno, the configfs path and a hint for the operator."""

from __future__ import annotations

import errno as E
import os
from collections.abc import Mapping


class NvmetError(Exception):
    """Base of every error this library raises.

    ``errno`` is the kernel's error number (None when the error is not from a syscall),
    ``path`` the configfs path relative to the nvmet root, ``hint`` what to do about it.
    """

    errno_value: int | None = None

    def __init__(self, message: str, *, errno: int | None = None, path: str | None = None,
                 op: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.errno = errno if errno is not None else self.errno_value
        self.path = path
        self.op = op
        self.hint = hint

    @property
    def errno_name(self) -> str | None:
        """``EBUSY``, ``EACCES``... or None."""
        return E.errorcode.get(self.errno) if self.errno is not None else None

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class ConfigFSError(NvmetError):
    """A configfs operation failed with an errno."""


class Busy(ConfigFSError):
    """EBUSY: the object is in use (enabled namespace, linked subsystem or host)."""

    errno_value = E.EBUSY


class AccessDenied(ConfigFSError):
    """EACCES: e.g. a port attribute written while a subsystem is linked into the port."""

    errno_value = E.EACCES


class NotPermitted(ConfigFSError):
    """EPERM: configfs does not allow this operation here (default group, attribute file)."""

    errno_value = E.EPERM


class Exists(ConfigFSError):
    """EEXIST: the directory or link already exists."""

    errno_value = E.EEXIST


class NotFound(ConfigFSError):
    """ENOENT: the object, the attribute, the link target or the device does not exist."""

    errno_value = E.ENOENT


class NotEmpty(ConfigFSError):
    """ENOTEMPTY: the directory still has children (configfs never deletes recursively)."""

    errno_value = E.ENOTEMPTY


class InvalidValue(ConfigFSError):
    """EINVAL: the kernel refused the name or value."""

    errno_value = E.EINVAL


class AddressInUse(ConfigFSError):
    """EADDRINUSE: another port or process already listens on the address."""

    errno_value = E.EADDRINUSE


class AddressNotAvailable(ConfigFSError):
    """EADDRNOTAVAIL: the port's address is not assigned to any local interface."""

    errno_value = E.EADDRNOTAVAIL


class NoDevice(ConfigFSError):
    """ENODEV: no device for the request (e.g. rdma port without an RDMA device)."""

    errno_value = E.ENODEV


class TooMany(ConfigFSError):
    """EMFILE/ENOSPC: a kernel limit was reached (namespaces per subsystem...)."""


class NotADirectory(ConfigFSError):
    """ENOTDIR / EISDIR: a file where a directory was expected, or the reverse."""


class NvmetUnavailable(NvmetError):
    """The nvmet configfs tree is not there: module not loaded or configfs not mounted."""


class ReadError(NvmetError):
    """The live tree could not be read completely (never treated as 'empty')."""


class PlanError(NvmetError):
    """The desired tree cannot be planned: invalid, out of scope or needing a missing feature."""


class OutOfScope(PlanError):
    """The desired tree names an object the caller does not own."""


class ScopeConflict(PlanError):
    """Converging would touch a foreign object (e.g. a foreign link on an owned port)."""


class FeatureMissing(PlanError):
    """The desired tree needs a kernel feature this kernel does not have."""

    def __init__(self, feature: str, attribute: str, kind: str, kernel: str | None,
                 path: str | None = None):
        where = f"kernel {kernel}" if kernel else "this kernel"
        super().__init__(
            f"{feature} is not available on {where}: {kind} attribute {attribute!r} does not "
            "exist",
            path=path,
            hint="remove the setting from the desired state, or use a kernel built with it",
        )
        self.feature = feature
        self.attribute = attribute
        self.kind = kind
        self.kernel = kernel


_BY_ERRNO: dict[int, type[ConfigFSError]] = {
    E.EBUSY: Busy,
    E.EACCES: AccessDenied,
    E.EPERM: NotPermitted,
    E.EEXIST: Exists,
    E.ENOENT: NotFound,
    E.ENOTEMPTY: NotEmpty,
    E.EINVAL: InvalidValue,
    E.ERANGE: InvalidValue,
    E.EFAULT: InvalidValue,
    E.EADDRINUSE: AddressInUse,
    E.EADDRNOTAVAIL: AddressNotAvailable,
    E.ENODEV: NoDevice,
    E.ENXIO: NoDevice,
    E.EMFILE: TooMany,
    E.ENOSPC: TooMany,
    E.ENOTDIR: NotADirectory,
    E.EISDIR: NotADirectory,
}


def error_class(errno: int | None) -> type[ConfigFSError]:
    """The typed exception class for ``errno`` (ConfigFSError when there is none)."""
    return _BY_ERRNO.get(errno or -1, ConfigFSError)


def _port_of(path: str) -> str | None:
    parts = path.split("/")
    return parts[1] if len(parts) > 1 and parts[0] == "ports" else None


def hint_for(errno: int | None, op: str, path: str,
             context: Mapping[str, str] | None = None) -> str | None:
    """An operator hint for ``op`` on ``path`` failing with ``errno``.

    ``context`` may carry ``traddr``, ``trsvcid``, ``trtype`` (port links),
    ``device_path`` (namespace enable) and ``kernel``.
    """
    ctx = dict(context or {})
    name = path.rsplit("/", 1)[-1]
    port = _port_of(path)
    addr = ctx.get("traddr", "?")
    svc = ctx.get("trsvcid")
    where = f"{addr}:{svc}" if svc else addr
    if op == "symlink" and port is not None and "/subsystems/" in path:
        if errno == E.EADDRNOTAVAIL:
            return (f"port {port} address {addr} is not configured on this host yet "
                    f"(EADDRNOTAVAIL): assign it to an interface (ip addr add {addr}/<prefix> "
                    "dev <if>) or fix the port's address; the next pass retries")
        if errno == E.EADDRINUSE:
            return (f"port {port} address {where} is already in use by another nvmet port or "
                    "a process (EADDRINUSE): pick another address or service id")
        if errno == E.ENODEV:
            return (f"port {port} is {ctx.get('trtype', 'rdma')} but no RDMA device serves "
                    f"{addr} (ENODEV): load the RDMA driver, or for soft-RoCE "
                    "'rdma link add rxe0 type rxe netdev <if>'")
        if errno == E.EINVAL:
            return (f"port {port} address is incomplete or invalid (trtype, adrfam, traddr, "
                    "trsvcid must all be set and valid), or the target is not a subsystem")
    if op == "symlink" and "/allowed_hosts/" in path and errno == E.EINVAL:
        return ("a subsystem with attr_allow_any_host=1 takes no allowed_hosts links, and only "
                "host directories can be linked there")
    if op == "symlink" and errno == E.ENOENT:
        return "the link target does not exist: create the host or subsystem first"
    if errno == E.EACCES and port is not None and op == "write":
        return (f"port {port} has subsystems linked, so its addr_*/param_* attributes are "
                "read-only: a changed address means a new port (unlink, rmdir, create)")
    if errno == E.EBUSY and op == "write":
        return f"{name} cannot change while the namespace is enabled: disable, write, enable"
    if errno == E.EINVAL and op == "write" and name in ("buffered_io", "resv_enable"):
        return f"{name} cannot change while the namespace is enabled: disable, write, enable"
    if errno == E.EBUSY and op == "rmdir":
        return ("still linked: unlink it from every port (subsystem) or allowed_hosts (host) "
                "first")
    if errno == E.ENOTEMPTY:
        return ("the directory still has namespaces, links, referrals or ANA groups; "
                "configfs never deletes recursively: remove the children first")
    if op == "write" and name == "enable" and errno in (E.EINVAL, E.ENOENT, E.ENOTBLK):
        dev = ctx.get("device_path", "the device")
        if errno == E.ENOENT:
            return f"{dev} does not exist"
        return (f"nvmet cannot open {dev}: the device_path is empty, or it is a file on a "
                "filesystem without O_DIRECT (tmpfs, overlay) and needs buffered_io=1")
    if op == "write" and errno == E.ENOENT:
        kernel = ctx.get("kernel")
        on = f"kernel {kernel}" if kernel else "this kernel"
        return f"attribute {name} does not exist on {on} (or its object is gone)"
    if op == "write" and errno == E.EINVAL and name in ("attr_model", "attr_serial",
                                                         "attr_version"):
        return (f"{name} is fixed once a host has identified the subsystem, and must be "
                "printable ASCII of a valid length")
    if op == "mkdir" and errno == E.EINVAL:
        if "/namespaces/" in path:
            return "nsid must be a number from 1 to 4294967294"
        if path.startswith("ports/"):
            return "port ids are numbers from 0 to 65535"
        return "the kernel refused this name"
    if errno == E.EFAULT and op == "write":
        return "configfs refuses an empty value (EFAULT): give a non-empty value"
    if errno == E.EPERM:
        return "configfs does not allow this here (default groups and attribute files stay)"
    if errno == E.EEXIST:
        if op == "symlink":
            return "already linked (possibly under another name); nothing to do"
        return "already exists; nothing to do (the applier counts this as success)"
    if errno == E.ENOENT and op in ("rmdir", "unlink"):
        return "already gone; nothing to do (the applier counts this as success)"
    if errno == E.EISDIR and name == "enable":
        return f"{ctx.get('device_path', 'the device_path')} is a directory, not a device or file"
    if errno == E.EINVAL and op == "write":
        if name == "attr_allow_any_host":
            return "unlink every allowed_hosts entry before setting allow_any_host=1"
        if name == "revalidate_size":
            return "only an enabled namespace can be revalidated (write 1 after enable)"
        if name in ("attr_cntlid_min", "attr_cntlid_max"):
            return "attr_cntlid_min must stay <= attr_cntlid_max, both 1..65519"
        if name == "attr_qid_max":
            return "attr_qid_max is 1..128"
        if name in ("device_uuid", "device_nguid"):
            return f"{name} takes a uuid such as 3b0e5a2c-6f1d-5c8e-a7d2-6b76616765e7"
        return (f"the kernel refused this value for {name}: check its spelling and range "
                "(addr_trtype tcp/rdma, addr_adrfam ipv4/ipv6, ana_state optimized/...)")
    if errno == E.EACCES and op == "read":
        return f"{name} is write-only"
    return None


def from_oserror(exc: OSError, op: str, path: str,
                 context: Mapping[str, str] | None = None) -> ConfigFSError:
    """Turn an OSError from a configfs call into the typed error for its errno."""
    code = exc.errno
    cls = error_class(code)
    reason = os.strerror(code) if code else str(exc)
    label = E.errorcode.get(code or -1, "?")
    return cls(f"{op} {path}: {reason} ({label})", errno=code, path=path, op=op,
               hint=hint_for(code, op, path, context))

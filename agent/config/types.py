"""Value types used in the config model; each knows how to parse and check itself.

Every type has ``parse(value) -> instance`` raising ``ValueError`` with a
message that says what is wrong (the caller adds the field path).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket

from nvmet.nqn import InvalidNQN, validate_nqn, validate_nqn_prefix

from ..text import shown
from .units import format_duration, format_size, parse_duration, parse_size

_NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$")
_VG_RE = re.compile(r"^[A-Za-z0-9+_.][A-Za-z0-9+_.-]{0,126}$")


def _expect_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        got = ("a mapping" if isinstance(value, dict) else "a list" if isinstance(value, list)
               else "nothing (null)" if value is None
               else f"{type(value).__name__} {shown(value)}")
        raise ValueError(f"must be {what}, got {got}")
    return value


class Name(str):
    """A short object name: 1-32 of a-z, 0-9 and '-', starting and ending alphanumeric."""

    @classmethod
    def parse(cls, value: object) -> Name:
        text = _expect_str(value, "a name")
        if not _NAME_RE.match(text):
            raise ValueError(
                f"{shown(text)} is not a valid name: use 1-32 characters a-z, 0-9 and '-', "
                "starting and ending with a letter or digit"
            )
        return cls(text)


class VolumeGroupName(str):
    """An LVM volume group name."""

    @classmethod
    def parse(cls, value: object) -> VolumeGroupName:
        text = _expect_str(value, "a volume group name")
        if text in (".", "..") or not _VG_RE.match(text):
            raise ValueError(f"{shown(text)} is not a valid LVM volume group name")
        return cls(text)


class NQN(str):
    """An NVMe Qualified Name (validated: syntax, at most 223 bytes, no '/' or whitespace)."""

    @classmethod
    def parse(cls, value: object) -> NQN:
        text = _expect_str(value, "an NQN")
        try:
            return cls(validate_nqn(text))
        except InvalidNQN as exc:
            raise ValueError(f"{shown(text)} is not a valid NQN: it {exc}") from None


class NQNPrefix(str):
    """An NQN prefix such as ``nqn.2026-11.io.kvagent``."""

    @classmethod
    def parse(cls, value: object) -> NQNPrefix:
        text = _expect_str(value, "an NQN prefix")
        try:
            return cls(validate_nqn_prefix(text))
        except InvalidNQN as exc:
            raise ValueError(f"{shown(text)} is not a valid NQN prefix: it {exc}") from None


class AbsPath(str):
    """An absolute, normalised path without '..' components."""

    @classmethod
    def parse(cls, value: object) -> AbsPath:
        text = _expect_str(value, "an absolute path")
        if not text.startswith("/"):
            raise ValueError(f"{shown(text)} is not an absolute path (it must start with '/')")
        if "\x00" in text or "\n" in text:
            raise ValueError(f"{shown(text)} contains a NUL or newline character")
        if ".." in text.split("/"):
            raise ValueError(f"{shown(text)} must not contain '..'")
        normal = os.path.normpath(text)
        if normal.startswith("//"):
            normal = "/" + normal.lstrip("/")
        return cls(normal)


class DeviceId(AbsPath):
    """A stable block-device name: a path under /dev/disk/by-id/ (WWN, EUI, serial based)."""

    @classmethod
    def parse(cls, value: object) -> DeviceId:
        path = AbsPath.parse(value)
        if not path.startswith("/dev/disk/by-id/") or path == "/dev/disk/by-id":
            raise ValueError(
                f"{shown(path)} is not a stable device id: name whole devices by "
                "/dev/disk/by-id/... (WWN, EUI or serial), never by /dev/nvmeXnY or /dev/sdX, "
                "which change across boots"
            )
        return cls(path)


class BlankDevice(AbsPath):
    """A block device path for a new volume group: /dev/disk/by-id/... preferred."""

    @classmethod
    def parse(cls, value: object) -> BlankDevice:
        path = AbsPath.parse(value)
        if not path.startswith("/dev/"):
            raise ValueError(f"{shown(path)} is not a device path under /dev")
        return cls(path)


class IPAddress(str):
    """An IPv4 or IPv6 address (no hostnames: the kernel target needs a literal address)."""

    @classmethod
    def parse(cls, value: object) -> IPAddress:
        text = _expect_str(value, "an IP address")
        try:
            return cls(str(ipaddress.ip_address(text)))
        except ValueError:
            raise ValueError(f"{shown(text)} is not an IPv4 or IPv6 address") from None

    @property
    def family(self) -> str:
        """``ipv4`` or ``ipv6`` (the nvmet ``addr_adrfam`` value)."""
        return "ipv6" if ipaddress.ip_address(self).version == 6 else "ipv4"


class ListenAddress(str):
    """``host:port`` or ``[v6]:port`` for the health HTTP server."""

    @classmethod
    def parse(cls, value: object) -> ListenAddress:
        text = _expect_str(value, "host:port")
        m = re.match(r"^(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:\[\]]+)):(?P<port>[0-9]+)$", text)
        if not m:
            raise ValueError(f"{shown(text)} is not host:port (use [addr]:port for IPv6)")
        host = m.group("v6") or m.group("host")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if host != "localhost":
                raise ValueError(f"{shown(text)}: {shown(host)} is not an IP address") from None
        port = int(m.group("port"))
        if not 0 < port < 65536:
            raise ValueError(f"{shown(text)}: port {port} is out of range 1-65535")
        return cls(text)

    @property
    def host(self) -> str:
        return self.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.rsplit(":", 1)[1])

    @property
    def is_loopback(self) -> bool:
        return self.host == "localhost" or ipaddress.ip_address(self.host).is_loopback


class Size(int):
    """A byte count written as ``512GiB``, ``1.5TB`` or a plain number of bytes."""

    @classmethod
    def parse(cls, value: object) -> Size:
        return cls(parse_size(value))

    def __str__(self) -> str:
        return format_size(self)


class Duration(float):
    """Seconds, written as ``30s``, ``5m``, ``1h``, ``250ms`` or a plain number of seconds."""

    @classmethod
    def parse(cls, value: object) -> Duration:
        return cls(parse_duration(value))

    def __str__(self) -> str:
        return format_duration(self)


class Percent(float):
    """A fraction written as ``45%`` (or a number 0-100)."""

    @classmethod
    def parse(cls, value: object) -> Percent:
        if isinstance(value, bool):
            raise ValueError("must be a percentage such as 45%")
        if isinstance(value, str) and value.strip().endswith("%"):
            try:
                number = float(value.strip()[:-1])
            except ValueError:
                raise ValueError(f"{shown(value)} is not a percentage") from None
        elif isinstance(value, (int, float)):
            number = float(value)
        else:
            raise ValueError(f"{shown(value)} is not a percentage such as 45%")
        if not 0 < number <= 100:
            raise ValueError(f"{shown(value)} must be more than 0% and at most 100%")
        return cls(number)


class FileMode(int):
    """A permission mode written as an octal string such as ``"0750"``."""

    @classmethod
    def parse(cls, value: object) -> FileMode:
        if isinstance(value, str) and re.fullmatch(r"0?[0-7]{3,4}", value):
            mode = int(value, 8)
        else:
            raise ValueError(f"{shown(value)} is not an octal mode; quote it, e.g. \"0750\"")
        if mode > 0o7777:
            raise ValueError(f"{shown(value)} is larger than 07777")
        return cls(mode)

    def __str__(self) -> str:
        return f"{self:04o}"


class AccountName(str):
    """A user or group name (or numeric id) for engine directories."""

    @classmethod
    def parse(cls, value: object) -> AccountName:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return cls(str(value))
        text = _expect_str(value, "a user or group name")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?|[0-9]+", text):
            raise ValueError(f"{shown(text)} is not a valid user or group name")
        return cls(text)


def default_node_name() -> str:
    """This host's short name, lower-cased and reduced to the Name alphabet."""
    raw = socket.gethostname().split(".")[0].lower()
    cleaned = re.sub(r"[^a-z0-9-]", "-", raw).strip("-")[:32].strip("-")
    return cleaned or "node"

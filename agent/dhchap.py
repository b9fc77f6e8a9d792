"""DH-HMAC-CHAP secrets (NVMe in-band authentication): their format and their files.

A secret is the NVMe representation ``DHHC-1:<hh>:<base64(key || crc32(key))>:`` that
nvme-cli (``gen-dhchap-key``) and the kernel use: ``hh`` is the transform of the key
(00 none, 01 SHA-256, 02 SHA-384, 03 SHA-512; the kernel transforms it with the host
NQN), the key is 32, 48 or 64 random bytes and the CRC-32 is little-endian. The kernel's
target stores whatever it is given (``DHHC-1:00:AAAA:`` is accepted by nvmet and
only fails at the first connect), so kvagent checks every secret itself.

Secrets live in files, never in the config: one secret per file, owned by root (or
the user kvagent runs as), no group or other permission bits, not a symlink. Nothing
here returns a secret in an error message; :func:`fingerprint` names a secret without
revealing it (both hosts' fingerprints match when they hold the same secret).
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import os
import re
import stat
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from . import effects
from .errors import KvagentError

#: Transform id -> (name, key length it needs; None: 32, 48 or 64).
TRANSFORMS: dict[int, tuple[str, int | None]] = {
    0: ("none", None), 1: ("sha256", 32), 2: ("sha384", 48), 3: ("sha512", 64)}
KEY_LENGTHS = (32, 48, 64)
PREFIX = "DHHC-1:"


@dataclass(frozen=True, repr=False)
class Secret:
    """One DH-HMAC-CHAP secret. ``repr``/``str`` never show it; :attr:`text` does."""

    text: str

    def __repr__(self) -> str:
        return f"Secret(<{fingerprint(self.text)}>)"

    __str__ = __repr__

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.text)


#: A DH-HMAC-CHAP secret or a TLS PSK (agent.tlspsk) written out, wherever it appears.
_SECRET_TEXT = re.compile(r"(?:DHHC-1|NVMeTLSkey-1):[^\s'\",]*")


def redact(text: str) -> str:
    """``text`` with every DH-HMAC-CHAP secret and TLS PSK in it replaced by
    ``<secret>``: for messages that echo what a user gave (a config value) where a
    secret may have been pasted by mistake."""
    return _SECRET_TEXT.sub("<secret>", text)


def fingerprint(text: str) -> str:
    """A short, one-way name for a secret (16 hex digits of its SHA-256)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def decode(text: str, prefix: str, form: str) -> tuple[str, bytes, bool] | str:
    """``(hh, key, crc_ok)`` of an NVMe key text ``<prefix><hh>:<base64(key ||
    crc32(key))>:`` (DH-HMAC-CHAP secrets, TLS PSKs), or what is wrong with its form
    (never the key). Callers check ``hh`` and the key's length before ``crc_ok``."""
    if not text.startswith(prefix) or not text.endswith(":") or text.count(":") != 3:
        return f"is not a {form}"
    _, hh, b64, _ = text.split(":")
    try:
        blob = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return "has a key that is not valid base64"
    key, crc = blob[:-4], blob[-4:]
    return hh, key, zlib.crc32(key).to_bytes(4, "little") == crc


def encode(prefix: str, hh: int, key: bytes) -> str:
    """The NVMe key text of ``key`` (see :func:`decode`)."""
    blob = key + zlib.crc32(key).to_bytes(4, "little")
    return f"{prefix}{hh:02d}:{base64.b64encode(blob).decode()}:"


def secret_problem(text: str) -> str | None:
    """What is wrong with ``text`` as a secret (the secret itself never appears), or None."""
    parsed = decode(text, PREFIX, "DH-HMAC-CHAP secret (DHHC-1:<hh>:<base64>:)")
    if isinstance(parsed, str):
        return parsed
    hh, key, crc_ok = parsed
    if len(hh) != 2 or not hh.isdigit() or int(hh) not in TRANSFORMS:
        return f"has transform {hh!r}; expected 00, 01, 02 or 03"
    if len(key) not in KEY_LENGTHS:
        return f"has a {len(key)}-byte key; expected 32, 48 or 64 bytes"
    name, needed = TRANSFORMS[int(hh)]
    if needed is not None and len(key) != needed:
        return f"has a {len(key)}-byte key; transform {hh} ({name}) needs {needed} bytes"
    if not crc_ok:
        return "fails its CRC check (copied incompletely?)"
    return None


def generate(transform: int = 0, length: int = 32) -> Secret:
    """A new random secret (what ``nvme gen-dhchap-key`` makes)."""
    if transform not in TRANSFORMS:
        raise ValueError(f"transform must be one of {sorted(TRANSFORMS)}")
    needed = TRANSFORMS[transform][1]
    if length not in KEY_LENGTHS or (needed is not None and length != needed):
        raise ValueError(f"a {length}-byte key does not fit transform {transform:02d}")
    return Secret(encode(PREFIX, transform, os.urandom(length)))


def _file_problem(path: str, st: os.stat_result) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid not in (0, os.geteuid()):
        return f"is owned by uid {st.st_uid}; a secret file must belong to root"
    if st.st_mode & 0o077:
        return (f"has mode {stat.S_IMODE(st.st_mode):04o}; a secret file must not be "
                f"readable by group or others (chmod 600 {path})")
    return None


def read_secret(path: str) -> Secret:
    """The secret in ``path``, checked (file and format); :class:`KvagentError` naming
    the file and what is wrong, never the secret."""
    return read_secret_file(path, secret_problem)


def read_secret_file(path: str, problem_of: Callable[[str], str | None]) -> Secret:
    """The secret in ``path``: the file checked (regular, root's, mode 0600, not a
    symlink) and its text by ``problem_of``; errors name the file, never the secret."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise KvagentError(f"secret file {path} does not exist",
                           "make one with kvagent keys generate") from None
    except OSError as exc:
        why = "is a symlink" if exc.errno == errno.ELOOP else exc.strerror
        raise KvagentError(f"secret file {path} cannot be read: {why}",
                           "give the file itself, owned by root, mode 0600") from None
    try:
        problem = _file_problem(path, os.fstat(fd))
        if problem is not None:
            raise KvagentError(f"secret file {path} {problem}")
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        text = ""
    problem = problem_of(text)
    if problem is not None:
        raise KvagentError(f"secret file {path} {problem}",
                           "make one with kvagent keys generate, or copy the whole line")
    return Secret(text)


def secret_file_problem(path: str) -> str | None:
    """:func:`read_secret`'s complaint about ``path`` as one line, or None."""
    try:
        read_secret(path)
    except KvagentError as exc:
        return exc.message.replace(f"secret file {path} ", "", 1)
    return None


def write_secret(path: str, secret: Secret, *, replace: bool = False) -> None:
    """Write ``secret`` to ``path`` (mode 0600, fsynced, renamed into place); an existing
    file is kept unless ``replace`` (a rotation)."""
    if not replace and os.path.lexists(path):
        raise KvagentError(f"{path} exists; kvagent keys generate never overwrites a "
                           "secret", "give --replace to rotate it, or another path")
    effects.write_file(path, secret.text + "\n", 0o600, kind="secret.write")

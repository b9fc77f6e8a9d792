"""NVMe Qualified Name (NQN) validation.

The kernel accepts any string as a subsystem or host directory name, so callers
validate NQNs before a name becomes a configfs path.
"""

from __future__ import annotations

import re

NQN_MAX_BYTES = 223
DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery"
#: The host NQN that many distribution images ship; clones then share it.
WELL_KNOWN_DEFAULT_HOSTNQNS = frozenset(
    {
        "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000000",
    }
)

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = rf"{_LABEL}(?:\.{_LABEL})*"
_DATE = r"(?P<year>\d{4})-(?P<month>\d{2})"
_PREFIX_RE = re.compile(rf"^nqn\.{_DATE}\.(?P<domain>{_DOMAIN})(?P<rest>:.*)?$")
_UUID_NQN_RE = re.compile(
    r"^nqn\.2014-08\.org\.nvmexpress:uuid:"
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)


class InvalidNQN(ValueError):
    """An NQN that the NVMe specification (or kvagent's rules) does not allow."""


def _check_common(nqn: str) -> None:
    if not isinstance(nqn, str):
        raise InvalidNQN(f"must be a string, got {type(nqn).__name__}")
    if not nqn:
        raise InvalidNQN("must not be empty")
    size = len(nqn.encode("utf-8"))
    if size > NQN_MAX_BYTES:
        raise InvalidNQN(f"is {size} bytes long; an NQN is at most {NQN_MAX_BYTES} bytes")
    if "/" in nqn:
        raise InvalidNQN("must not contain '/'")
    if "," in nqn or "=" in nqn:
        raise InvalidNQN("must not contain ',' or '=' (they separate the options of the "
                         "kernel's connect request)")
    if nqn.isprintable() and " " not in nqn:
        return  # neither whitespace nor control characters (one C call, not one per char)
    if any(ch.isspace() for ch in nqn):
        raise InvalidNQN("must not contain whitespace")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in nqn):
        raise InvalidNQN("must not contain control characters")


def _check_date(m: re.Match[str]) -> None:
    month = int(m.group("month"))
    if not 1 <= month <= 12:
        raise InvalidNQN(f"has month {m.group('month')}; expected nqn.yyyy-mm with mm in 01..12")


def validate_nqn(nqn: str) -> str:
    """Return ``nqn`` if it is a valid NQN, else raise :class:`InvalidNQN` saying why.

    Accepted forms: ``nqn.yyyy-mm.reverse.domain:anything`` (no '/', no
    whitespace, at most 223 bytes), ``nqn.2014-08.org.nvmexpress:uuid:<uuid>``
    and the well-known discovery NQN.
    """
    _check_common(nqn)
    if nqn == DISCOVERY_NQN:
        return nqn
    if nqn.startswith("nqn.2014-08.org.nvmexpress:uuid:"):
        if not _UUID_NQN_RE.match(nqn):
            raise InvalidNQN("has a malformed uuid after 'nqn.2014-08.org.nvmexpress:uuid:'")
        return nqn
    m = _PREFIX_RE.match(nqn)
    if not m:
        raise InvalidNQN("must look like nqn.yyyy-mm.reverse.domain:identifier")
    _check_date(m)
    rest = m.group("rest")
    if not rest or rest == ":":
        raise InvalidNQN("needs an identifier after the domain (nqn.yyyy-mm.domain:identifier)")
    return nqn


def validate_nqn_prefix(prefix: str) -> str:
    """Validate an NQN prefix such as ``nqn.2026-11.io.kvagent`` (an NQN without identifier)."""
    _check_common(prefix)
    m = _PREFIX_RE.match(prefix)
    if not m:
        raise InvalidNQN("must look like nqn.yyyy-mm.reverse.domain")
    _check_date(m)
    if prefix.endswith(":"):
        raise InvalidNQN("must not end with ':' (kvagent adds the separators)")
    return prefix


def is_valid_nqn(nqn: str) -> bool:
    """True when :func:`validate_nqn` accepts ``nqn``."""
    try:
        validate_nqn(nqn)
    except InvalidNQN:
        return False
    return True

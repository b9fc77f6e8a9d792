"""NVMe/TCP TLS pre-shared keys: their format, their files and their identities.

A configured PSK is the NVMe "PSK interchange format" ``NVMeTLSkey-1:<hh>:<base64(key ||
crc32(key))>:`` that nvme-cli (``gen-tls-key``) reads: ``hh`` is the hash the retained
PSK is derived with (01 SHA-256 with a 32-byte key, 02 SHA-384 with 48 bytes), the
CRC-32 little-endian. Both hosts derive the retained PSK from it and the host NQN
(nvme-cli ``check-tls-key --insert``) and keep it in the kernel's ``.nvme`` keyring
under the identity ``NVMe0R<hh> <hostnqn> <subsysnqn>``, which is what the kernel looks
up for a TLS connect and what tlshd looks up for the handshake.

PSK files follow the rules of DH-HMAC-CHAP secret files (:mod:`agent.dhchap`): one per
file, root's, mode 0600, never shown (:attr:`~agent.dhchap.Secret.fingerprint` names it).
"""

from __future__ import annotations

import os

from .dhchap import Secret, decode, encode, read_secret_file

PREFIX = "NVMeTLSkey-1:"
#: Hash id -> (name, key length).
HASHES: dict[int, tuple[str, int]] = {1: ("sha256", 32), 2: ("sha384", 48)}


def psk_problem(text: str) -> str | None:
    """What is wrong with ``text`` as a configured PSK (never showing it), or None."""
    parsed = decode(text, PREFIX, "TLS PSK (NVMeTLSkey-1:<hh>:<base64>:)")
    if isinstance(parsed, str):
        return parsed
    hh, key, crc_ok = parsed
    if len(hh) != 2 or not hh.isdigit() or int(hh) not in HASHES:
        return f"has hash {hh!r}; expected 01 (SHA-256) or 02 (SHA-384)"
    name, needed = HASHES[int(hh)]
    if len(key) != needed:
        return f"has a {len(key)}-byte key; hash {hh} ({name}) needs {needed} bytes"
    if not crc_ok:
        return "fails its CRC check (copied incompletely?)"
    return None


def generate_psk(hash_id: int = 1) -> Secret:
    """A new random configured PSK (what ``nvme gen-tls-key`` makes)."""
    if hash_id not in HASHES:
        raise ValueError(f"hash must be one of {sorted(HASHES)}")
    return Secret(encode(PREFIX, hash_id, os.urandom(HASHES[hash_id][1])))


def read_psk(path: str) -> Secret:
    """The PSK in ``path``, checked (file and format)."""
    return read_secret_file(path, psk_problem)


def psk_hash(psk: Secret) -> int:
    """The hash id of a checked PSK."""
    return int(psk.text.split(":")[1])


def identity(psk: Secret, hostnqn: str, subsysnqn: str) -> str:
    """The keyring description of the retained PSK for ``hostnqn`` and ``subsysnqn``."""
    return f"NVMe0R{psk_hash(psk):02d} {hostnqn} {subsysnqn}"

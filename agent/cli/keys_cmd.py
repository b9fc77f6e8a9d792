"""``kvagent keys``: DH-HMAC-CHAP secrets and TLS PSKs (make, check), never printed."""

from __future__ import annotations

import os
from typing import Any

import click

from ..dhchap import TRANSFORMS, generate, read_secret, write_secret
from ..errors import KvagentError, UsageError
from ..tlspsk import HASHES, PREFIX, generate_psk, psk_hash, read_psk
from .output import emit

_HMAC = {name: number for number, (name, _) in TRANSFORMS.items()}


@click.group("keys")
def keys_group() -> None:
    """DH-HMAC-CHAP secrets (NVMe in-band authentication) and TLS pre-shared keys.

    A secret goes in a file of its own (root's, mode 0600) that the config names: the
    storage host's target.pools[].hosts[].auth.key_file and the GPU host's
    initiator.pools[].auth.key_file hold the same secret (hosts[].tls.key_file and
    initiator.pools[].tls.key_file the same PSK). Secrets are never printed; a
    fingerprint (16 hex digits of a SHA-256) tells whether two files hold the same one.
    """


def _is_psk(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(PREFIX)) == PREFIX.encode()
    except OSError:
        return False  # read_secret says what is wrong


def _info(path: str) -> dict[str, Any]:
    try:
        if _is_psk(path):
            psk = read_psk(path)
            return {"file": os.path.abspath(path), "fingerprint": psk.fingerprint,
                    "kind": "tls-psk", "hmac": HASHES[psk_hash(psk)][0]}
        secret = read_secret(path)
    except KvagentError as exc:  # the file given is bad input: exit 2
        raise UsageError(f"FILE: {exc.message}", exc.hint) from None
    transform = int(secret.text.split(":")[1])
    return {"file": os.path.abspath(path), "fingerprint": secret.fingerprint,
            "kind": "dhchap", "hmac": TRANSFORMS[transform][0]}


def _text(d: dict[str, Any]) -> str:
    what = "TLS PSK" if d["kind"] == "tls-psk" else "secret"
    verb = {"generated": f"wrote a new {what} to",
            "replaced": f"wrote a new {what} over"}.get(d.get("action", ""), "")
    head = f"{verb} {d['file']}" if verb else f"{d['file']} ({what})"
    how = "hash" if d["kind"] == "tls-psk" else "transform"
    return f"{head} (fingerprint {d['fingerprint']}, {how} {d['hmac']})"


@keys_group.command("generate")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--tls", "tls", is_flag=True,
              help="A TLS pre-shared key (NVMeTLSkey-1, for tls.key_file) instead of a "
                   "DH-HMAC-CHAP secret.")
@click.option("--hmac", "hmac_name", type=click.Choice(list(_HMAC)), default=None,
              help="DH-HMAC-CHAP: transform of the key (the kernel hashes it with the host "
                   "NQN; default none). TLS: hash of the retained key, sha256 (default, "
                   "32-byte key) or sha384 (48).")
@click.option("--length", type=click.Choice(["32", "48", "64"]), default=None,
              help="Key length in bytes (default: 32; sha384 needs 48, sha512 64).")
@click.option("--replace", is_flag=True,
              help="Overwrite an existing file (a rotation: apply on the storage host "
                   "first, then on the GPU host; one secret at a time keeps "
                   "controllers live).")
def generate_cmd(file: str, tls: bool, hmac_name: str | None, length: str | None,
                 replace: bool) -> None:
    """Write a new random secret (or TLS PSK) to FILE (mode 0600); print its fingerprint.

    Never overwrites FILE unless --replace. Copy FILE to the other host over a channel
    you trust (e.g. Ansible's copy with mode 0600), never through the config.
    """
    if tls:
        hashes = {name: number for number, (name, _) in HASHES.items()}
        if (hmac_name or "sha256") not in hashes:
            raise UsageError(f"--hmac {hmac_name}: a TLS PSK's hash is sha256 or sha384")
        if length is not None:
            raise UsageError("--length: a TLS PSK's length follows its hash (--hmac)")
        made = generate_psk(hashes[hmac_name or "sha256"])
    else:
        transform = _HMAC[hmac_name or "none"]
        needed = TRANSFORMS[transform][1]
        size = int(length) if length else (needed or 32)
        if needed is not None and size != needed:
            raise UsageError(f"--length {size}: --hmac {hmac_name} needs a {needed}-byte key")
        made = generate(transform, size)
    directory = os.path.dirname(os.path.abspath(file))
    if not os.path.isdir(directory):
        raise UsageError(f"FILE: directory {directory} does not exist",
                         f"create it first, owned by root (mkdir -m 700 {directory})")
    existed = os.path.lexists(file)
    if existed and not replace:
        raise UsageError(f"FILE: {file} exists; kvagent keys generate never overwrites a "
                         "secret", "give --replace to rotate it, or another path")
    write_secret(file, made, replace=replace)
    emit({**_info(file), "action": "replaced" if existed else "generated"}, _text)


@keys_group.command("show")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def show_cmd(files: tuple[str, ...]) -> None:
    """Check FILES (format, CRC, owner, mode) and print each one's fingerprint."""
    infos = [_info(f) for f in files]
    emit(infos[0] if len(infos) == 1 else {"keys": infos},
         lambda d: "\n".join(_text(i) for i in d.get("keys", [d])))

"""``kvagent keys``: DH-HMAC-CHAP secrets (make, check), never printed."""

from __future__ import annotations

import os
from typing import Any

import click

from ..dhchap import TRANSFORMS, generate, read_secret, write_secret
from ..errors import KvagentError, UsageError
from .output import emit

_HMAC = {name: number for number, (name, _) in TRANSFORMS.items()}


@click.group("keys")
def keys_group() -> None:
    """DH-HMAC-CHAP secrets for NVMe in-band authentication.

    A secret goes in a file of its own (root's, mode 0600) that the config names: the
    storage host's target.pools[].hosts[].auth.key_file and the GPU host's
    initiator.pools[].auth.key_file hold the same secret. Secrets are never printed;
    a fingerprint (16 hex digits of a SHA-256) tells whether two files hold the same one.
    """


def _info(path: str) -> dict[str, Any]:
    try:
        secret = read_secret(path)
    except KvagentError as exc:  # the file given is bad input: exit 2
        raise UsageError(f"FILE: {exc.message}", exc.hint) from None
    transform = int(secret.text.split(":")[1])
    return {"file": os.path.abspath(path), "fingerprint": secret.fingerprint,
            "hmac": TRANSFORMS[transform][0]}


def _text(d: dict[str, Any]) -> str:
    verb = {"generated": "wrote a new secret to", "replaced": "wrote a new secret over"}.get(
        d.get("action", ""), "")
    head = f"{verb} {d['file']}" if verb else d["file"]
    return f"{head} (fingerprint {d['fingerprint']}, transform {d['hmac']})"


@keys_group.command("generate")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--hmac", "hmac_name", type=click.Choice(list(_HMAC)), default="none",
              show_default=True,
              help="Transform of the key (the kernel hashes it with the host NQN).")
@click.option("--length", type=click.Choice(["32", "48", "64"]), default=None,
              help="Key length in bytes (default: 32; sha384 needs 48, sha512 64).")
@click.option("--replace", is_flag=True,
              help="Overwrite an existing file (a rotation: apply on the storage host "
                   "first, then on the GPU host; one secret at a time keeps "
                   "controllers live).")
def generate_cmd(file: str, hmac_name: str, length: str | None, replace: bool) -> None:
    """Write a new random secret to FILE (mode 0600); print its fingerprint.

    Never overwrites FILE unless --replace. Copy FILE to the other host over a channel
    you trust (e.g. Ansible's copy with mode 0600), never through the config.
    """
    transform = _HMAC[hmac_name]
    needed = TRANSFORMS[transform][1]
    size = int(length) if length else (needed or 32)
    if needed is not None and size != needed:
        raise UsageError(f"--length {size}: --hmac {hmac_name} needs a {needed}-byte key")
    directory = os.path.dirname(os.path.abspath(file))
    if not os.path.isdir(directory):
        raise UsageError(f"FILE: directory {directory} does not exist",
                         f"create it first, owned by root (mkdir -m 700 {directory})")
    existed = os.path.lexists(file)
    if existed and not replace:
        raise UsageError(f"FILE: {file} exists; kvagent keys generate never overwrites a "
                         "secret", "give --replace to rotate it, or another path")
    write_secret(file, generate(transform, size), replace=replace)
    emit({**_info(file), "action": "replaced" if existed else "generated"}, _text)


@keys_group.command("show")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def show_cmd(files: tuple[str, ...]) -> None:
    """Check FILES (format, CRC, owner, mode) and print each one's fingerprint."""
    infos = [_info(f) for f in files]
    emit(infos[0] if len(infos) == 1 else {"keys": infos},
         lambda d: "\n".join(_text(i) for i in d.get("keys", [d])))

"""TLS PSKs in the kernel's ``.nvme`` keyring, and the TLS handshake daemon.

For a TLS connection both hosts need the retained PSK for (host NQN, subsystem NQN) in
their ``.nvme`` keyring (the kernel looks it up for a connect; tlshd for the
handshake), and tlshd (ktls-utils) running. nvme-cli derives and inserts the key
(``check-tls-key --insert``); kvagent records which PSK (by fingerprint) it inserted
under each identity, so a converged pass runs nothing, a rotated PSK file is inserted
again, and a key that vanished (a reboot: keyrings live in memory) is put back.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..dhchap import Secret
from ..errors import KvagentError
from ..state import read_json, write_json
from ..tlspsk import identity
from .run import CommandError, Runner

#: Where the kernel lists keys, and processes (module globals: tests point them elsewhere).
PROC_KEYS = "/proc/keys"
PROC = "/proc"
#: The well-known discovery subsystem: discovery on a TLS port is TLS too.
RECORD = "tls-psks.json"


def psk_descriptions() -> set[str]:
    """Descriptions of the ``psk`` keys this process can see."""
    try:
        lines = Path(PROC_KEYS).read_text().splitlines()
    except OSError:
        return set()
    out = set()
    for line in lines:
        fields = line.split(None, 8)
        if len(fields) == 9 and fields[7] == "psk":
            out.add(fields[8].rsplit(": ", 1)[0])
    return out


def tlshd_running() -> bool:
    """Whether tlshd runs: a process named tlshd, or one whose first arguments run it
    (a tlshd started through a dynamic loader, ``ld-linux… /usr/sbin/tlshd``)."""
    for pid in os.listdir(PROC):
        if pid.isdigit():
            try:
                if Path(PROC, pid, "comm").read_text().strip() == "tlshd":
                    return True
                args = Path(PROC, pid, "cmdline").read_bytes().split(b"\0")[:4]
            except OSError:
                continue
            if any(os.path.basename(a) == b"tlshd" for a in args):
                return True
    return False


TLSHD_HINT = ("install ktls-utils and start tlshd (systemctl enable --now tlshd) with "
              "keyrings=.nvme under [authenticate] in /etc/tlshd.conf")


class PskKeyring:
    """The PSKs kvagent put in the ``.nvme`` keyring (records under ``state_dir``)."""

    def __init__(self, runner: Runner, state_dir: str):
        self.runner = runner
        self.record = Path(state_dir) / RECORD

    def missing(self, psk: Secret, hostnqn: str, subsysnqn: str) -> bool:
        """Whether the keyring lacks this PSK for ``hostnqn`` and ``subsysnqn``."""
        ident = identity(psk, hostnqn, subsysnqn)
        recorded = read_json(self.record, {}).get(ident)
        return recorded != psk.fingerprint or ident not in psk_descriptions()

    def insert(self, psk: Secret, hostnqn: str, subsysnqn: str) -> None:
        """Derive the retained PSK and put it in the keyring (nvme-cli), then record it."""
        argv = ["nvme", "check-tls-key", "--hostnqn", hostnqn, "--subsysnqn", subsysnqn,
                "--keydata", psk.text, "--identity", "0", "--insert"]
        try:
            self.runner(argv, timeout=30)
        except CommandError as exc:
            text = (exc.result.stderr + exc.result.stdout).lower()
            if "unrecognized" in text or "invalid option" in text or "unknown" in text:
                raise KvagentError(
                    "this host's nvme-cli cannot put TLS keys in the kernel keyring (no "
                    "check-tls-key --insert)",
                    "NVMe/TCP TLS needs nvme-cli 2.4 or later (Debian 13 has 2.13; "
                    "Debian 12's 2.3 has neither this nor connect --tls)") from None
            raise KvagentError(f"nvme check-tls-key could not insert the TLS PSK for "
                               f"{hostnqn} and {subsysnqn}: {exc.message}",
                               "check that the kernel has NVMe TLS (CONFIG_NVME_TCP_TLS or "
                               "CONFIG_NVME_TARGET_TCP_TLS: the .nvme keyring in "
                               "/proc/keys)") from None
        ident = identity(psk, hostnqn, subsysnqn)
        records = read_json(self.record, {})
        if records.get(ident) != psk.fingerprint:
            write_json(self.record, {**records, ident: psk.fingerprint})

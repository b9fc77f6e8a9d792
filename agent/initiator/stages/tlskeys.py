"""A pool's TLS pre-shared key in the ``.nvme`` keyring before a TLS discover or connect
(both :mod:`.discover` and :mod:`.connect` need it), and tlshd for the handshake."""

from __future__ import annotations

from ...config.model import InitiatorPool
from ...errors import KvagentError
from ...system.keyring import TLSHD_HINT, PskKeyring, tlshd_running
from ...tlspsk import read_psk
from .context import StageContext


def ensure_psk(ctx: StageContext, pool: InitiatorPool, hostnqn: str, subsysnqn: str) -> None:
    """The pool's TLS PSK in the ``.nvme`` keyring for ``subsysnqn`` (inserted where
    missing or rotated); tlshd must run for the handshake."""
    assert pool.tls is not None
    if not tlshd_running():
        raise KvagentError(f"pool {pool.name} connects with TLS, but tlshd (the TLS "
                           "handshake daemon) is not running", TLSHD_HINT)
    psk = read_psk(pool.tls.key_file)
    keyring = PskKeyring(ctx.runner, ctx.cfg.node.state_dir)
    if keyring.missing(psk, hostnqn, subsysnqn):
        if not ctx.dry_run:
            keyring.insert(psk, hostnqn, subsysnqn)
        ctx.act(pool.name, "tls-psk", f"{hostnqn} {subsysnqn}",
                f"TLS PSK {psk.fingerprint} into the .nvme keyring")

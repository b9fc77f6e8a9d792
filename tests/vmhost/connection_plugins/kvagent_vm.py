"""Ansible connection plugin: tasks run in the kvagent test VM, the controller on the host.

Through the VM's shared directory (tests/vmhost/vm_channel.py), named by the
``KVAGENT_VM_CHANNEL`` environment variable (the scripts/vm --out directory). Only the
modules run under TCG; templating, lookups and the controller's own start run natively.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.plugins.connection import ConnectionBase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vm_channel import Channel, ChannelError

DOCUMENTATION = """
    name: kvagent_vm
    short_description: run tasks in the kvagent test VM through its shared directory
    description:
        - Commands run as root in the guest of scripts/vm whose command is
          tests/vmhost/vm_channel.py serve.
    author: kvagent
    options:
        channel:
            description: The VM's scripts/vm --out directory.
            env:
                - name: KVAGENT_VM_CHANNEL
    extends_documentation_fragment:
        - connection_pipelining
"""


class Connection(ConnectionBase):
    """One guest, one request at a time."""

    transport = "kvagent_vm"
    has_pipelining = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._chan: Channel | None = None

    def _connect(self) -> Connection:
        if not self._connected:
            self._chan = Channel(Path(self.get_option("channel")))
            self._connected = True
        return self

    def exec_command(self, cmd: str, in_data: bytes | None = None,
                     sudoable: bool = True) -> tuple[int, bytes, bytes]:
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        try:
            return self._chan.run(cmd, stdin=in_data or b"")
        except ChannelError as exc:
            raise AnsibleConnectionFailure(str(exc)) from exc

    def put_file(self, in_path: str, out_path: str) -> None:
        super().put_file(in_path, out_path)
        try:
            self._chan.put(in_path, out_path)
        except ChannelError as exc:
            raise AnsibleError(f"put {in_path} -> {out_path}: {exc}") from exc

    def fetch_file(self, in_path: str, out_path: str) -> None:
        super().fetch_file(in_path, out_path)
        try:
            self._chan.fetch(in_path, out_path)
        except ChannelError as exc:
            raise AnsibleError(f"fetch {in_path} -> {out_path}: {exc}") from exc

    def close(self) -> None:
        self._connected = False

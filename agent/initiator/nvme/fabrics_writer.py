"""Write NVMe-oF connect options to ``/dev/nvme-fabrics`` and print the kernel's answer.

Run as a command (:func:`agent.initiator.nvme.options.fabrics_write_command`), never imported:
``python -I -S fabrics_writer.py DEVICE`` with the options on stdin (never on the command
line: they hold secrets). The write blocks until the kernel has connected or failed; as a
command it gets a time limit and SIGTERM like any other, and a write stuck in the kernel
is left behind in this process, not in the agent. Exit 0 with ``instance=N,cntlid=M`` on
stdout, or 3 with ``errno N: text`` on stderr. Standard library only (starts in
milliseconds, whatever is installed).
"""

import os
import sys


def main() -> int:
    """Write stdin to the device named by the first argument; print its answer."""
    options = sys.stdin.buffer.read()
    try:
        fd = os.open(sys.argv[1], os.O_RDWR)
        try:
            os.write(fd, options)
            sys.stdout.write(os.read(fd, 4096).decode(errors="replace"))
        finally:
            os.close(fd)
    except OSError as exc:
        sys.stderr.write(f"errno {exc.errno}: {exc.strerror}\n")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())

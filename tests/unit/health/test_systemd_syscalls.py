"""The unit's SystemCallFilter lets every system call kvagent makes through.

On systemd 252 ``quotactl_fd`` is in ``@privileged`` only: under ``SystemCallFilter=
@system-service @mount @module`` the engines' project quotas got EPERM (reported as a
missing privilege) and their caps stayed advisory on every host run by systemd. These
tests expand the unit's filter with systemd's own tables (``systemd-analyze
syscall-filter``; tests/syscallfilter.py) and check

- every call kvagent declares beside the code that makes it (``SYSCALLS`` in the
  modules that use ctypes, ioctl, flock, mmap or netlink, or run mount(8)/modprobe);
- that every module doing such things declares them;
- every system call behind the Python wrappers kvagent calls (``os.open`` → ``openat``,
  ...; pathlib, ``open()`` and io use the same ones), mapped here once;
- what the unit says it refuses stays refused, and ProtectClock= is set with no device
  allow-list of the unit's own (its protections hold without it too).

They FAIL (never skip) without systemd-analyze. The real-kernel proof (the quota calls
on an xfs under a seccomp filter built from the same list): tests/kernel/
test_unit_seccomp.py.
"""

from __future__ import annotations

import ast
import re

from tests.syscallfilter import UNIT, allowed_by, declared, expand, modules

#: System calls behind the Python calls kvagent makes (Python 3.10-3.13 on glibc; where
#: glibc or Python picks one of several, all are listed). The scan below fails on a call
#: of these modules that is not listed here or in NO_SYSCALL.
WRAPPERS: dict[str, tuple[str, ...]] = {
    "os._exit": ("exit_group",),
    "os.access": ("faccessat", "faccessat2", "access"),
    "os.chdir": ("chdir",),
    "os.chmod": ("fchmodat", "chmod"),
    "os.chown": ("fchownat", "chown", "lchown"),
    "os.close": ("close",),
    "os.closerange": ("close_range", "close"),
    "os.cpu_count": ("sched_getaffinity",),
    "os.dup": ("dup",),
    "os.dup2": ("dup2", "dup3"),
    "os.fchdir": ("fchdir",),
    "os.fchmod": ("fchmod",),
    "os.fchown": ("fchown",),
    "os.fdatasync": ("fdatasync",),
    "os.fdopen": ("fstat", "newfstatat", "ioctl", "lseek", "fcntl"),
    "os.fstat": ("fstat", "newfstatat", "statx"),
    "os.fstatvfs": ("fstatfs",),
    "os.fsync": ("fsync",),
    "os.ftruncate": ("ftruncate",),
    "os.get_blocking": ("fcntl",),
    "os.get_terminal_size": ("ioctl",),
    "os.getgrouplist": ("openat", "read", "close", "fstat", "newfstatat", "socket",
                        "connect"),
    "os.getcwd": ("getcwd",),
    "os.getegid": ("getegid",),
    "os.geteuid": ("geteuid",),
    "os.getgid": ("getgid",),
    "os.getpgid": ("getpgid",),
    "os.getpid": ("getpid",),
    "os.getppid": ("getppid",),
    "os.getuid": ("getuid",),
    "os.isatty": ("ioctl",),
    "os.waitid": ("waitid",),
    "os.kill": ("kill",),
    "os.killpg": ("kill",),
    "os.lchown": ("fchownat", "lchown"),
    "os.link": ("linkat", "link"),
    "os.listdir": ("openat", "getdents64", "fstat", "newfstatat", "close"),
    "os.lseek": ("lseek",),
    "os.lstat": ("newfstatat", "lstat", "statx"),
    "os.makedirs": ("mkdirat", "mkdir", "newfstatat", "stat", "statx"),
    "os.mkdir": ("mkdirat", "mkdir"),
    "os.mkfifo": ("mknodat", "mknod"),
    "os.open": ("openat", "open"),
    "os.path": ("newfstatat", "stat", "lstat", "statx", "readlinkat", "readlink", "getcwd"),
    "os.pipe": ("pipe2", "pipe"),
    "os.pipe2": ("pipe2",),
    "os.posix_fallocate": ("fallocate",),
    "os.pread": ("pread64",),
    "os.preadv": ("preadv", "preadv2"),
    "os.pwrite": ("pwrite64",),
    "os.pwritev": ("pwritev", "pwritev2"),
    "os.read": ("read",),
    "os.readlink": ("readlinkat", "readlink"),
    "os.remove": ("unlinkat", "unlink"),
    "os.rename": ("renameat2", "renameat", "rename"),
    "os.replace": ("renameat2", "renameat", "rename"),
    "os.rmdir": ("unlinkat", "rmdir"),
    "os.scandir": ("openat", "getdents64", "fstat", "newfstatat", "close"),
    "os.set_blocking": ("fcntl",),
    "os.set_inheritable": ("ioctl", "fcntl"),
    "os.setpgid": ("setpgid",),
    "os.setsid": ("setsid",),
    "os.stat": ("newfstatat", "stat", "statx"),
    "os.statvfs": ("statfs",),
    "os.symlink": ("symlinkat", "symlink"),
    "os.sync": ("sync",),
    "os.truncate": ("truncate",),
    "os.umask": ("umask",),
    "os.uname": ("uname",),
    "os.unlink": ("unlinkat", "unlink"),
    "os.urandom": ("getrandom",),
    "os.utime": ("utimensat",),
    "os.waitpid": ("wait4",),
    "os.walk": ("openat", "getdents64", "fstat", "newfstatat", "close"),
    "os.write": ("write",),
    "fcntl.fcntl": ("fcntl",),
    "fcntl.flock": ("flock",),
    "fcntl.ioctl": ("ioctl",),
    "mmap.mmap": ("mmap", "munmap"),
    "select.poll": ("poll", "ppoll"),
    "select.select": ("select", "pselect6"),
    "selectors.DefaultSelector": ("epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait"),
    "shutil.copyfile": ("openat", "sendfile", "copy_file_range", "read", "write"),
    "shutil.disk_usage": ("statfs",),
    "shutil.rmtree": ("openat", "getdents64", "newfstatat", "unlinkat", "close"),
    "shutil.which": ("faccessat", "faccessat2", "newfstatat"),
    "signal.pthread_sigmask": ("rt_sigprocmask",),
    "signal.signal": ("rt_sigaction",),
    "socket.create_server": ("socket", "setsockopt", "bind", "listen"),
    "socket.gethostname": ("uname",),
    "socket.socket": ("socket", "bind", "listen", "accept4", "connect", "setsockopt",
                      "getsockopt", "getsockname", "getpeername", "recvfrom", "sendto",
                      "recvmsg", "sendmsg", "shutdown", "close"),
    "subprocess.Popen": ("clone", "clone3", "vfork", "execve", "wait4", "pipe2", "dup2",
                         "dup3", "close_range", "kill"),
    "subprocess.run": ("clone", "clone3", "vfork", "execve", "wait4", "pipe2", "dup2",
                       "dup3", "close_range", "kill"),
    "tempfile.TemporaryDirectory": ("mkdir", "getrandom", "openat", "unlinkat", "rmdir"),
    "tempfile.mkdtemp": ("mkdir", "getrandom"),
    "tempfile.mkstemp": ("openat", "getrandom"),
    "threading.BoundedSemaphore": ("futex",),
    "threading.Event": ("futex",),
    "threading.Lock": ("futex",),
    "threading.Thread": ("clone3", "clone", "futex", "set_robust_list", "rseq", "mmap",
                         "mprotect", "munmap", "madvise"),
    "time.clock_gettime_ns": ("clock_gettime",),
    "time.monotonic": ("clock_gettime",),
    "time.sleep": ("clock_nanosleep",),
    "time.time": ("clock_gettime",),
}
#: Names of these modules that make no system call (types, pure functions, data).
NO_SYSCALL = frozenset({
    "os.PathLike", "os._Environ", "os.environ", "os.fsencode", "os.fsdecode", "os.fspath",
    "os.major", "os.minor", "os.makedev", "os.pathsep", "os.sep", "os.linesep", "os.stat_result",
    "os.strerror", "os.terminal_size", "os.waitstatus_to_exitcode", "os.name", "os.devnull",
    "os.getenv", "os.error", "os.register_at_fork", "mmap.PAGESIZE", "selectors.BaseSelector",
    "selectors.SelectorKey",
    "signal.Signals", "signal.Handlers", "socket.timeout", "socket.gaierror",
    "subprocess.CompletedProcess", "subprocess.CalledProcessError", "subprocess.DEVNULL",
    "subprocess.PIPE", "subprocess.STDOUT", "subprocess.TimeoutExpired",
    "subprocess.SubprocessError", "threading.active_count", "threading.current_thread",
    "threading.get_ident", "threading.main_thread", "time.CLOCK_MONOTONIC",
    "time.perf_counter", "time.strftime", "time.gmtime", "time.localtime",
})
SCANNED = frozenset(name.split(".")[0] for name in WRAPPERS)
#: Modules whose use means calls past Python's wrappers (declared in SYSCALLS).
DIRECT_MODULES = frozenset({"ctypes", "fcntl", "mmap"})
#: Commands that make a privileged system call for kvagent (SYSCALLS of their module).
PRIVILEGED_COMMANDS = frozenset({"mount", "umount", "modprobe"})


def allowed() -> set[str]:
    return allowed_by(UNIT.read_text())


def unit_values(directive: str) -> list[str]:
    """Every value of ``directive`` in the unit, split on whitespace, in order."""
    values: list[str] = []
    for line in UNIT.read_text().splitlines():
        if line.startswith(f"{directive}="):
            values += line.split("=", 1)[1].split()
    return values


def wrapper_calls(tree: ast.Module) -> set[str]:
    """``module.name`` for each use of a name of the scanned modules (constants aside)."""
    return {f"{node.value.id}.{node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in SCANNED and not node.attr.isupper()}


def direct_calls(tree: ast.Module) -> set[str]:
    """Why a module calls the kernel past Python's wrappers (empty: it does not)."""
    why: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            why |= {f"import {a.name}" for a in node.names
                    if a.name.split(".")[0] in DIRECT_MODULES}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] \
                in DIRECT_MODULES:
            why.add(f"from {node.module} import")
        elif isinstance(node, ast.Attribute) and node.attr == "from_netlink":
            why.add("a udev netlink monitor")
        elif isinstance(node, ast.List) and len(node.elts) > 1 \
                and isinstance(node.elts[0], ast.Constant) \
                and node.elts[0].value in PRIVILEGED_COMMANDS:  # an argv
            why.add(f"runs {node.elts[0].value}")
    return why


def test_every_system_call_kvagent_declares_is_allowed_by_the_unit() -> None:
    allow, known = allowed(), expand(["@known"])
    found = declared()
    assert "quotactl_fd" in found.get("agent/system/xfsquota.py", ()), found
    unknown = {path: sorted(set(calls) - known) for path, calls in found.items()
               if set(calls) - known}
    assert not unknown, f"not system calls systemd knows (typos?): {unknown}"
    refused = {path: sorted(set(calls) - allow) for path, calls in found.items()
               if set(calls) - allow}
    assert not refused, (
        f"the unit's SystemCallFilter={' '.join(unit_values('SystemCallFilter'))} refuses "
        f"(EPERM) system calls kvagent makes: {refused}")


def test_every_module_that_calls_the_kernel_directly_declares_its_calls() -> None:
    found = declared()
    missing = {path: sorted(why) for path, tree in modules()
               if (why := direct_calls(tree)) and path not in found}
    assert not missing, ("these modules call the kernel past Python's wrappers but declare "
                         f"no SYSCALLS tuple: {missing}")
    needless = sorted(path for path, tree in modules() if path in found
                      and not direct_calls(tree))
    assert not needless, f"SYSCALLS where the scan finds no direct call: {needless}"


def test_the_system_calls_behind_python_s_wrappers_are_allowed() -> None:
    used: dict[str, set[str]] = {}
    for path, tree in modules():
        for name in wrapper_calls(tree):
            used.setdefault(name, set()).add(path)
    assert "os.open" in used and "socket.socket" in used, sorted(used)
    unmapped = {name: sorted(paths) for name, paths in used.items()
                if name not in WRAPPERS and name not in NO_SYSCALL}
    assert not unmapped, ("calls with no system calls mapped: add them to WRAPPERS (or "
                          f"NO_SYSCALL) in this test: {unmapped}")
    allow = allowed()
    refused = {name: sorted(set(WRAPPERS[name]) - allow) for name in used
               if name in WRAPPERS and set(WRAPPERS[name]) - allow}
    assert not refused, f"the unit refuses system calls behind {refused}"


def test_the_unit_refuses_what_it_says_it_refuses() -> None:
    """reboot, swap, clock, raw I/O ports, kexec, ptrace, bpf ... (the unit's comment);
    quotactl (paths), the part of @privileged nothing kvagent runs uses."""
    allow = allowed()
    for group in ("@clock", "@reboot", "@swap", "@raw-io", "@debug", "@cpu-emulation",
                  "@obsolete"):
        assert not expand([group]) & allow, f"{group}: {sorted(expand([group]) & allow)}"
    for call in ("kexec_load", "ptrace", "bpf", "ioperm", "settimeofday", "quotactl",
                 "open_by_handle_at"):
        assert call not in allow, call


def test_protect_clock_is_set_with_no_device_allow_list_of_its_own() -> None:
    """ProtectClock=yes, and no device list of the unit's own (DevicePolicy=, DeviceAllow=,
    PrivateDevices=: they would refuse device majors registered after the unit started).
    Before systemd 252 ProtectClock= implied DeviceAllow=char-rtc r, which refuses
    /dev/nvme-fabrics and block devices: the package breaks such a systemd and the role
    turns it off there (tests/unit/test_ansible.py). Its protections hold without it too:
    the clock-setting calls are outside the allow-list, CAP_SYS_TIME and CAP_WAKE_ALARM
    outside the bounding set."""
    assert unit_values("ProtectClock") == ["yes"]
    directives = {ln.split("=", 1)[0] for ln in UNIT.read_text().splitlines()
                  if ln and ln[0].isalpha() and "=" in ln}
    device_lists = {"DeviceAllow", "DevicePolicy", "PrivateDevices"}
    assert not directives & device_lists, sorted(directives & device_lists)
    assert not expand(["@clock"]) & allowed()
    caps = set(unit_values("CapabilityBoundingSet"))
    assert caps and not caps & {"CAP_SYS_TIME", "CAP_WAKE_ALARM"}, caps
    control = (UNIT.parents[1] / "debian" / "control").read_text()
    assert re.search(r"^Breaks:\s*\n?\s*systemd \(<< 252\)", control, re.M), control

"""The typed, frozen kvagent configuration model.

Each field carries its reference documentation (``metadata["doc"]``), from
which ``docs/configuration.md`` is generated and checked. Cross-field rules
live in each class' ``check()``, which yields ``(relative path, message)``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from nvmet.nqn import NQN_MAX_BYTES

from ..errors import KvagentError
from ..naming import subsystem_nqn
from .build import doc_field, duplicates
from .types import (
    NQN,
    AbsPath,
    AccountName,
    BlankDevice,
    DeviceId,
    Duration,
    FileMode,
    IPAddress,
    ListenAddress,
    Name,
    NQNPrefix,
    Percent,
    Size,
    VolumeGroupName,
    default_node_name,
)

Check = Iterator[tuple[tuple[str | int, ...], str]]

Transport = Literal["tcp", "rdma"]
AnaState = Literal["optimized", "non-optimized", "inaccessible"]
Placement = Literal["spread", "striped", "linear"]
IoPolicy = Literal["numa", "round-robin", "queue-depth"]
EngineKind = Literal["lmcache", "vllm", "dynamo", "sglang", "mooncake"]
MIB = 1024 * 1024
#: nvmet allows up to 1024 namespaces per subsystem (NVMET_MAX_NAMESPACES).
MAX_NAMESPACES = 1024
#: Default seconds before I/O on a lost path fails: two reconnect attempts at the default
#: reconnect_delay of 2 s (docs/operations.md, "Outages: fail fast, recover by itself").
FAST_IO_FAIL_TMO = 5
#: mkfs.xfs refuses devices under 300 MB.
XFS_MIN_BYTES = 300 * 1000 * 1000
#: System directories a pool's mount root must never be (mounting over one hides it).
SYSTEM_DIRECTORIES = frozenset({
    "/", "/etc", "/usr", "/boot", "/proc", "/sys", "/dev", "/run", "/var", "/bin", "/sbin",
    "/lib", "/lib64", "/home", "/root", "/tmp", "/srv", "/opt", "/mnt", "/media",
})
#: A Linux network interface name (IFNAMSIZ 16 with its NUL; no '/', ':', ',' or spaces).
IFNAME = re.compile(r"(?!\.\.?$)[A-Za-z0-9_.@-]{1,15}")
#: Kernel filesystems: no mount root anywhere under them.
KERNEL_TREES = ("/proc", "/sys", "/dev")
#: Mount options of which at most one may be given: each set's members contradict each
#: other (mount(8) takes the last one silently). Project-quota modes count as one set.
EXCLUSIVE_MOUNT_OPTIONS = (
    frozenset({"ro", "rw"}), frozenset({"sync", "async"}),
    frozenset({"atime", "noatime", "relatime", "strictatime"}),
    frozenset({"diratime", "nodiratime"}), frozenset({"dev", "nodev"}),
    frozenset({"exec", "noexec"}), frozenset({"suid", "nosuid"}),
    frozenset({"prjquota", "pquota", "pqnoenforce", "noquota"}),
)


def mount_option_problems(options: tuple[str, ...]) -> Iterator[tuple[int, str]]:
    """(index, why) for each mount option that contradicts an earlier one."""
    seen: dict[str, int] = {}
    for i, opt in enumerate(options):
        for group in EXCLUSIVE_MOUNT_OPTIONS:
            if opt not in group:
                continue
            other = next(((o, j) for o, j in seen.items() if o in group and o != opt), None)
            if other is not None and {opt, other[0]} != {"prjquota", "pquota"}:
                yield i, (f"{opt!r} contradicts {other[0]!r} (mount_options[{other[1]}]): "
                          "keep one")
        seen.setdefault(opt, i)


def system_directory_problem(path: str) -> str | None:
    """Why ``path`` (an absolute, normalised path) cannot be a mount root; None if it can."""
    if path in SYSTEM_DIRECTORIES:
        return (f"{path} is a system directory: mounting a pool over it would hide what the "
                "system keeps there; use a directory of its own, e.g. /var/lib/kvcache/POOL")
    for tree in KERNEL_TREES:
        if path.startswith(tree + "/"):
            return (f"{path} is under {tree}, a kernel filesystem: a pool cannot be mounted "
                    "there; use e.g. /var/lib/kvcache/POOL")
    return None


#: Trees of the system's own files (the kernel's filesystems, configuration, boot files,
#: the read-only /usr): nothing of kvagent's state goes at or under them.
SYSTEM_TREES = ("/proc", "/sys", "/dev", "/etc", "/boot", "/usr")
#: The standard directories of /var and /run (FHS 3.0, file-hierarchy(7)): every program
#: keeps its files below them.
HIERARCHY_DIRECTORIES = frozenset({
    "/var/backups", "/var/cache", "/var/crash", "/var/games", "/var/lib", "/var/local",
    "/var/lock", "/var/log", "/var/mail", "/var/opt", "/var/run", "/var/spool", "/var/tmp",
    "/run/lock", "/run/log", "/run/shm", "/run/systemd", "/run/user",
})


def own_directory_problem(path: str, example: str) -> str | None:
    """Why ``path`` (absolute, normalised) cannot be one of kvagent's own directories
    (``node.state_dir``, ``node.run_dir``: kvagent makes them private, root's and mode
    0700); None if it can. ``example``: a directory to suggest instead."""
    instead = f"give a directory of kvagent's own, e.g. {example}"
    for tree in SYSTEM_TREES:
        if path == tree:
            return f"{path} holds the system's own files: {instead}"
        if path.startswith(tree + "/"):
            return f"{path} is under {tree}, the system's own files: {instead}"
    parts = path.strip("/").split("/")
    what = ("the root directory" if path == "/" else "a top-level directory" if len(parts) == 1
            else f"a standard directory of /{parts[0]}" if path in HIERARCHY_DIRECTORIES
            else "a home directory" if parts[0] == "home" and len(parts) == 2 else None)
    if what is None:
        return None
    return (f"{path} is {what}, which others use too: kvagent would make it private to root "
            f"(mode 0700); {instead}")


@dataclass(frozen=True)
class NodeConfig:
    """This host: its name and where kvagent keeps state."""

    name: Name = doc_field(
        "Short name of this host, used in subsystem NQNs (default: the hostname).",
        default_factory=lambda: Name(default_node_name()),
    )
    nqn_prefix: NQNPrefix = doc_field(
        "Prefix of every subsystem NQN kvagent creates; kvagent owns exactly the subsystems "
        "under it. Storage and GPU hosts must agree on it.",
        NQNPrefix("nqn.2026-11.io.kvagent"),
    )
    state_dir: AbsPath = doc_field(
        "Where kvagent keeps its records (last apply, device claims, probes): a directory "
        "of its own, never a system directory: not /, a top-level directory (/var, /tmp, "
        "...), a standard directory of /var or /run (/var/lib, /var/tmp, /run/user, ...) "
        "or a home directory (/home/USER), nor anything under /etc, /usr, /boot, /proc, "
        "/sys or /dev.",
        AbsPath("/var/lib/kvagent"),
    )
    run_dir: AbsPath = doc_field(
        "Runtime directory (the apply lock, the agent's record and status socket), made "
        "private (mode 0700): a directory of its own, never a system directory (as for "
        "state_dir).",
        AbsPath("/run/kvagent"))
    configfs: AbsPath = doc_field(
        "Mount point of configfs (nvmet lives under <configfs>/nvmet).",
        AbsPath("/sys/kernel/config"),
    )
    sysfs: AbsPath = doc_field("Mount point of sysfs.", AbsPath("/sys"))
    nvme_dir: AbsPath = doc_field(
        "Directory holding hostnqn and hostid (nvme-cli's).", AbsPath("/etc/nvme")
    )

    def check(self) -> Check:
        for name, example in (("state_dir", "/var/lib/kvagent"), ("run_dir", "/run/kvagent")):
            refused = own_directory_problem(getattr(self, name), example)
            if refused:
                yield (name,), refused


@dataclass(frozen=True)
class PortConfig:
    """An nvmet port: one transport address the target listens on."""

    name: Name = doc_field("Name that pools use to refer to this port.")
    id: int = doc_field("nvmet port id (the configfs directory name).",
                        minimum=1, maximum=65535)
    transport: Transport = doc_field("'tcp' (NVMe/TCP) or 'rdma' (NVMe/RDMA, RoCE).")
    address: IPAddress = doc_field("Local IPv4 or IPv6 address to listen on.")
    service: int = doc_field("TCP port / RDMA service id.", 4420, minimum=1, maximum=65535)
    inline_data_size: int | None = doc_field(
        "param_inline_data_size in bytes (default: the kernel's).", None, minimum=0,
        maximum=1048576,
    )
    tls: Literal["none", "required"] = doc_field(
        "NVMe/TCP TLS 1.3 on this port (addr_tsas, addr_treq): 'required' refuses every "
        "connection without TLS (discovery too); each host of its pools needs tls.key_file, "
        "and tlshd must run. Needs CONFIG_NVME_TARGET_TCP_TLS (Debian 13's 6.12).", "none")
    ana_state: AnaState = doc_field(
        "ANA (asymmetric namespace access) state this port reports for every namespace "
        "exported on it (nvmet ANA group 1 of the port): GPU hosts with native multipath "
        "send I/O to 'optimized' paths and use 'non-optimized' ones only when no optimized "
        "path is left; 'inaccessible' paths carry no I/O. E.g. RDMA optimized, TCP "
        "non-optimized: ana_state: non-optimized on the TCP port. Applies to every pool on "
        "the port.", "optimized")

    def check(self) -> Check:
        if self.tls != "none" and self.transport != "tcp":
            yield ("tls",), f"TLS is for NVMe/TCP ports; port {self.name} is {self.transport}"


DhchapHash = Literal["sha256", "sha384", "sha512"]
DhchapGroup = Literal["null", "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192"]


def _secret_files(**paths: str | None) -> Check:
    from ..dhchap import secret_file_problem  # (its hashing: only with a secret to check)

    for name, path in paths.items():
        problem = secret_file_problem(path) if path is not None else None
        if problem is not None:
            yield (name,), f"{path} {problem}"


@dataclass(frozen=True)
class HostAuth:
    """DH-HMAC-CHAP for one GPU host (NVMe in-band authentication): the storage host
    admits the host only if it proves it holds the host secret. Needs a kernel with
    NVME_TARGET_AUTH (Debian 13's 6.12 has it; Debian 12's 6.1 does not)."""

    key_file: AbsPath = doc_field(
        "File holding the host's secret (DHHC-1, made by kvagent keys generate; owned by "
        "root, mode 0600). The GPU host's initiator pool names a file with the same secret.")
    ctrl_key_file: AbsPath | None = doc_field(
        "File holding the controller's secret: bidirectional authentication (the GPU host "
        "checks the storage host too). Default: none (the host is checked, not the target).",
        None)
    hash: DhchapHash = doc_field("HMAC hash of the exchange (dhchap_hash).", "sha256")
    dhgroup: DhchapGroup = doc_field(
        "Diffie-Hellman group of the exchange (dhchap_dhgroup); 'null': none.", "ffdhe2048")

    def check(self) -> Check:
        yield from _secret_files(key_file=self.key_file, ctrl_key_file=self.ctrl_key_file)


def _psk_file(path: str) -> Check:
    from ..tlspsk import read_psk

    try:
        read_psk(path)
    except KvagentError as exc:
        yield ("key_file",), exc.message.replace(f"secret file {path} ", f"{path} ", 1)


@dataclass(frozen=True)
class TlsPsk:
    """NVMe/TCP TLS for one GPU host and a pool: the pre-shared key both hosts hold."""

    key_file: AbsPath = doc_field(
        "File holding the TLS pre-shared key (NVMeTLSkey-1, made by kvagent keys generate "
        "--tls; owned by root, mode 0600): the storage host's entry for this host and the "
        "GPU host's initiator pool name files with the same key.")

    def check(self) -> Check:
        yield from _psk_file(self.key_file)


@dataclass(frozen=True)
class InitiatorAuth:
    """DH-HMAC-CHAP secrets this GPU host presents when it connects to a pool."""

    key_file: AbsPath = doc_field(
        "File holding this host's secret (the one the storage host's pool lists for this "
        "host's NQN; owned by root, mode 0600).")
    ctrl_key_file: AbsPath | None = doc_field(
        "File holding the controller's secret, to check the storage host too "
        "(bidirectional; the storage host must have the same ctrl_key_file secret).", None)

    def check(self) -> Check:
        yield from _secret_files(key_file=self.key_file, ctrl_key_file=self.ctrl_key_file)


@dataclass(frozen=True)
class TargetHost:
    """A GPU host allowed to use a pool."""

    name: Name = doc_field("Short name of the host (part of its subsystem's NQN).")
    nqn: NQN = doc_field("The host's NQN (its /etc/nvme/hostnqn).")
    auth: HostAuth | None = doc_field(
        "DH-HMAC-CHAP for this host (default: none; the NQN alone admits it). A host NQN "
        "in several pools must have the same auth in each (nvmet keeps one per host).",
        None)
    tls: TlsPsk | None = doc_field(
        "TLS pre-shared key of this host for this pool (needed when the pool is on a port "
        "with tls: required; default: none).", None)


@dataclass(frozen=True)
class LvmBacking:
    """Logical volumes in a volume group."""

    kind: Literal["lvm"] = doc_field("'lvm'.")
    volume_group: VolumeGroupName = doc_field("Volume group that holds the pool's volumes.")
    devices: tuple[BlankDevice, ...] = doc_field(
        "Blank devices on which kvagent creates the volume group if it does not exist "
        "(refused if any carries data). Empty: the group must already exist.",
        (),
    )
    placement: Placement = doc_field(
        "Where each new namespace's LV goes on the group's devices (PVs). 'spread': each "
        "LV on one PV, round-robin over the PVs with room, so that a host's namespaces sit "
        "on different drives (nvmet has no QoS: spreading is the fairness and bandwidth "
        "tool); 'striped': each LV striped over the PVs (lvcreate -i/-I); 'linear': LVM "
        "chooses (it fills one PV before the next). Only new LVs follow it: existing ones "
        "are never moved.", "spread")
    stripes: int | None = doc_field(
        "Stripes per LV with placement: striped (default: every PV of the group).", None,
        minimum=2, maximum=128)
    stripe_size: Size = doc_field(
        "Stripe size with placement: striped: a power of two from 4KiB up to the group's "
        "extent size (4MiB unless the group was made otherwise).", Size(MIB))

    def check(self) -> Check:
        for i, dev, first in duplicates(enumerate(self.devices)):
            yield ("devices", i), f"{dev} is listed twice (also at devices[{first}])"
        if self.placement == "striped" and len(self.devices) == 1:
            yield ("placement",), (
                f"striped needs a volume group of at least 2 devices; devices lists one "
                f"({self.devices[0]}): list more devices, or use placement: spread or linear")
        if self.stripes is not None and self.placement != "striped":
            yield ("stripes",), (f"is only used with placement: striped (placement is "
                                 f"{self.placement})")
        if (self.stripes is not None and self.placement == "striped" and self.devices
                and self.stripes > len(self.devices)):
            yield ("stripes",), (f"{self.stripes} stripes need {self.stripes} devices; "
                                 f"devices lists {len(self.devices)}")
        if self.stripe_size < 4096 or self.stripe_size & (self.stripe_size - 1):
            yield ("stripe_size",), (f"{self.stripe_size} is not a power of two of at "
                                     "least 4KiB (e.g. 64KiB, 1MiB)")


@dataclass(frozen=True)
class FileBacking:
    """Preallocated files in a directory."""

    kind: Literal["file"] = doc_field("'file'.")
    directory: AbsPath = doc_field("Directory for the pool's files (created if missing).")
    buffered_io: bool = doc_field(
        "Use the page cache (nvmet buffered_io). Needed on filesystems without O_DIRECT "
        "(tmpfs, overlay); slower and uses RAM.",
        False,
    )


@dataclass(frozen=True)
class DeviceEntry:
    """One whole block device exported as one namespace."""

    path: DeviceId = doc_field("Stable device path under /dev/disk/by-id/.")
    host: Name | None = doc_field(
        "Host that gets this device (required unless the pool is shared).", None
    )


@dataclass(frozen=True)
class DeviceBacking:
    """Whole block devices, one namespace each."""

    kind: Literal["device"] = doc_field("'device'.")
    devices: tuple[DeviceEntry, ...] = doc_field("The devices, each with its host.")

    def check(self) -> Check:
        if not self.devices:
            yield ("devices",), "must list at least one device"
        for i, path, first in duplicates((i, d.path) for i, d in enumerate(self.devices)):
            yield ("devices", i, "path"), f"{path} is listed twice (also at devices[{first}])"


Backing = LvmBacking | FileBacking | DeviceBacking


@dataclass(frozen=True)
class NamespaceSpec:
    """How many namespaces each host gets, and how big."""

    count: int = doc_field("Namespaces per host subsystem (or in the shared subsystem).",
                           minimum=1, maximum=MAX_NAMESPACES)
    size: Size = doc_field("Size of each namespace, e.g. 512GiB.")

    def check(self) -> Check:
        if self.size < 4 * MIB:
            yield ("size",), f"{self.size} bytes is too small; a namespace needs at least 4MiB"
        elif self.size % (4096) != 0:
            yield ("size",), f"{self.size} bytes is not a multiple of 4096"


@dataclass(frozen=True)
class TargetPool:
    """A KV-cache pool exported by this storage host."""

    name: Name = doc_field("Pool name; GPU hosts attach it by this name.")
    backing: Backing = doc_field("Where the namespaces come from: kind lvm, file or device.")
    ports: tuple[Name, ...] = doc_field("Names of the ports that export the pool.")
    hosts: tuple[TargetHost, ...] = doc_field(
        "GPU hosts allowed to use the pool. Empty: nobody (nothing is exported).", ()
    )
    namespaces: NamespaceSpec | None = doc_field(
        "Namespace count and size (lvm and file backings; not for device).", None
    )
    shared: bool = doc_field(
        "One subsystem for all hosts (raw-block consumers that coordinate themselves). "
        "Default: each host gets its own subsystem and namespaces.",
        False,
    )
    allow_any_host: bool = doc_field(
        "Let any host connect (only with shared: true; logged as a warning).", False
    )
    model: str = doc_field("Model string the namespaces report (attr_model).", "kvagent")

    def check(self) -> Check:
        if not self.ports:
            yield ("ports",), "must name at least one port"
        for i, port, first in duplicates(enumerate(self.ports)):
            yield ("ports", i), f"port {port!r} is listed twice (also at ports[{first}])"
        for i, name, first in duplicates((i, h.name) for i, h in enumerate(self.hosts)):
            yield ("hosts", i, "name"), f"host name {name!r} is used twice (also hosts[{first}])"
        for i, _nqn, first in duplicates((i, h.nqn) for i, h in enumerate(self.hosts)):
            yield ("hosts", i, "nqn"), f"host NQN is listed twice (also hosts[{first}])"
        if len(self.model) > 40 or not self.model.isprintable():
            yield ("model",), "must be at most 40 printable characters"
        if self.allow_any_host and not self.shared:
            yield ("allow_any_host",), (
                "is only allowed with shared: true; a per-host pool must list its hosts"
            )
        if isinstance(self.backing, DeviceBacking):
            if self.namespaces is not None:
                yield ("namespaces",), "is not used with kind: device (one namespace per device)"
            names = {h.name for h in self.hosts}
            for i, dev in enumerate(self.backing.devices):
                if self.shared and dev.host is not None:
                    yield ("backing", "devices", i, "host"), "must be omitted in a shared pool"
                elif not self.shared and dev.host is None:
                    yield ("backing", "devices", i, "host"), (
                        "is required: each device belongs to one host unless the pool is shared"
                    )
                elif not self.shared and dev.host not in names:
                    yield ("backing", "devices", i, "host"), (
                        f"{dev.host!r} is not one of this pool's hosts "
                        f"({', '.join(sorted(names)) or 'none listed'})"
                    )
        elif self.namespaces is None:
            yield ("namespaces",), f"is required for kind: {self.backing.kind}"


@dataclass(frozen=True)
class PeerConfig:
    """Another storage host's discovery port, which this host's ports refer GPU hosts to."""

    name: Name = doc_field("The peer's name (its referral on each port is kvagent-<name>).")
    transport: Transport = doc_field("'tcp' or 'rdma'.")
    address: IPAddress = doc_field("The peer's port address.")
    service: int = doc_field("The peer's TCP port / RDMA service id.", 4420,
                             minimum=1, maximum=65535)
    draining: bool = doc_field(
        "The peer is leaving the fleet: it is not referred to any more, so GPU hosts stop "
        "finding it and let its namespaces go once their engines do (docs/operations.md, "
        "\"Growing and shrinking the fleet\").", False)


@dataclass(frozen=True)
class TargetConfig:
    """The storage-host role: ports and pools."""

    ports: tuple[PortConfig, ...] = doc_field("Ports the target listens on.", ())
    pools: tuple[TargetPool, ...] = doc_field("Pools to export.", ())
    peers: tuple[PeerConfig, ...] = doc_field(
        "The other storage hosts' discovery ports: every port of this host carries an NVMe "
        "discovery referral to each, so a GPU host that discovers at any one storage host "
        "finds them all (initiator pools follow referrals). The same list may go to every "
        "storage host: a peer that is one of this host's own ports is left out.", ())
    address_wait: Duration = doc_field(
        "How long apply waits for a port's address to appear (after boot) before failing "
        "that port.",
        Duration(30),
    )

    def check(self) -> Check:
        for i, name, first in duplicates((i, p.name) for i, p in enumerate(self.ports)):
            yield ("ports", i, "name"), f"port name {name!r} is used twice (also ports[{first}])"
        for i, pid, first in duplicates((i, p.id) for i, p in enumerate(self.ports)):
            yield ("ports", i, "id"), f"port id {pid} is used twice (also ports[{first}])"
        for i, ep, first in duplicates(
            (i, (p.transport, p.address, p.service)) for i, p in enumerate(self.ports)
        ):
            yield ("ports", i), (
                f"{ep[0]} {ep[1]}:{ep[2]} is the same endpoint as ports[{first}]"
            )
        for i, name, first in duplicates((i, p.name) for i, p in enumerate(self.peers)):
            yield ("peers", i, "name"), f"peer name {name!r} is used twice (also peers[{first}])"
        for i, ep, first in duplicates(
            (i, (p.transport, p.address, p.service)) for i, p in enumerate(self.peers)
        ):
            yield ("peers", i), f"{ep[0]} {ep[1]}:{ep[2]} is listed twice (also peers[{first}])"
        for i, name, first in duplicates((i, p.name) for i, p in enumerate(self.pools)):
            yield ("pools", i, "name"), f"pool name {name!r} is used twice (also pools[{first}])"
        port_names = [p.name for p in self.ports]
        for i, pool in enumerate(self.pools):
            for j, ref in enumerate(pool.ports):
                if ref not in port_names:
                    yield ("pools", i, "ports", j), (
                        f"unknown port {ref!r} (defined ports: {', '.join(port_names) or 'none'})"
                    )
        tls_ports = {p.name for p in self.ports if p.tls != "none"}
        for i, pool in enumerate(self.pools):
            on_tls = sorted(tls_ports & set(pool.ports))
            for j, host in enumerate(pool.hosts if on_tls else ()):
                if host.tls is None:
                    yield ("pools", i, "hosts", j, "tls"), (
                        f"pool {pool.name} is exported on TLS port {on_tls[0]}: host "
                        f"{host.name} needs tls.key_file (its pre-shared key)")
        auths: dict[str, tuple[HostAuth | None, int, int]] = {}
        for i, pool in enumerate(self.pools):
            for j, host in enumerate(pool.hosts):
                first = auths.setdefault(host.nqn, (host.auth, i, j))
                if first[0] != host.auth:
                    yield ("pools", i, "hosts", j, "auth"), (
                        f"host NQN {host.nqn} has another auth in pools[{first[1]}].hosts"
                        f"[{first[2]}]; nvmet keeps one set of secrets per host NQN: give "
                        "it the same auth everywhere")
        seen: dict[str, str] = {}
        for i, pool in enumerate(self.pools):
            devices = ()
            if isinstance(pool.backing, DeviceBacking):
                devices = tuple((("backing", "devices", j, "path"), d.path)
                                for j, d in enumerate(pool.backing.devices))
            elif isinstance(pool.backing, LvmBacking):
                devices = tuple((("backing", "devices", j), d)
                                for j, d in enumerate(pool.backing.devices))
            for rel, dev in devices:
                if dev in seen and seen[dev] != pool.name:
                    yield ("pools", i, *rel), f"{dev} is already used by pool {seen[dev]!r}"
                seen.setdefault(dev, pool.name)
        vgs: dict[str, tuple[str, ...]] = {}
        for i, pool in enumerate(self.pools):
            if isinstance(pool.backing, LvmBacking) and pool.backing.devices:
                vg = pool.backing.volume_group
                if vg in vgs and vgs[vg] != pool.backing.devices:
                    yield ("pools", i, "backing", "devices"), (
                        f"volume group {vg!r} is given different devices by another pool"
                    )
                vgs.setdefault(vg, pool.backing.devices)


@dataclass(frozen=True)
class TargetRef:
    """A storage host's port that serves an initiator pool."""

    transport: Transport = doc_field("'tcp' or 'rdma'.")
    address: IPAddress = doc_field("The target port's address.")
    service: int = doc_field("The target port's TCP port / service id.", 4420,
                             minimum=1, maximum=65535)
    subsystem: NQN | None = doc_field(
        "Subsystem NQN to connect to. Default: found by discovery (the subsystem under "
        "node.nqn_prefix for this pool that the target lets this host see).",
        None,
    )


@dataclass(frozen=True)
class ConnectOptions:
    """Connect options for a pool's controllers."""

    ctrl_loss_tmo: Duration | Literal["forever"] = doc_field(
        "How long the kernel keeps reconnecting before giving the device up; 'forever' "
        "(default) keeps the controller, and so the mount, across target outages: the "
        "device returns when the storage host does.",
        "forever",
    )
    fast_io_fail_tmo: Duration | Literal["off"] = doc_field(
        "How long I/O waits for a lost path before it fails (EIO) while the kernel keeps "
        "reconnecting: a KV cache should make its engine recompute, not hang. 'off': I/O "
        "waits for the whole outage. Written to each controller's sysfs attribute (nvme-cli "
        "2.3 has no option for it) and kept there on every pass; see the operations guide "
        "for the default.",
        Duration(FAST_IO_FAIL_TMO),
    )
    reconnect_delay: Duration = doc_field("Delay between reconnect attempts.", Duration(2))
    keep_alive_tmo: Duration | None = doc_field("Keep-alive timeout (default: kernel's).", None)
    nr_io_queues: int | None = doc_field("Number of I/O queues (default: one per CPU).", None,
                                         minimum=1, maximum=1024)
    queue_size: int | None = doc_field("I/O queue depth (default: kernel's).", None,
                                       minimum=16, maximum=1024)
    host_iface: str | None = doc_field("Network interface to connect through (TCP).", None)
    host_traddr: IPAddress | None = doc_field("Local address to connect from.", None)

    def check(self) -> Check:
        if self.host_iface is not None and not IFNAME.fullmatch(self.host_iface):
            yield ("host_iface",), (
                f"{self.host_iface!r} is not a network interface name (1-15 letters, digits "
                "and . _ @ -, as the kernel names them)")
        if (self.fast_io_fail_tmo != "off" and self.ctrl_loss_tmo != "forever"
                and self.fast_io_fail_tmo >= self.ctrl_loss_tmo):
            yield ("fast_io_fail_tmo",), (
                f"{self.fast_io_fail_tmo} is not below ctrl_loss_tmo ({self.ctrl_loss_tmo}): "
                "the kernel gives the controller up before I/O would fail fast, so it never "
                "does; make it shorter than ctrl_loss_tmo, or set ctrl_loss_tmo: forever")


@dataclass(frozen=True)
class EngineCleaner:
    """Oldest-first cleaner for an engine that never evicts on disk (default on: vLLM's fs)."""

    enabled: bool | None = doc_field(
        "Delete the engine's oldest files (by modification time) when its usage passes "
        "high, until it is under low. Only regular files inside the engine's own "
        "directory (<mount>/<kind>) are deleted, never a symlink's target, a directory "
        "or anything outside; it needs project quotas (usage from the quota). Default: on "
        "for vllm with cpu_cache (its fs tier never evicts on disk: full, it stores "
        "nothing more) unless the pool's mount_options has noquota; off for every other "
        "engine (they evict on disk themselves).", None)
    high: Percent = doc_field("Usage, as a share of the engine's cap on a mount, above "
                              "which the cleaner runs.", Percent(95))
    low: Percent = doc_field("Usage the cleaner brings the engine down to (below high).",
                             Percent(85))

    def check(self) -> Check:
        if self.low >= self.high:
            yield ("low",), f"must be below high ({self.high:g}%), got {self.low:g}%"


@dataclass(frozen=True)
class EngineConfig:
    """An inference engine that uses the pool."""

    kind: EngineKind = doc_field("lmcache, vllm, dynamo, sglang or mooncake.")
    owner: AccountName = doc_field("Owner of the engine's directories.", AccountName("root"))
    group: AccountName = doc_field("Group of the engine's directories.", AccountName("root"))
    mode: FileMode = doc_field("Mode of the engine's directories (quoted octal).",
                               FileMode(0o750))
    capacity: Percent | None = doc_field(
        "Share of the pool's capacity this engine may fill (default: 90% split evenly "
        "between the pool's engines). All engines together stay at or below 90%. A hard "
        "cap: each mount's share is the xfs project quota of the engine's directory there "
        "(the engine gets ENOSPC at it).",
        None,
    )
    cleaner: EngineCleaner = doc_field(
        "Oldest-first cleaner for an engine that never evicts on disk (default: on for "
        "vllm's fs tier, off otherwise).", default_factory=EngineCleaner)
    gds: Literal["check", "trust"] | None = doc_field(
        "Dynamo only: its disk-only KVBM moves blocks between disk and GPU with GPUDirect "
        "Storage. 'check' (dynamo's default) renders it only where this host has the "
        "nvidia-fs module loaded and cuFile (libcufile) installed, and refuses otherwise; "
        "'trust' renders without looking (you checked GDS, e.g. with gdscheck, and the "
        "engine's image brings its own cuFile).", None)

    tensor_parallel: int = doc_field(
        "GPU ranks of one engine instance (its tensor-parallel size) that use the pool. "
        "Engines whose disk size is per rank or per worker (SGLang, Mooncake, LMCache) "
        "get each directory's cap divided by tensor_parallel × data_parallel, so all ranks "
        "together stay under the hard cap instead of meeting ENOSPC.", 1,
        minimum=1, maximum=1024)
    data_parallel: int = doc_field(
        "Engine instances (data-parallel replicas) on this host that share each of the "
        "pool's directories.", 1, minimum=1, maximum=1024)
    cpu_cache: Size | None = doc_field(
        "vllm only: host RAM for a CPU tier (cpu_bytes_to_use, bytes for all of an "
        "instance's workers together). With it, vLLM's OffloadingConnector keeps a CPU "
        "tier of this size with an fs tier on the pool behind it, whose files persist and "
        "are shared by instances; it never evicts on disk, so kvagent's cleaner bounds it "
        "(on by default). Without it (default), vLLM's disk backend "
        "(SimpleCPUOffloadConnector): GPU to the pool directly, each worker's file sized "
        "from its directory's cap, evicting least recently used blocks itself; kept only "
        "while the instance runs. kvagent does not size host RAM: the operator gives it.",
        None)
    backend: Literal["file", "mooncake"] | None = doc_field(
        "sglang only: HiCache's storage backend on the pool: 'file' (default: SGLang's "
        "HiCacheFile writes pages under the directory) or 'mooncake' (the Mooncake store "
        "with SSD offload into the directory, one subdirectory per rank).", None)

    @property
    def checks_gds(self) -> bool:
        """Whether GPUDirect Storage is looked for before this engine is rendered."""
        return self.kind == "dynamo" and self.gds != "trust"

    def check(self) -> Check:
        if self.gds is not None and self.kind != "dynamo":
            yield ("gds",), (f"only dynamo's config depends on GPUDirect Storage; {self.kind} "
                             "takes no gds setting")
        if self.cpu_cache is not None and self.kind != "vllm":
            yield ("cpu_cache",), (f"only vllm has a CPU tier kvagent renders; {self.kind} "
                                   "takes no cpu_cache setting")
        if self.backend is not None and self.kind != "sglang":
            yield ("backend",), (f"only sglang has a storage backend to choose; {self.kind} "
                                 "takes no backend setting")
        if self.cpu_cache is not None and self.cpu_cache <= 0:
            yield ("cpu_cache",), "must be more than 0 bytes"
        if self.kind == "vllm" and self.cpu_cache is None and self.cleaner.enabled:
            yield ("cleaner", "enabled"), (
                "vllm without cpu_cache uses vLLM's disk backend, which evicts inside its "
                "own files: the cleaner would delete a file the engine is writing; give "
                "cpu_cache for the fs tier, or leave the cleaner off")

    @property
    def cleans_by_default(self) -> bool:
        """The engine never evicts on disk (vLLM's fs tier): its cleaner is on unless the
        config says otherwise."""
        return self.kind == "vllm" and self.cpu_cache is not None


@dataclass(frozen=True)
class InitiatorPool:
    """A pool this GPU host attaches."""

    name: Name = doc_field("The pool's name on the storage host(s).")
    targets: tuple[TargetRef, ...] = doc_field(
        "Storage-host ports to attach from (several storage hosts add bandwidth). "
        "'target:' with a single mapping is accepted too. A target without 'subsystem' is "
        "a seed: its discovery log is read, and with referrals followed one seed per pool "
        "is enough (the storage hosts it refers to are found too); a target with "
        "'subsystem' is connected as configured and never a seed.",
        alias="target",
    )
    mount: AbsPath = doc_field("Mount root: one subdirectory per namespace, or the striped "
                               "volume itself. Never a system directory (/, /etc, /usr, "
                               "/var, /tmp, /mnt, ...) or anything under /proc, /sys, /dev.")
    referrals: Literal["follow", "ignore"] = doc_field(
        "'follow': the discovery referrals the seeds list (storage hosts referring to each "
        "other) are read too, breadth-first, at most 3 referrals deep and 64 discovery "
        "addresses per pool, and the subsystems of this pool found there attached; "
        "'ignore': only the seeds are read.",
        "follow",
    )
    layout: Literal["per-namespace", "striped"] = doc_field(
        "'per-namespace': one xfs per namespace under mount/<storage node>-ns<nsid> "
        "(engines shard per GPU; a namespace keeps its directory for good, pools attached "
        "by older versions keep mount/nsN); 'striped': one LVM striped volume across all "
        "namespaces.",
        "per-namespace",
    )
    shared: bool = doc_field(
        "The target pool is shared (raw block): connect only, never make a filesystem.", False
    )
    mount_options: tuple[str, ...] = doc_field(
        "Mount options. kvagent adds prjquota (xfs project quotas: each engine's cap is a "
        "hard limit, its usage read in O(1)) unless the list names a quota option itself: "
        "pqnoenforce (usage from the quota, caps advisory) or noquota (caps advisory, "
        "usage sampled).", ("noatime",))
    connect: ConnectOptions = doc_field("Connect options (as the kernel's fabrics options).",
                                        default_factory=ConnectOptions)
    engines: tuple[EngineConfig, ...] = doc_field("Engines that use this pool.", ())
    auth: InitiatorAuth | None = doc_field(
        "DH-HMAC-CHAP secrets to connect with (default: none).", None)
    tls: TlsPsk | None = doc_field(
        "Connect (and discover) with NVMe/TCP TLS 1.3 using this pre-shared key (default: "
        "none). Needs tlshd running and nvme-cli 2.4 or later.", None)
    iopolicy: IoPolicy | None = doc_field(
        "Native multipath I/O policy of the pool's subsystems (/sys/class/nvme-subsystem/"
        "*/iopolicy): 'numa' (the kernel's default: the nearest optimized path), "
        "'round-robin' (every optimized path in turn), 'queue-depth' (the optimized path "
        "with the fewest requests in flight; Linux 6.11 or later). Paths the storage host "
        "reports non-optimized (ports' ana_state) are used only when no optimized one is "
        "left. Default: leave the kernel's.", None)

    def __post_init__(self) -> None:
        # Each engine's cleaner default (None) resolved: on where the engine never evicts
        # on disk and the pool's mounts can give the cleaner its usage (not noquota).
        if any(e.cleaner.enabled is None for e in self.engines):
            quota = "noquota" not in self.mount_options
            object.__setattr__(self, "engines", tuple(
                e if e.cleaner.enabled is not None else dataclasses.replace(
                    e, cleaner=dataclasses.replace(
                        e.cleaner, enabled=quota and e.cleans_by_default))
                for e in self.engines))

    def check(self) -> Check:
        if not self.targets:
            yield ("targets",), "must list at least one target"
        refused = system_directory_problem(self.mount)
        if refused:
            yield ("mount",), refused
        for i, ep, first in duplicates(
            (i, (t.transport, t.address, t.service, t.subsystem))
            for i, t in enumerate(self.targets)
        ):
            yield ("targets", i), f"{ep[1]}:{ep[2]} is listed twice (also targets[{first}])"
        for i, kind, first in duplicates((i, e.kind) for i, e in enumerate(self.engines)):
            yield ("engines", i, "kind"), f"engine {kind!r} is listed twice (also [{first}])"
        for i, opt in enumerate(self.mount_options):
            if not opt or "," in opt or any(c.isspace() for c in opt):
                yield ("mount_options", i), f"{opt!r} must be one option without ',' or spaces"
        for i, why in mount_option_problems(self.mount_options):
            yield ("mount_options", i), why
        if "ro" in self.mount_options and not self.shared:
            yield ("mount_options", self.mount_options.index("ro")), (
                "a read-only mount: the engines cannot write their cache, and kvagent cannot "
                "prepare their directories or caps")
        if self.shared and self.engines:
            yield ("engines",), "engines need a filesystem; a shared (raw-block) pool has none"
        for i, t in enumerate(self.targets if self.tls else ()):
            if t.transport != "tcp":
                yield ("targets", i, "transport"), "TLS (tls:) is for NVMe/TCP targets"
        if self.shared and self.layout != "per-namespace":
            yield ("layout",), "a shared (raw-block) pool has no filesystem to stripe"
        if "noquota" in self.mount_options:
            for i, e in enumerate(self.engines):
                if e.cleaner.enabled:
                    yield ("engines", i, "cleaner", "enabled"), (
                        "the cleaner reads usage from project quotas, which mount option "
                        "noquota turns off")
        caps = [e.capacity for e in self.engines if e.capacity is not None]
        if sum(caps) > 90 + 1e-9:
            yield ("engines",), (
                f"capacities add up to {sum(caps):g}%; engines together may use at most 90% "
                "of the pool (engines do not always evict on disk)"
            )


def overlapping_paths(paths: list[str]) -> list[tuple[int, int]]:
    """Pairs ``(i, j)``, ``j < i``, of normalised absolute paths where one is the other or
    under it, in order of ``i`` then ``j``: each path's ancestors are looked up, so the
    cost grows with the paths times their depth, not with the paths squared."""
    at: dict[str, list[int]] = {}
    for i, path in enumerate(paths):
        at.setdefault(path.rstrip("/"), []).append(i)
    pairs = set()
    for i, path in enumerate(paths):
        key = path.rstrip("/")
        while True:
            pairs.update((max(i, j), min(i, j)) for j in at.get(key, ()) if j != i)
            if not key:
                break
            key = key.rpartition("/")[0]
    return sorted(pairs)


@dataclass(frozen=True)
class InitiatorConfig:
    """The GPU-host role: pools to attach."""

    pools: tuple[InitiatorPool, ...] = doc_field("Pools to attach.", ())
    device_wait: Duration = doc_field(
        "How long to wait for a namespace's block device after connecting, and for a "
        "live controller of a pool. `kvagent run` does not wait for controllers that are "
        "all reconnecting: such a pool fails at once (the kernel reconnects by itself; the "
        "agent tries again every `health.interval`), so it does not hold up the other "
        "pools, collects and heals.", Duration(30)
    )

    def check(self) -> Check:
        for i, name, first in duplicates((i, p.name) for i, p in enumerate(self.pools)):
            yield ("pools", i, "name"), f"pool name {name!r} is used twice (also pools[{first}])"
        for i, j in overlapping_paths([p.mount for p in self.pools]):
            yield ("pools", i, "mount"), (
                f"{self.pools[i].mount} overlaps the mount of pools[{j}] ({self.pools[j].mount})"
            )


@dataclass(frozen=True)
class HealthConfig:
    """Health reporting: HTTP endpoint, loop interval, textfile."""

    listen: ListenAddress = doc_field(
        "Address of the /metrics, /healthz and /readyz server. Binding beyond loopback is "
        "an explicit choice. When it cannot be bound (another process holds the port), "
        "kvagent run goes on without it: reported (kvagent status, the log, "
        "kvagent_health_endpoint_listening) and tried again every interval; a reload to "
        "another address binds it before closing the old one, and keeps the old one when "
        "it cannot.",
        ListenAddress("127.0.0.1:9808"),
    )
    interval: Duration = doc_field(
        "Collect interval of kvagent run (status, metrics, /healthz), and how soon a pass "
        "that failed is tried again. A collect also compares kvagent's own objects (nvmet "
        "subsystems, namespaces, allowed hosts, ports and links, host keys; GPU pools' "
        "controllers and mounts) with what the last pass left: a change made behind its "
        "back is healed by a targeted pass at once, so this bounds how long such drift "
        "lasts.", Duration(30))
    full_interval: Duration = doc_field(
        "Interval of kvagent run's full live pass over every pool. Between them, udev "
        "events (controllers, namespaces) drive collects and GPU-side attach passes, "
        "collects heal drift of kvagent's own objects, and SIGHUP / kvagent apply a full "
        "pass; this bounds anything else (a lost event, what no collect reads) and the "
        "back-off of a fight over a drifted object.", Duration(300))
    textfile: AbsPath | None = doc_field(
        "Also write metrics in node_exporter textfile format to this file (atomically).", None
    )

    def check(self) -> Check:
        if self.interval < 1:
            yield ("interval",), "must be at least 1s"
        if self.full_interval < 1:
            yield ("full_interval",), "must be at least 1s"


@dataclass(frozen=True)
class Config:
    """A whole kvagent.yaml."""

    version: Literal[1] = doc_field("Config format version; must be 1.")
    node: NodeConfig = doc_field("This host.", default_factory=NodeConfig)
    target: TargetConfig | None = doc_field("Storage-host role (omit on GPU-only hosts).", None)
    initiator: InitiatorConfig | None = doc_field("GPU-host role (omit on storage-only hosts).",
                                                  None)
    health: HealthConfig = doc_field("Health reporting.", default_factory=HealthConfig)

    def check(self) -> Check:
        if self.target is not None:
            for i, pool in enumerate(self.target.pools):
                hosts = [None] if pool.shared else [h.name for h in pool.hosts]
                for j, host in enumerate(hosts):
                    nqn = subsystem_nqn(self.node.nqn_prefix, self.node.name, pool.name, host)
                    size = len(nqn.encode())
                    if size > NQN_MAX_BYTES:
                        where = ("target", "pools", i) + (("hosts", j, "name") if host else
                                                          ("name",))
                        yield where, (
                            f"subsystem NQN {nqn!r} would be {size} bytes (limit "
                            f"{NQN_MAX_BYTES}); shorten node.nqn_prefix, node.name or the names"
                        )

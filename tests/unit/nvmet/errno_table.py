"""ONE table of nvmet errno rules, run against TWO backends.

The unit tier runs every case on :class:`nvmet.fake.FakeConfigFS`
(tests/unit/nvmet/test_errno_table.py); the kernel tier runs the same cases, with the
same expectations, on the real ``/sys/kernel/config/nvmet`` of Debian's 6.1 kernel
(tests/kernel/test_nvmet_errno.py). That is what makes the fake trustworthy.

A case's function sets things up through ``env`` and returns the operation under
test; :func:`run_case` returns the errno that operation raised (None = success).
"""

from __future__ import annotations

import errno as E
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from nvmet.configfs import ConfigFS, join

SUB = "nqn.2026-11.io.kvagent.test:errno"
SUB2 = "nqn.2026-11.io.kvagent.test:errno2"
HOST = "nqn.2014-08.org.nvmexpress:uuid:0e770000-0000-4000-8000-000000000001"
UUID = "0d4a1bc2-1111-4222-8333-444455556666"
NONLOCAL = "192.0.2.77"  # TEST-NET-1: never assigned to an interface here


class Env(Protocol):
    """What a backend offers the cases."""

    fs: ConfigFS
    local_addr: str
    rdma_nodev_addr: str

    def block_device(self) -> str: ...

    def nodirect_file(self) -> str: ...

    def missing_path(self) -> str: ...

    def directory(self) -> str: ...

    def occupy(self, addr: str, svcid: str) -> None: ...


Op = Callable[[], object]


@dataclass(frozen=True)
class Case:
    name: str
    rule: str
    setup: Callable[[Env], Op]
    expect: int | None

    def __repr__(self) -> str:
        return f"<Case {self.name}>"


CASES: list[Case] = []


def case(name: str, rule: str, expect: int | None) -> Callable[[Callable[[Env], Op]],
                                                                  Callable[[Env], Op]]:
    def deco(fn: Callable[[Env], Op]) -> Callable[[Env], Op]:
        CASES.append(Case(name, rule, fn, expect))
        return fn
    return deco


def run_case(c: Case, env: Env) -> int | None:
    """Set up ``c`` (setup errors propagate) and return the errno of its operation."""
    op = c.setup(env)
    try:
        op()
    except OSError as exc:
        return exc.errno
    return None


# ------------------------------------------------------------------ building blocks

def sub(env: Env, name: str = SUB) -> str:
    path = join("subsystems", name)
    env.fs.mkdir(path)
    return path


def ns(env: Env, name: str = SUB, nsid: int = 1, device: str | None = None,
       enable: bool = False, buffered: bool = False) -> str:
    path = join("subsystems", name, "namespaces", str(nsid))
    env.fs.mkdir(path)
    if device:
        env.fs.write(join(path, "device_path"), device)
    if buffered:
        env.fs.write(join(path, "buffered_io"), "1")
    if enable:
        env.fs.write(join(path, "enable"), "1")
    return path


def host(env: Env, nqn: str = HOST) -> str:
    path = join("hosts", nqn)
    env.fs.mkdir(path)
    return path


def port(env: Env, pid: int = 1, trtype: str | None = "tcp", traddr: str | None = None,
         trsvcid: str | None = "4420", adrfam: str | None = "ipv4") -> str:
    path = join("ports", str(pid))
    env.fs.mkdir(path)
    for name, value in (("trtype", trtype), ("adrfam", adrfam),
                        ("traddr", traddr or env.local_addr), ("trsvcid", trsvcid)):
        if value is not None:
            env.fs.write(join(path, f"addr_{name}"), value)
    return path


def link(env: Env, name: str = SUB, pid: int = 1) -> Op:
    return lambda: env.fs.symlink(join("subsystems", name),
                                  join("ports", str(pid), "subsystems", name))


def allow(env: Env, name: str = SUB, nqn: str = HOST) -> Op:
    return lambda: env.fs.symlink(join("hosts", nqn), join("subsystems", name,
                                                           "allowed_hosts", nqn))


def exported(env: Env) -> None:
    """A subsystem with an enabled namespace, linked into port 1 on a local address."""
    sub(env)
    ns(env, device=env.block_device(), enable=True)
    port(env)
    link(env)()


# ------------------------------------------------------------------ mkdir / rmdir

@case("mkdir_existing_subsystem", "mkdir of an existing name -> EEXIST", E.EEXIST)
def _(env: Env) -> Op:
    sub(env)
    return lambda: env.fs.mkdir(join("subsystems", SUB))


@case("mkdir_nsid_zero", "nsid 0 -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    return lambda: env.fs.mkdir(join("subsystems", SUB, "namespaces", "0"))


@case("mkdir_nsid_all_ones", "nsid 0xffffffff (broadcast) -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    return lambda: env.fs.mkdir(join("subsystems", SUB, "namespaces", "4294967295"))


@case("mkdir_nsid_not_a_number", "a namespace name must be a number -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    return lambda: env.fs.mkdir(join("subsystems", SUB, "namespaces", "abc"))


@case("mkdir_port_id_not_u16", "port ids are u16 -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    return lambda: env.fs.mkdir(join("ports", "70000"))


@case("mkdir_discovery_nqn", "the discovery NQN cannot be a subsystem -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    return lambda: env.fs.mkdir(join("subsystems", "nqn.2014-08.org.nvmexpress.discovery"))


@case("mkdir_any_string_subsystem", "the kernel accepts any string as a subsystem name",
      None)
def _(env: Env) -> Op:
    return lambda: env.fs.mkdir(join("subsystems", "bad name"))


@case("mkdir_inside_namespace", "no groups can be made inside a namespace -> EPERM", E.EPERM)
def _(env: Env) -> Op:
    sub(env)
    ns(env)
    return lambda: env.fs.mkdir(join("subsystems", SUB, "namespaces", "1", "x"))


@case("mkdir_inside_host", "no groups can be made inside a host -> EPERM", E.EPERM)
def _(env: Env) -> Op:
    host(env)
    return lambda: env.fs.mkdir(join("hosts", HOST, "x"))


@case("mkdir_ana_group_1", "ANA group 1 always exists -> EEXIST", E.EEXIST)
def _(env: Env) -> Op:
    port(env)
    return lambda: env.fs.mkdir(join("ports", "1", "ana_groups", "1"))


@case("mkdir_ana_group_129", "ANA group ids are 2..128 -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    port(env)
    return lambda: env.fs.mkdir(join("ports", "1", "ana_groups", "129"))


@case("mkdir_ana_group_128", "ANA group 128 can be made", None)
def _(env: Env) -> Op:
    port(env)
    return lambda: env.fs.mkdir(join("ports", "1", "ana_groups", "128"))


@case("rmdir_ana_group_1", "the default ANA group cannot be removed -> EPERM", E.EPERM)
def _(env: Env) -> Op:
    port(env)
    return lambda: env.fs.rmdir(join("ports", "1", "ana_groups", "1"))


@case("rmdir_default_group", "default groups (namespaces, allowed_hosts...) stay -> EPERM",
      E.EPERM)
def _(env: Env) -> Op:
    sub(env)
    return lambda: env.fs.rmdir(join("subsystems", SUB, "namespaces"))


@case("rmdir_top_group", "the hosts/ports/subsystems groups stay -> EPERM", E.EPERM)
def _(env: Env) -> Op:
    return lambda: env.fs.rmdir("hosts")


@case("unlink_attribute_file", "attribute files cannot be removed (no rm -rf) -> EPERM",
      E.EPERM)
def _(env: Env) -> Op:
    sub(env)
    return lambda: env.fs.unlink(join("subsystems", SUB, "attr_model"))


@case("rmdir_subsystem_with_namespace", "a directory with children -> ENOTEMPTY",
      E.ENOTEMPTY)
def _(env: Env) -> Op:
    sub(env)
    ns(env)
    return lambda: env.fs.rmdir(join("subsystems", SUB))


@case("rmdir_subsystem_with_allowed_host", "a subsystem with allowed_hosts links -> ENOTEMPTY",
      E.ENOTEMPTY)
def _(env: Env) -> Op:
    sub(env)
    host(env)
    allow(env)()
    return lambda: env.fs.rmdir(join("subsystems", SUB))


@case("rmdir_port_with_link", "a port with a subsystem linked -> ENOTEMPTY", E.ENOTEMPTY)
def _(env: Env) -> Op:
    exported(env)
    return lambda: env.fs.rmdir(join("ports", "1"))


@case("rmdir_port_with_referral", "a port with a referral -> ENOTEMPTY", E.ENOTEMPTY)
def _(env: Env) -> Op:
    port(env)
    env.fs.mkdir(join("ports", "1", "referrals", "r1"))
    return lambda: env.fs.rmdir(join("ports", "1"))


@case("rmdir_port_with_ana_group", "a port with an extra ANA group -> ENOTEMPTY",
      E.ENOTEMPTY)
def _(env: Env) -> Op:
    port(env)
    env.fs.mkdir(join("ports", "1", "ana_groups", "2"))
    return lambda: env.fs.rmdir(join("ports", "1"))


@case("rmdir_linked_subsystem", "rmdir of a subsystem linked from a port -> EBUSY", E.EBUSY)
def _(env: Env) -> Op:
    sub(env)
    port(env)
    link(env)()
    return lambda: env.fs.rmdir(join("subsystems", SUB))


@case("rmdir_linked_host", "rmdir of a host linked from allowed_hosts -> EBUSY", E.EBUSY)
def _(env: Env) -> Op:
    sub(env)
    host(env)
    allow(env)()
    return lambda: env.fs.rmdir(join("hosts", HOST))


@case("rmdir_enabled_namespace", "an enabled namespace can be removed (the kernel disables "
      "it)", None)
def _(env: Env) -> Op:
    sub(env)
    ns(env, device=env.block_device(), enable=True)
    return lambda: env.fs.rmdir(join("subsystems", SUB, "namespaces", "1"))


@case("rmdir_missing", "rmdir of a missing directory -> ENOENT", E.ENOENT)
def _(env: Env) -> Op:
    return lambda: env.fs.rmdir(join("ports", "77"))


@case("unlink_missing", "unlink of a missing link -> ENOENT", E.ENOENT)
def _(env: Env) -> Op:
    sub(env)
    return lambda: env.fs.unlink(join("subsystems", SUB, "allowed_hosts", HOST))


# ------------------------------------------------------------------ namespaces

def _enabled_ns(env: Env) -> str:
    sub(env)
    return ns(env, device=env.block_device(), enable=True)


for _attr, _value, _errno in (("device_path", "/dev/null", E.EBUSY),
                              ("device_uuid", UUID, E.EBUSY),
                              ("device_nguid", UUID, E.EBUSY),
                              ("buffered_io", "1", E.EINVAL)):
    def _make(attr: str = _attr, value: str = _value) -> Callable[[Env], Op]:
        def setup(env: Env) -> Op:
            path = _enabled_ns(env)
            return lambda: env.fs.write(join(path, attr), value)
        return setup
    CASES.append(Case(f"write_{_attr}_while_enabled",
                      f"writing {_attr} while the namespace is enabled -> "
                      f"{E.errorcode[_errno]}", _make(), _errno))


@case("write_ana_grpid_while_enabled", "ana_grpid can change while enabled", None)
def _(env: Env) -> Op:
    path = _enabled_ns(env)
    return lambda: env.fs.write(join(path, "ana_grpid"), "2")


@case("write_device_path_disabled", "device_path can change while disabled", None)
def _(env: Env) -> Op:
    sub(env)
    path = ns(env)
    return lambda: env.fs.write(join(path, "device_path"), env.missing_path())


@case("write_device_uuid_invalid", "a malformed uuid -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    path = ns(env)
    return lambda: env.fs.write(join(path, "device_uuid"), "not-a-uuid")


@case("write_empty_value", "configfs refuses a zero-length write -> EFAULT", E.EFAULT)
def _(env: Env) -> Op:
    sub(env)
    return lambda: env.fs.write(join("subsystems", SUB, "attr_model"), "")


@case("write_missing_attribute", "an attribute this kernel lacks -> ENOENT (feature missing)",
      E.ENOENT)
def _(env: Env) -> Op:
    # Persistent reservations (resv_enable): neither Debian 12's 6.1 nor 13's 6.12 has it
    # (hosts' dhchap_key, used here before, is there on 6.12).
    sub(env)
    path = ns(env)
    return lambda: env.fs.write(join(path, "resv_enable"), "1")


@case("enable_without_device_path", "enable without device_path -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    path = ns(env)
    return lambda: env.fs.write(join(path, "enable"), "1")


@case("enable_missing_device", "enable of a path that does not exist -> ENOENT", E.ENOENT)
def _(env: Env) -> Op:
    sub(env)
    path = ns(env, device=env.missing_path())
    return lambda: env.fs.write(join(path, "enable"), "1")


@case("enable_file_without_odirect", "a file on a filesystem without O_DIRECT fails enable "
      "-> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    path = ns(env, device=env.nodirect_file())
    return lambda: env.fs.write(join(path, "enable"), "1")


@case("enable_file_buffered", "the same file enables with buffered_io=1", None)
def _(env: Env) -> Op:
    sub(env)
    path = ns(env, device=env.nodirect_file(), buffered=True)
    return lambda: env.fs.write(join(path, "enable"), "1")


@case("enable_directory", "enable of a directory -> EISDIR", E.EISDIR)
def _(env: Env) -> Op:
    sub(env)
    path = ns(env, device=env.directory())
    return lambda: env.fs.write(join(path, "enable"), "1")


@case("enable_block_device", "enable of a block device", None)
def _(env: Env) -> Op:
    sub(env)
    path = ns(env, device=env.block_device())
    return lambda: env.fs.write(join(path, "enable"), "1")


@case("enable_bad_value", "enable takes a boolean -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    path = ns(env)
    return lambda: env.fs.write(join(path, "enable"), "maybe")


@case("revalidate_disabled", "revalidate_size of a disabled namespace -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    path = ns(env)
    return lambda: env.fs.write(join(path, "revalidate_size"), "1")


@case("revalidate_enabled", "revalidate_size of an enabled namespace", None)
def _(env: Env) -> Op:
    path = _enabled_ns(env)
    return lambda: env.fs.write(join(path, "revalidate_size"), "1")


@case("read_revalidate_size", "revalidate_size is write-only -> EACCES on read", E.EACCES)
def _(env: Env) -> Op:
    sub(env)
    path = ns(env)
    return lambda: env.fs.read(join(path, "revalidate_size"))


# ------------------------------------------------------------------ subsystem attributes

@case("qid_max_zero", "attr_qid_max is 1..128 -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    return lambda: env.fs.write(join("subsystems", SUB, "attr_qid_max"), "0")


@case("serial_too_long", "attr_serial is at most 20 characters -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    return lambda: env.fs.write(join("subsystems", SUB, "attr_serial"), "x" * 21)


@case("cntlid_max_below_min", "attr_cntlid_max below attr_cntlid_min -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    env.fs.write(join("subsystems", SUB, "attr_cntlid_min"), "10")
    return lambda: env.fs.write(join("subsystems", SUB, "attr_cntlid_max"), "5")


@case("version_malformed", "attr_version must be major.minor[.tertiary] -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    return lambda: env.fs.write(join("subsystems", SUB, "attr_version"), "x")


@case("allow_any_host_with_hosts", "allow_any_host=1 while hosts are linked -> EINVAL",
      E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    host(env)
    allow(env)()
    return lambda: env.fs.write(join("subsystems", SUB, "attr_allow_any_host"), "1")


# ------------------------------------------------------------------ links

@case("allow_host_when_any_host", "an allowed_hosts link while allow_any_host=1 -> EINVAL",
      E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    env.fs.write(join("subsystems", SUB, "attr_allow_any_host"), "1")
    host(env)
    return allow(env)


@case("allow_host_twice", "the same host linked under another name -> EEXIST", E.EEXIST)
def _(env: Env) -> Op:
    sub(env)
    host(env)
    allow(env)()
    return lambda: env.fs.symlink(join("hosts", HOST),
                                  join("subsystems", SUB, "allowed_hosts", "other"))


@case("allowed_hosts_to_subsystem", "allowed_hosts links only to hosts -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    sub(env, SUB2)
    return lambda: env.fs.symlink(join("subsystems", SUB2),
                                  join("subsystems", SUB, "allowed_hosts", "x"))


@case("port_link_to_host", "port subsystems links only to subsystems -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    host(env)
    port(env)
    return lambda: env.fs.symlink(join("hosts", HOST), join("ports", "1", "subsystems", "x"))


@case("link_in_hosts_dir", "links only in allowed_hosts and port subsystems -> EPERM",
      E.EPERM)
def _(env: Env) -> Op:
    host(env)
    return lambda: env.fs.symlink(join("hosts", HOST), join("hosts", "lnk"))


@case("link_to_missing_target", "a link to a missing host -> ENOENT", E.ENOENT)
def _(env: Env) -> Op:
    sub(env)
    return allow(env)


@case("port_link_twice", "a subsystem linked twice into a port -> EEXIST", E.EEXIST)
def _(env: Env) -> Op:
    exported(env)
    return link(env)


@case("port_link_local", "linking into a port on a local address enables it", None)
def _(env: Env) -> Op:
    sub(env)
    port(env)
    return link(env)


@case("port_link_nonlocal", "a traddr not on any interface -> EADDRNOTAVAIL", E.EADDRNOTAVAIL)
def _(env: Env) -> Op:
    sub(env)
    port(env, traddr=NONLOCAL)
    return link(env)


@case("port_link_no_trtype", "a port without trtype cannot be enabled -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    port(env, trtype=None)
    return link(env)


@case("port_link_no_trsvcid", "a port without trsvcid cannot be enabled -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    sub(env)
    port(env, trsvcid=None)
    return link(env)


@case("port_link_same_address", "a second port on a busy address -> EADDRINUSE",
      E.EADDRINUSE)
def _(env: Env) -> Op:
    exported(env)
    sub(env, SUB2)
    port(env, pid=2)
    return link(env, SUB2, 2)


@case("port_link_wildcard_conflict", "0.0.0.0 on a port already used -> EADDRINUSE",
      E.EADDRINUSE)
def _(env: Env) -> Op:
    exported(env)
    sub(env, SUB2)
    port(env, pid=2, traddr="0.0.0.0")
    return link(env, SUB2, 2)


@case("port_link_address_of_process", "an address a process listens on -> EADDRINUSE",
      E.EADDRINUSE)
def _(env: Env) -> Op:
    env.occupy(env.local_addr, "4499")
    sub(env)
    port(env, trsvcid="4499")
    return link(env)


@case("rdma_port_without_device", "rdma on an address without an RDMA device -> ENODEV",
      E.ENODEV)
def _(env: Env) -> Op:
    sub(env)
    port(env, trtype="rdma", traddr=env.rdma_nodev_addr)
    return link(env)


@case("rdma_port_nonlocal", "rdma on a non-local address -> EADDRNOTAVAIL", E.EADDRNOTAVAIL)
def _(env: Env) -> Op:
    sub(env)
    port(env, trtype="rdma", traddr=NONLOCAL)
    return link(env)


@case("rdma_port_loopback", "rdma on loopback needs no RDMA device (rdma_cm binds it)", None)
def _(env: Env) -> Op:
    sub(env)
    port(env, trtype="rdma", traddr="127.0.0.1")
    return link(env)


for _attr, _value in (("addr_trsvcid", "4421"), ("addr_traddr", "127.0.0.2"),
                      ("addr_adrfam", "ipv4"), ("addr_trtype", "tcp"),
                      ("addr_treq", "required"), ("param_inline_data_size", "8192")):
    def _make_port(attr: str = _attr, value: str = _value) -> Callable[[Env], Op]:
        def setup(env: Env) -> Op:
            exported(env)
            return lambda: env.fs.write(join("ports", "1", attr), value)
        return setup
    CASES.append(Case(f"write_{_attr}_linked",
                      f"{_attr} on a port with a linked subsystem -> EACCES (even the same "
                      "value)", _make_port(), E.EACCES))


@case("write_addr_unlinked", "addr_* can change while no subsystem is linked", None)
def _(env: Env) -> Op:
    port(env)
    return lambda: env.fs.write(join("ports", "1", "addr_trsvcid"), "4421")


@case("ana_state_linked", "ana_state can change on a linked port", None)
def _(env: Env) -> Op:
    exported(env)
    return lambda: env.fs.write(join("ports", "1", "ana_groups", "1", "ana_state"),
                                "non-optimized")


@case("ana_state_invalid", "ana_state takes a known state -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    port(env)
    return lambda: env.fs.write(join("ports", "1", "ana_groups", "1", "ana_state"), "bogus")


@case("adrfam_invalid", "adrfam takes a known family -> EINVAL", E.EINVAL)
def _(env: Env) -> Op:
    port(env)
    return lambda: env.fs.write(join("ports", "1", "addr_adrfam"), "ipv5")


@case("referral_addr_enabled", "a referral's addr_* while enabled -> EACCES", E.EACCES)
def _(env: Env) -> Op:
    port(env)
    r = join("ports", "1", "referrals", "r1")
    env.fs.mkdir(r)
    for name, value in (("trtype", "tcp"), ("adrfam", "ipv4"), ("traddr", "10.1.1.1"),
                        ("trsvcid", "4420")):
        env.fs.write(join(r, f"addr_{name}"), value)
    env.fs.write(join(r, "enable"), "1")
    return lambda: env.fs.write(join(r, "addr_traddr"), "10.1.1.2")


@case("unlink_last_port_link", "unlinking the last subsystem disables the port (addr_* "
      "writable again)", None)
def _(env: Env) -> Op:
    exported(env)
    env.fs.unlink(join("ports", "1", "subsystems", SUB))
    return lambda: env.fs.write(join("ports", "1", "addr_trsvcid"), "4421")


# ------------------------------------------------------------------ helpers for both tiers

def wipe(fs: ConfigFS) -> None:
    """Remove everything under the nvmet root, bottom-up (test backends only)."""
    for p in fs.list("ports"):
        base = join("ports", p.name)
        for e in fs.list(join(base, "subsystems")):
            fs.unlink(join(base, "subsystems", e.name))
        for e in fs.list(join(base, "referrals")):
            fs.rmdir(join(base, "referrals", e.name))
        for e in fs.list(join(base, "ana_groups")):
            if e.name != "1":
                fs.rmdir(join(base, "ana_groups", e.name))
        fs.rmdir(base)
    for s in fs.list("subsystems"):
        base = join("subsystems", s.name)
        for e in fs.list(join(base, "allowed_hosts")):
            fs.unlink(join(base, "allowed_hosts", e.name))
        for e in fs.list(join(base, "namespaces")):
            fs.write(join(base, "namespaces", e.name, "enable"), "0")
            fs.rmdir(join(base, "namespaces", e.name))
        fs.rmdir(base)
    for h in fs.list("hosts"):
        fs.rmdir(join("hosts", h.name))


RANDOM = "<random>"
_RANDOM_FORMATS = {
    "device_uuid": re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-"
                              r"[0-9a-f]{12}$"),
    "attr_serial": re.compile(r"^[0-9a-f]{20}$"),
}


def defaults_snapshot(fs: ConfigFS) -> dict[str, object]:
    """Make one object of each kind and record what mkdir created: every entry with its
    kind, mode and value (random values checked for format, then shown as <random>)."""
    made = ["hosts/" + HOST, "subsystems/" + SUB, f"subsystems/{SUB}/namespaces/1",
            "ports/1", "ports/1/ana_groups/2", "ports/1/referrals/r1"]
    for path in made:
        fs.mkdir(path)
    out: dict[str, object] = {}

    def walk(path: str) -> None:
        for e in fs.list(path):
            p = join(path, e.name)
            if e.kind == "dir":
                out[p] = "dir"
                walk(p)
            elif e.kind == "link":
                out[p] = "link"
            else:
                value = fs.read(p) if e.readable else None
                fmt = _RANDOM_FORMATS.get(e.name)
                if fmt is not None and value is not None:
                    assert fmt.match(value), f"{p}: {value!r} is not a random {e.name}"
                    value = RANDOM
                out[p] = ("file", e.readable, e.writable, value)

    walk("")
    wipe(fs)
    return out

"""The fabrics address: normalisation, the equality and same-endpoint rules, and the
constructors from the config, a discovery log record and a controller's sysfs address."""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.config import parse_config
from agent.fabrics import FabricsAddress, canonical_service, canonical_traddr

# ------------------------------------------------------------------ normalisation


@pytest.mark.parametrize(("given_", "canonical"), [
    ("4420", "4420"), ("04420", "4420"), (" 4420 ", "4420"), (4420, "4420"),
    ("", ""), ("NONE", "none"),
    ("\u00b2", "\u00b2"),  # a digit to str.isdigit, not to int(): kept, not a crash
])
def test_canonical_service(given_: str | int, canonical: str) -> None:
    assert canonical_service(given_) == canonical


def test_values_are_normalised_on_construction() -> None:
    a = FabricsAddress(" TCP", "2001:DB8:0:0:0:0:0:1", "04420", host_iface=" eth1 ",
                       host_traddr="[FD00:0::5]", src_addr="FD00::9")
    assert dataclasses.astuple(a) == ("tcp", "2001:db8::1", "4420", "eth1", "fd00::5",
                                      "FD00::9")  # src_addr: as the kernel wrote it
    empty = FabricsAddress("tcp", "10.0.0.1", "4420", host_iface="", host_traddr="")
    assert (empty.host_iface, empty.host_traddr) == (None, None)  # "" chooses nothing


def test_interface_names_keep_their_case() -> None:
    assert FabricsAddress("tcp", "10.0.0.1", "4420", host_iface="Eth1").host_iface == "Eth1"


# ------------------------------------------------------------------ comparison

WANT = FabricsAddress("tcp", "fd00::1", "4420")


def test_equality_is_on_normalised_values_and_ignores_src_addr() -> None:
    a = FabricsAddress("TCP", "fd00:0:0::1", "04420", src_addr="fd00::7")
    b = FabricsAddress("tcp", "FD00::1", 4420, src_addr="fd00::8")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != FabricsAddress("rdma", "fd00::1", "4420")
    assert a != FabricsAddress("tcp", "fd00::2", "4420")
    assert a != FabricsAddress("tcp", "fd00::1", "4421")
    assert a != a.with_host("eth1", None)  # == is symmetric: host sides count


def test_same_endpoint_compares_the_host_side_only_where_wanted() -> None:
    found = FabricsAddress.from_sysfs(
        "tcp", "traddr=fd00:0::1,trsvcid=04420,host_traddr=fd00::5,host_iface=eth1,"
        "src_addr=fd00::9")
    assert WANT.same_endpoint(found)  # any host side will do
    assert WANT.with_host("eth1", "FD00:0::5").same_endpoint(found)
    assert WANT.with_host("eth1", None).same_endpoint(found)
    assert WANT.with_host(None, "fd00::5").same_endpoint(found)
    assert not WANT.with_host("eth2", None).same_endpoint(found)
    assert not WANT.with_host(None, "fd00::6").same_endpoint(found)
    # A wanted host side is not met by a controller that shows none.
    assert not found.same_endpoint(WANT)
    for other in (FabricsAddress("rdma", "fd00::1", "4420"),
                  FabricsAddress("tcp", "fd00::2", "4420"),
                  FabricsAddress("tcp", "fd00::1", "4421")):
        assert not other.same_endpoint(found)


def test_endpoint_and_describe() -> None:
    a = FabricsAddress("tcp", "10.0.0.1", "4420", "eth1", "10.0.0.5", src_addr="10.0.0.5")
    assert a.endpoint == FabricsAddress("tcp", "10.0.0.1", "4420")
    assert a.endpoint.src_addr is None and a.endpoint.host_iface is None
    assert a.describe() == "tcp 10.0.0.1:4420"


# ------------------------------------------------------------------ constructors

def test_from_config() -> None:
    cfg = parse_config("""
version: 1
initiator:
  pools:
    - name: kv
      targets: [{transport: rdma, address: 'FD00:0::1', service: 4421}]
      mount: /srv/kv
""")
    assert cfg.initiator is not None
    [ref] = cfg.initiator.pools[0].targets
    assert FabricsAddress.from_config(ref) == FabricsAddress("rdma", "fd00::1", "4421")


def test_from_discovery() -> None:
    record = {"trtype": "TCP", "adrfam": "ipv6", "traddr": " fd00:0::1 ", "trsvcid": "04420",
              "subnqn": "nqn.2026-11.a:b"}
    assert FabricsAddress.from_discovery(record) == FabricsAddress("tcp", "fd00::1", "4420")
    # nvme-cli prints a record without a service for some transports; a number is text
    assert FabricsAddress.from_discovery({"trtype": "fc", "traddr": "nn-0x1:pn-0x2"}).trsvcid == ""
    assert FabricsAddress.from_discovery({"trtype": "tcp", "traddr": "10.0.0.1",
                                          "trsvcid": 4420}).trsvcid == "4420"


@pytest.mark.parametrize(("text", "fields"), [
    # 6.1's nvme-tcp: what nvme-cli passed, then the socket's local address
    ("traddr=127.0.0.1,trsvcid=4420,src_addr=127.0.0.1",
     ("127.0.0.1", "4420", None, None, "127.0.0.1")),
    ("traddr=fd00::1,trsvcid=4420,host_traddr=fd00::5,host_iface=eth1,src_addr=fd00::5\n",
     ("fd00::1", "4420", "eth1", "fd00::5", "fd00::5")),
    ("traddr=10.0.0.1 trsvcid=4420", ("10.0.0.1", "4420", None, None, None)),  # nvme-cli 1.x
    ("traddr=nn-0x20000090FA:pn-0x10,host_traddr=nn-0x1:pn-0x2",  # FC: no service
     ("nn-0x20000090fa:pn-0x10", None, None, "nn-0x1:pn-0x2", None)),
    ("0000:00:0b.0", (None, None, None, None, None)),  # PCIe: a bare PCI address
])
def test_from_sysfs(text: str, fields: tuple) -> None:
    a = FabricsAddress.from_sysfs("tcp", text)
    assert (a.traddr, a.trsvcid, a.host_iface, a.host_traddr, a.src_addr) == fields


# ------------------------------------------------------------------ properties

ips = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6))
ifaces = st.none() | st.from_regex(r"[A-Za-z][A-Za-z0-9_.-]{0,14}", fullmatch=True)
addresses = st.builds(
    FabricsAddress, st.sampled_from(["tcp", "rdma"]), ips.map(str),
    st.integers(1, 65535).map(str), ifaces, st.none() | ips.map(str), st.none() | ips.map(str))


def spellings(ip: str) -> st.SearchStrategy[str]:
    """Other texts of the same IP address (an IPv6 one written out, upper case, in [])."""
    addr = ipaddress.ip_address(ip)
    if addr.version == 4:
        return st.just(ip)
    return st.sampled_from([ip, addr.exploded, addr.exploded.upper(), f"[{ip}]"])


def sysfs_text(a: FabricsAddress, draw: st.DrawFn) -> str:
    """``a`` as the kernel shows it (nvmf_get_address: what nvme-cli passed, spelled any
    way; then src_addr), fields separated by ',' or by spaces."""
    parts = [f"traddr={draw(spellings(a.traddr or ''))}",
             f"trsvcid={'0' * draw(st.integers(0, 2))}{a.trsvcid}"]
    if a.host_traddr:
        parts.append(f"host_traddr={draw(spellings(a.host_traddr))}")
    if a.host_iface:
        parts.append(f"host_iface={a.host_iface}")
    if a.src_addr:
        parts.append(f"src_addr={a.src_addr}")
    return draw(st.sampled_from([",", " "])).join(parts) + draw(st.sampled_from(["", "\n"]))


@given(addresses, st.data())
def test_a_sysfs_address_reads_back_as_the_address(a: FabricsAddress, data: st.DataObject
                                                   ) -> None:
    text = sysfs_text(a, data.draw)
    found = FabricsAddress.from_sysfs(data.draw(st.sampled_from([a.transport,
                                                                  a.transport.upper()])), text)
    assert found == a and found.src_addr == a.src_addr
    assert a.same_endpoint(found) and a.endpoint.same_endpoint(found)


@given(addresses)
def test_normalisation_is_idempotent(a: FabricsAddress) -> None:
    again = FabricsAddress(*dataclasses.astuple(a))
    assert again == a and dataclasses.astuple(again) == dataclasses.astuple(a)


@given(addresses, addresses)
def test_equal_addresses_are_the_same_endpoint_both_ways(a: FabricsAddress,
                                                         b: FabricsAddress) -> None:
    if a == b:
        assert a.same_endpoint(b) and b.same_endpoint(a)
    # without a host side wanted, only the endpoint counts
    assert a.endpoint.same_endpoint(b) == (a.endpoint == b.endpoint)


@given(st.text(alphabet="[]:.%0123456789abcdefABCDEF \t", max_size=24) | st.text(max_size=24))
def test_canonical_text_is_a_fixed_point(text: str) -> None:
    """Normalising again changes nothing (a replace() normalises what it copies again)."""
    t = canonical_traddr(text)
    assert canonical_traddr(t) == t
    s = canonical_service(text)
    assert canonical_service(s) == s


@pytest.mark.parametrize("text", ["[[::1]]", "[fd00::1", "[10.0.0.1]"])
def test_brackets_go_only_around_an_address(text: str) -> None:
    assert canonical_traddr(canonical_traddr(text)) == canonical_traddr(text)

"""``nvme discover``: the discovery log page of a storage host's port, as this host.

nvme-cli 2.3 prints ``{"genctr", "records": [...]}``; other releases add ``"device"``
and record fields (``eflags``); spacing differs (fixtures under
tests/unit/initiator/fixtures/). Besides the NVM subsystems a record may be the port's
own discovery subsystem or a referral to another storage host's discovery port
(:attr:`DiscoveryEntry.is_referral`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...fabrics import DISCOVERY_NQN, FabricsAddress
from ...log import get_logger
from ...system.run import CommandTimeout, Runner
from .failures import TransientConnectError, run_fabrics, timeout_hint
from .kmsg import KernelLogReader
from .options import check_fabrics_values, host_args
from .output import NVME, extract_json, get, int_of, list_of, text_of

log = get_logger("initiator.discovery")

#: The discovery log page (log identifier 0x70) and the bytes of its header read to
#: acknowledge a discovery-log-change AEN (genctr, numrec, recfmt).
DISCOVERY_LOG_ID = "0x70"
ACK_LENGTH = 16


@dataclass(frozen=True)
class DiscoveryEntry:
    """One record of a discovery log page."""

    #: its ``trtype``, ``traddr`` and ``trsvcid``
    address: FabricsAddress
    adrfam: str | None
    subtype: str
    subnqn: str
    portid: int | None = None
    treq: str | None = None
    sectype: str | None = None
    eflags: str | None = None

    @property
    def is_nvm_subsystem(self) -> bool:
        """An I/O subsystem (not the discovery controller itself or a referral)."""
        sub = self.subtype.lower()
        if "discovery" in sub or "referral" in sub:
            return False
        return self.subnqn != DISCOVERY_NQN

    @property
    def is_referral(self) -> bool:
        """A referral to another discovery service (its address is where to read next):
        subtype 1, which libnvme prints "discovery subsystem referral" and nvme-cli 1.x
        "discovery subsystem". The "current discovery subsystem" record (the port read
        itself, subtype 3) is none."""
        sub = " ".join(self.subtype.lower().split())
        if "current" in sub:
            return False
        return "referral" in sub or sub in ("discovery subsystem", "1")


def parse_discover(text: str) -> list[DiscoveryEntry]:
    """Records of ``nvme discover -o json``; records without address or NQN are skipped."""
    data = extract_json(text)
    records = get(data, "records") if isinstance(data, Mapping) else data
    out = []
    for item in list_of(records):
        if not isinstance(item, Mapping):
            continue
        rec = {str(k).lower(): v for k, v in item.items()}
        traddr, subnqn = text_of(rec.get("traddr")), text_of(rec.get("subnqn"))
        if not traddr or not subnqn:
            continue
        out.append(DiscoveryEntry(
            address=FabricsAddress.from_discovery(rec), adrfam=text_of(rec.get("adrfam")),
            subtype=text_of(rec.get("subtype")) or "", subnqn=subnqn,
            portid=int_of(rec.get("portid")), treq=text_of(rec.get("treq")),
            sectype=text_of(rec.get("sectype")), eflags=text_of(rec.get("eflags")),
        ))
    return out


def discover(run: Runner, kernel_log: KernelLogReader, transport: str, traddr: str,
             trsvcid: str | int, *, timeout: float, hostnqn: str | None = None,
             hostid: str | None = None, host_traddr: str | None = None,
             host_iface: str | None = None, tls: bool = False,
             device: str | None = None) -> list[DiscoveryEntry]:
    """The discovery log of ``traddr:trsvcid`` as this host (it lists only what we may
    use); ``tls``: over NVMe/TCP TLS (a port with TLS required asks it of discovery).

    ``device``: a connected discovery controller of this host at that port (``nvme3``)
    to read it through. Without one, a controller is made for the read and removed
    (``--force``): nvme-cli would otherwise reuse any persistent discovery controller at
    that address, whatever host NQN it was made with, and read the log another host sees
    (found on the real kernel with another tool's controller)."""
    check_fabrics_values(transport=transport, traddr=traddr, trsvcid=trsvcid,
                         hostnqn=hostnqn, hostid=hostid, host_traddr=host_traddr,
                         host_iface=host_iface)
    if device is not None and not (device.startswith("nvme") and device[4:].isdigit()):
        raise ValueError(f"not a controller name: {device!r}")
    argv = [NVME, "discover", "--transport", transport, "--traddr", traddr,
            "--trsvcid", str(trsvcid), *host_args(hostnqn, hostid, host_traddr, host_iface),
            *(["--tls"] if tls else []),
            *(["--device", device] if device else ["--force"]), "--output-format", "json"]
    if device is not None:
        acknowledge(run, device, timeout)
    result = run_fabrics(run, kernel_log, argv, "discover", timeout)
    return parse_discover(result.stdout)


def acknowledge(run: Runner, device: str, timeout: float) -> None:
    """Acknowledge discovery-log-change AENs on this host's discovery controller
    ``device``: a Get Log Page of the log's header with Retain Asynchronous Event clear.

    nvmet sends a controller the next such AEN only after a read of the log that does
    not retain the event, and nvme-cli 2.3's ``nvme discover`` keeps it retained once
    the log is larger than one 4 KiB transfer (three records and the port's own; found
    on the real kernel: a referral removed after that sent no AEN, and a storage host
    that drained was noticed only by the next full pass). Done before the read, so a
    change between the two still sends its AEN. A failure is only logged: the read
    that follows says what is wrong with the controller; a time-out fails the read as
    its own would (a controller that does not answer is not asked twice)."""
    argv = [NVME, "get-log", f"/dev/{device}", f"--log-id={DISCOVERY_LOG_ID}",
            f"--log-len={ACK_LENGTH}"]
    try:
        result = run(argv, timeout=timeout, check=False)
    except CommandTimeout as exc:
        raise TransientConnectError(f"nvme get-log timed out after {exc.timeout:g}s",
                                    timeout_hint()) from None
    if result.returncode != 0:
        log.info("discovery AEN not acknowledged", device=device,
                 error=(result.stderr or result.stdout).strip()[-200:])


"""Local drive health: ``nvme smart-log -o json`` normalised across tool versions.

Shapes seen in recorded output (fixtures and sources in tests/unit/health/fixtures/):

- nvme-cli 2.x (2.3 on Debian 12): 128-bit counters as decimal *strings*
  (``"media_errors":"0"``), ``temperature`` in **kelvin** as a number.
- nvme-cli 1.x: the same keys, counters as JSON numbers.
- nvme-cli ``-H``/verbose JSON: ``critical_warning`` is an object whose ``value``
  holds the bitmap; some 2.x sources also spell ``Temperature`` capitalised.
- smartctl ``-j``: the log is under ``nvme_smart_health_information_log`` with
  ``available_spare``/``available_spare_threshold``/``percentage_used`` and the
  temperature in **degrees Celsius**.

Everything comes out as a :class:`~agent.health.snapshot.DriveHealth` with the
temperature in °C. Only local (``transport == pcie``) controllers are read: a
fabrics controller's smart-log is synthetic, media health lives on the target.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import KvagentError
from ..log import get_logger
from ..system.run import Runner
from .snapshot import DriveHealth

log = get_logger("health.smart")

KELVIN_OFFSET = 273.15
SMART_LOG_TIMEOUT = 15.0

_ALIASES = {
    "critical_warning": ("critical_warning",),
    "temperature": ("temperature",),
    "available_spare": ("avail_spare", "available_spare"),
    "available_spare_threshold": ("spare_thresh", "available_spare_threshold"),
    "percent_used": ("percent_used", "percentage_used"),
    "media_errors": ("media_errors",),
    "error_log_entries": ("num_err_log_entries",),
    "power_on_hours": ("power_on_hours",),
    "unsafe_shutdowns": ("unsafe_shutdowns",),
}
_TEMP_RE = re.compile(
    r"^\s*(-?[0-9]+(?:\.[0-9]+)?)\s*(°\s*C|C|Celsius|K|Kelvin)?\s*(?:\(.*\))?\s*$", re.IGNORECASE
)


class SmartLogError(KvagentError):
    """A smart-log document that kvagent cannot read."""


def _lookup(log_: Mapping[str, Any], field: str) -> Any:
    lowered = {str(k).lower(): v for k, v in log_.items()}
    for key in _ALIASES[field]:
        if key in lowered:
            return lowered[key]
    return None


def _integer(value: Any, key: str) -> int | None:
    """An integer from a JSON number or a decimal string (nvme-cli prints 128-bit values so)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise SmartLogError(f"smart-log field {key!r} is a boolean, expected a number")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SmartLogError(f"smart-log field {key!r} is {value}, expected a number")
        return round(value)
    if isinstance(value, str):
        text = value.strip().replace(",", "").replace("_", "")
        if re.fullmatch(r"-?[0-9]+", text):
            return int(text)
        if re.fullmatch(r"-?[0-9]+(\.[0-9]+)?(e\+?[0-9]+)?", text, re.IGNORECASE):
            return round(float(text))
    if isinstance(value, Mapping):  # verbose critical_warning: {"value": 0, ...}
        for k in ("value", "Value"):
            if k in value:
                return _integer(value[k], key)
    raise SmartLogError(f"smart-log field {key!r} is {value!r}, expected a number")


def _temperature_celsius(value: Any, celsius: bool) -> float | None:
    """°C from a raw temperature (kelvin for nvme-cli, °C for smartctl, or '<n> <unit>')."""
    if value is None:
        return None
    unit = "C" if celsius else "K"
    if isinstance(value, str):
        m = _TEMP_RE.match(value)
        if not m:
            raise SmartLogError(f"smart-log temperature {value!r} is not a number with a unit")
        number = float(m.group(1))
        if m.group(2):
            unit = "K" if m.group(2).upper().startswith("K") else "C"
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        raise SmartLogError(f"smart-log temperature is {value!r}, expected a number")
    if unit == "K":
        if number <= 0:
            return None  # 0 K: the controller reports no temperature (fabrics, some bridges)
        return round(number - KELVIN_OFFSET, 2)
    return round(number, 2)


def parse_smart_log(data: Mapping[str, Any] | str, *, device: str, model: str | None = None,
                    serial: str | None = None, firmware: str | None = None) -> DriveHealth:
    """Normalise one smart-log JSON document (parsed or text) into a DriveHealth.

    Raises :class:`SmartLogError` naming the field when the document is not a
    smart-log or a value is not a number.
    """
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise SmartLogError(f"smart-log output of {device} is not JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise SmartLogError(f"smart-log output of {device} is not a JSON object")
    celsius = False
    body: Mapping[str, Any] = data
    nested = data.get("nvme_smart_health_information_log")
    if isinstance(nested, Mapping):  # smartctl -j
        body, celsius = nested, True
        model = model or data.get("model_name")
        serial = serial or data.get("serial_number")
        firmware = firmware or data.get("firmware_version")
    values = {field: _lookup(body, field) for field in _ALIASES}
    if values["critical_warning"] is None or values["percent_used"] is None:
        raise SmartLogError(
            f"smart-log output of {device} has no critical_warning/percent_used: not a "
            f"SMART / Health log (keys: {', '.join(sorted(map(str, body))[:12]) or 'none'})"
        )
    return DriveHealth(
        device=device, model=model, serial=serial, firmware=firmware,
        critical_warning=_integer(values["critical_warning"], "critical_warning"),
        temperature_celsius=_temperature_celsius(values["temperature"], celsius),
        percent_used=_integer(values["percent_used"], "percent_used"),
        available_spare=_integer(values["available_spare"], "available_spare"),
        available_spare_threshold=_integer(values["available_spare_threshold"],
                                           "available_spare_threshold"),
        media_errors=_integer(values["media_errors"], "media_errors"),
        error_log_entries=_integer(values["error_log_entries"], "num_err_log_entries"),
        power_on_hours=_integer(values["power_on_hours"], "power_on_hours"),
        unsafe_shutdowns=_integer(values["unsafe_shutdowns"], "unsafe_shutdowns"),
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _natural(name: str) -> tuple[str, int]:
    m = re.match(r"^(\D*)(\d*)", name)
    assert m is not None
    return m.group(1), int(m.group(2) or -1)


def local_controllers(sysfs: str | Path = "/sys") -> list[Path]:
    """sysfs directories of local (PCIe) NVMe controllers, in nvme0, nvme1, ... order."""
    root = Path(sysfs) / "class" / "nvme"
    if not root.is_dir():
        return []
    found = [c for c in root.iterdir() if _read(c / "transport") == "pcie"]
    return sorted(found, key=lambda c: _natural(c.name))


def read_local_drives(runner: Runner, *, sysfs: str | Path = "/sys", dev: str | Path = "/dev",
                      timeout: float = SMART_LOG_TIMEOUT,
                      controllers: Sequence[Path] | None = None) -> tuple[DriveHealth, ...]:
    """The health of every local NVMe drive, one ``nvme smart-log`` each.

    ``controllers``: :func:`local_controllers` as read before (a hot-plug is a udev
    event, after which the agent reads them again); None: read now. A drive whose log
    cannot be read is returned with ``error`` set (never dropped, never healthy).
    """
    drives = []
    for ctrl in local_controllers(sysfs) if controllers is None else controllers:
        device = f"{Path(dev)}/{ctrl.name}"
        ident = {"model": _read(ctrl / "model") or None, "serial": _read(ctrl / "serial") or None,
                 "firmware": _read(ctrl / "firmware_rev") or None}
        try:
            result = runner(["nvme", "smart-log", device, "-o", "json"], timeout=timeout)
            drives.append(parse_smart_log(result.stdout, device=device, **ident))
        except KvagentError as exc:
            log.warning("cannot read smart-log", device=device, error=exc.message)
            drives.append(DriveHealth(device=device, **ident, error=exc.message))
    return tuple(drives)

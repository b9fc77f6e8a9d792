"""Dynamo KVBM's verdict on kvagent's env files (run as a file by the engine's Python).

KVBM's configuration is read by its Rust core (``kvbm/_core.abi3.so``), which needs NIXL
and CUDA to load and reads the variables only when a leader and its workers start: so
the binary is read, not run. Every variable kvagent writes must be one of its strings
(Rust packs string literals together, so a name counts when what follows it cannot
continue an upper-case name, or is another ``DYN_`` name). Values are held to how KVBM's code reads
them (ai-dynamo/dynamo, the source of the same names): ``DYN_KVBM_DISK_CACHE_GB`` with
``parse::<f64>()`` (unparsable: 0, the disk tier off) times 1_000_000_000 for one
instance, all its TP workers together; ``DYN_KVBM_DISK_DISABLE_O_DIRECT`` /
``DYN_KVBM_DISK_ZEROFILL_FALLBACK`` by presence (``std::env::var(..).is_ok()``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkkit

DIST = "kvbm"
DIR = "DYN_KVBM_DISK_CACHE_DIR"
SIZE = "DYN_KVBM_DISK_CACHE_GB"
SWITCHES = ("DYN_KVBM_DISK_DISABLE_O_DIRECT", "DYN_KVBM_DISK_ZEROFILL_FALLBACK")
#: Decimal GB: ``compute_num_blocks`` multiplies the f64 by 1_000_000_000.0.
GB = 1_000_000_000
#: The binary's own help text names the unit (``<size_in_gb>``).
UNIT_TEXT = b"DYN_KVBM_DISK_CACHE_GB=<size_in_gb>"
FALSE_WORDS = ("", "0", "false", "no", "off")


def core_binary(v: checkkit.Verdict) -> bytes:
    """The bytes of kvbm's Rust core, found without importing kvbm (that loads NIXL)."""
    try:
        spec = importlib.util.find_spec(DIST)
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError("no kvbm package on this Python's path")
        path = os.path.join(next(iter(spec.submodule_search_locations)), "_core.abi3.so")
        with open(path, "rb") as f:
            return f.read()
    except (ImportError, OSError) as exc:
        checkkit.fail_unavailable(v, "find kvbm/_core.abi3.so", exc)
    raise AssertionError("unreachable")  # pragma: no cover


def knows(binary: bytes, name: str) -> bool:
    """Whether ``name`` is one of the binary's string literals."""
    return re.search(re.escape(name.encode()) + rb"(?:(?![A-Z0-9_])|(?=DYN_))",
                     binary) is not None


def check_size(env: dict[str, str], p: checkkit.Payload, name: str,
               v: checkkit.Verdict) -> None:
    """Decimal GB, a whole number, above 0, and (times the instances sharing the file's
    directory) at most that directory's quota: every instance preallocates all of it
    in the directory its file names."""
    raw = env[SIZE]
    if not re.fullmatch(r"[0-9]+", raw):
        v.refuse(f"{name}: {SIZE}={raw!r} is not a whole number of GB: KVBM's parse::<f64>() "
                 "(older: an integer) reads anything else as 0, the disk tier off")
        return
    if int(raw) == 0:
        v.refuse(f"{name}: {SIZE}=0 turns KVBM's disk tier off")
        return
    cap = p.cap_of(env.get(DIR, ""))
    if cap is None:
        return  # outside the pool, or no directory: refused for that
    size = int(raw) * GB
    if size * p.data_parallel > cap:
        v.refuse(f"{name}: {SIZE}={raw} is {size} bytes per KVBM instance (decimal GB); "
                 f"{p.data_parallel} instance(s) in {env[DIR]} need {size * p.data_parallel}, "
                 f"more than its quota ({cap} bytes)")


def check_file(binary: bytes, p: checkkit.Payload, name: str, text: str,
               v: checkkit.Verdict) -> None:
    try:
        env = checkkit.parse_env(text)
    except ValueError as exc:
        v.refuse(f"{name}: not an env file: {exc}")
        return
    for key in sorted(env):
        if not knows(binary, key):
            v.refuse(f"{name}: unknown variable {key}: not in kvbm/_core.abi3.so")
    for key in (DIR, SIZE):
        if key not in env:
            v.refuse(f"{name}: missing required variable {key}")
    if SIZE in env:
        check_size(env, p, name, v)
    if DIR in env and checkkit.owning_directory(env[DIR], p.directories) is None:
        v.refuse(f"{name}: {DIR}={env[DIR]!r} is outside the pool's engine directories "
                 f"{p.directories}")
    for key in SWITCHES:
        if key in env and env[key].strip().lower() in FALSE_WORDS:
            v.refuse(f"{name}: {key}={env[key]!r}: KVBM only checks that it is set, so this "
                     "switches it ON; leave it out instead")


def main() -> None:
    p = checkkit.read_payload()
    v = checkkit.Verdict()
    binary = core_binary(v)
    v.engine_version = checkkit.dist_version(DIST)
    unit = "names the unit <size_in_gb>" if UNIT_TEXT in binary else "does not name the unit"
    v.method = (f"strings of kvbm/_core.abi3.so ({DIST} {v.engine_version}; not imported: it "
                f"needs NIXL and CUDA): each variable name looked up there (the binary {unit}); "
                "values held to KVBM's source for the same names: DYN_KVBM_DISK_CACHE_GB "
                "parse::<f64>() x 1e9 per instance (leader.rs compute_num_blocks), O_DIRECT/"
                "zero-fill switches by presence (storage/disk.rs)")
    for name, text in sorted(p.files.items()):
        if not name.endswith(".env"):
            v.refuse(f"{name}: KVBM reads only its environment; kvagent renders env files")
            continue
        check_file(binary, p, name, text, v)
    if not p.files:
        v.refuse("no env file rendered")
    checkkit.emit(v)


if __name__ == "__main__":
    checkkit.run(main)

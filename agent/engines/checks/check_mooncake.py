"""Mooncake's verdict on kvagent's env files (run as a file by the engine's Python).

Two halves of Mooncake read them. The Python half is imported and run:
``mooncake.mooncake_config.MooncakeConfig.load_from_env`` on each file's environment
(``MOONCAKE_OFFLOAD_ENABLED`` -> ``enable_ssd_offload``, ``MOONCAKE_OFFLOAD_FILE_STORAGE_PATH``
-> ``ssd_offload_path``). The native half (``FileStorageConfig`` and
``BucketBackendConfig::FromEnvironment`` in ``mooncake/store.so``) needs libcuda to load,
so it is read, not run: the variable names it knows are the ``MOONCAKE_*``/``MC_*``
strings of the binary, and values are held to how that code parses them (int64 bytes,
``fifo``/``lru``, ``ValidatePath``'s rules). Each client must own its directory: the
bucket backend scans its path recursively at start, deletes ``.bucket`` files it has no
``.meta`` for and evicts by its own total, so no client's path may be inside another's.
"""

from __future__ import annotations

import ast
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkkit

DIST = "mooncake-transfer-engine"
ENABLED = "MOONCAKE_OFFLOAD_ENABLED"
PATH = "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"
TOTAL = "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"
#: (current name, older fallback) pairs BucketBackendConfig::FromEnvironment reads.
BUCKET_SIZE = ("MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE", "MOONCAKE_BUCKET_MAX_TOTAL_SIZE")
BUCKET_POLICY = ("MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY", "MOONCAKE_BUCKET_EVICTION_POLICY")
POLICIES = ("fifo", "lru")  # anything else: BucketEvictionPolicy::NONE, silently
INT64_MAX = 2**63 - 1
#: What load_from_env needs besides kvagent's variables (the operator's master address).
OPERATOR_ENV = {"MOONCAKE_MASTER": "operator-master.invalid:50051"}


def binary_names(path: str) -> set[str]:
    """The environment variable names in a native library's strings."""
    with open(path, "rb") as f:
        data = f.read()
    return {m.decode() for m in re.findall(rb"(?<![A-Za-z0-9_])(?:MOONCAKE|MC)_[A-Z0-9_]+",
                                           data)}


def python_names(path: str) -> set[str]:
    """Names a Python module reads with os.getenv / os.environ.get (ast)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and _reads_environ(node.func) and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
    return names


def _reads_environ(func: ast.expr) -> bool:
    """``os.getenv`` or ``os.environ.get``."""
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr == "getenv":
        return isinstance(func.value, ast.Name) and func.value.id == "os"
    return (func.attr == "get" and isinstance(func.value, ast.Attribute)
            and func.value.attr == "environ")


def load_engine(v: checkkit.Verdict):
    """The engine's config module and the names it and the native store know."""
    try:
        from mooncake import mooncake_config
    except Exception as exc:  # any import failure means unavailable
        checkkit.fail_unavailable(v, "import mooncake.mooncake_config", exc)
    v.engine_version = checkkit.dist_version(DIST)
    store = os.path.join(os.path.dirname(mooncake_config.__file__), "store.so")
    try:
        native = binary_names(store)
    except OSError as exc:
        checkkit.fail_unavailable(v, "read mooncake/store.so", exc)
    known = native | python_names(mooncake_config.__file__)
    v.method = (f"imported mooncake.mooncake_config ({DIST} {v.engine_version}) and called "
                f"MooncakeConfig.load_from_env on each env file; read the {len(native)} "
                "MOONCAKE_*/MC_* names in the strings of mooncake/store.so (the native "
                "FileStorageConfig/BucketBackendConfig::FromEnvironment) and held values to "
                "how that code parses them (int64 bytes, fifo/lru, ValidatePath)")
    return mooncake_config, known, native


def run_load_from_env(mc, env: dict[str, str], v: checkkit.Verdict, name: str):
    """MooncakeConfig.load_from_env under exactly ``env`` (plus the operator's master)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update({k: x for k, x in saved.items()
                       if not k.startswith(("MOONCAKE_", "MC_"))})
    os.environ.update(OPERATOR_ENV)
    os.environ.update(env)
    try:
        with checkkit.engine_speaks(v.messages):
            return mc.MooncakeConfig.load_from_env()
    except Exception as exc:  # the engine's own refusal
        v.messages.append(f"{name}: {type(exc).__name__}: {exc}")
        v.refuse(f"{name}: MooncakeConfig.load_from_env refused it: {exc}")
        return None
    finally:
        os.environ.clear()
        os.environ.update(saved)


def int64_bytes(env: dict[str, str], key: str, name: str, v: checkkit.Verdict) -> int | None:
    """A size the native store reads as int64 (anything else: a warning and its default)."""
    raw = env.get(key)
    if raw is None:
        return None
    if not re.fullmatch(r"[0-9]+", raw) or int(raw) > INT64_MAX:
        v.refuse(f"{name}: {key}={raw!r} is not whole bytes (int64): Mooncake warns "
                 "'invalid value' and falls back to its default")
        return None
    if int(raw) == 0:
        v.refuse(f"{name}: {key}=0: Mooncake reads 0 as no limit (total_size_limit is "
                 "refused, the bucket threshold becomes 90% of the filesystem)")
        return None
    return int(raw)


def check_names(env: dict[str, str], known: set[str], name: str, v: checkkit.Verdict) -> None:
    for key in sorted(set(env) - known):
        v.refuse(f"{name}: unknown variable {key}: neither mooncake_config.py nor store.so "
                 "reads it")
    for key in (ENABLED, PATH, TOTAL):
        if key not in env:
            v.refuse(f"{name}: missing required variable {key}")
    if not any(k in env for k in BUCKET_SIZE):
        v.refuse(f"{name}: missing required variable {BUCKET_SIZE[0]}: without it the bucket "
                 "backend evicts only at 90% of the filesystem, past the directory's quota")
    for current, older in (BUCKET_SIZE, BUCKET_POLICY):
        if current in env and older in env and env[current] != env[older]:
            v.refuse(f"{name}: {current}={env[current]!r} but {older}={env[older]!r}: the "
                     "fallback is ignored while the current name is set")
    for key in BUCKET_POLICY:
        if key in env and env[key] not in POLICIES:
            v.refuse(f"{name}: {key}={env[key]!r} is not fifo or lru: Mooncake silently "
                     "turns eviction off")


def check_path(path: str, p: checkkit.Payload, name: str, v: checkkit.Verdict) -> None:
    """ValidatePath's rules, and the path must be in the pool and exist before start."""
    if not os.path.isabs(path) or ".." in path.split("/"):
        v.refuse(f"{name}: {PATH}={path!r}: Mooncake refuses a relative path or '..'")
    elif checkkit.owning_directory(path, p.directories) is None:
        v.refuse(f"{name}: {PATH}={path!r} is outside the pool's engine directories "
                 f"{p.directories}")
    elif os.path.normpath(path) not in p.directories + p.subdirectories:
        v.refuse(f"{name}: {PATH}={path!r} is neither an engine directory nor one kvagent "
                 "creates: Mooncake refuses a storage path that does not exist")


def check_file(mc, known: set[str], p: checkkit.Payload, name: str, text: str,
               v: checkkit.Verdict) -> tuple[str, int] | None:
    """Check one env file; its (storage path, size) when both can be read."""
    try:
        env = checkkit.parse_env(text)
    except ValueError as exc:
        v.refuse(f"{name}: not an env file: {exc}")
        return None
    check_names(env, known, name, v)
    cfg = run_load_from_env(mc, env, v, name) if ENABLED in env else None
    if cfg is not None and not cfg.enable_ssd_offload:
        v.refuse(f"{name}: {ENABLED}={env[ENABLED]!r} reads as enable_ssd_offload=False")
    path = env.get(PATH)
    if path is None:
        return None
    if cfg is not None and cfg.ssd_offload_path != path:
        v.refuse(f"{name}: load_from_env read ssd_offload_path={cfg.ssd_offload_path!r}")
    check_path(path, p, name, v)
    sizes = [int64_bytes(env, k, name, v) for k in (TOTAL, *BUCKET_SIZE)]
    return path, max((s for s in sizes if s is not None), default=0)


def check_sizes(clients: dict[str, tuple[str, int]], p: checkkit.Payload,
                v: checkkit.Verdict) -> None:
    """Each client at most its directory's cap divided among the ranks; all clients of a
    directory together at most its cap; no client's directory inside another's."""
    totals: dict[str, int] = {}
    for name, (path, size) in sorted(clients.items()):
        directory = checkkit.owning_directory(path, p.directories)
        if directory is None:
            continue
        cap = p.cap_of(path) or 0
        if size > cap // p.ranks:
            v.refuse(f"{name}: {size} bytes for one Mooncake client exceeds the quota of "
                     f"{directory} ({cap} bytes) divided among its {p.ranks} rank(s) "
                     f"({cap // p.ranks})")
        totals[directory] = totals.get(directory, 0) + size
    for directory, total in sorted(totals.items()):
        cap = p.directory_caps[p.directories.index(directory)]
        if total > cap:
            v.refuse(f"the Mooncake clients in {directory} may fill {total} bytes together, "
                     f"more than its quota ({cap} bytes)")
    paths = sorted((os.path.normpath(path), name) for name, (path, _) in clients.items())
    for i, (a, na) in enumerate(paths):
        for b, nb in paths[i + 1:]:
            if b == a or b.startswith(a.rstrip("/") + "/"):
                v.refuse(f"{na} and {nb} share storage ({a}, {b}): Mooncake's bucket backend "
                         "scans its path recursively and deletes and evicts what it finds")


def main() -> None:
    p = checkkit.read_payload()
    v = checkkit.Verdict()
    mc, known, _ = load_engine(v)
    clients: dict[str, tuple[str, int]] = {}
    for name, text in sorted(p.files.items()):
        if not name.endswith(".env"):
            v.refuse(f"{name}: Mooncake reads only its environment; kvagent renders env files")
            continue
        found = check_file(mc, known, p, name, text, v)
        if found is not None:
            clients[name] = found
    check_sizes(clients, p, v)
    if not p.files:
        v.refuse("no env file rendered")
    checkkit.emit(v)


if __name__ == "__main__":
    checkkit.run(main)

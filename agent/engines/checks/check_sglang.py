"""SGLang's verdict on kvagent's ``sglang.args`` and env files (run as a file by SGLang's Python).

SGLang's modules are imported by their own names from its installed files, but
``sglang/__init__.py`` is not run (it imports the whole runtime: transformers, FlashInfer,
the language frontend): ``sglang`` is registered as a bare package over its own directory.

- Arguments: ServerArgs' own argparse (``ServerArgs.add_cli_args``) parses ``sglang.args``
  after ``--model-path dummy``; ``ServerArgs.from_cli_args`` builds the record and the
  hierarchical-cache resolution hooks run on it (``hicache_hook.handle_hicache_ratio_default``
  and ``handle_hicache``, as ``resolve_once`` does; the rest of the pipeline loads the model
  config). A warning from them is a value SGLang rewrote: refused.
- Env files: every name must be an ``Envs`` field (``sglang/srt/environ.py``), a variable
  the backend's module reads with ``os.getenv`` (ast), or, for the Mooncake backend, a
  ``MOONCAKE_*`` name in the strings of Mooncake's native ``mooncake/store.so`` (it reads the
  offload sizes itself). Values are read by SGLang's own code under exactly that
  environment: the file backend through ``envs`` and ``LRUFileEvictor._load_config``
  (``_parse_size_to_bytes``); the Mooncake backend through ``MooncakeStoreConfig.load_from_env``
  and the rank-subdirectory expression of ``MooncakeStore.__init__``, both taken from
  ``mooncake_store.py`` with ast (the module imports Triton kernels and Mooncake's native
  client). Mooncake's byte sizes are held to how its native code parses them (int64).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import re
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkkit

DIST = "sglang"
ARGS_FILE = "sglang.args"
DUMMY_MODEL = ["--model-path", "dummy"]
BACKENDS = ("file", "mooncake")
FILE_DIR = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"
FILE_MAX = "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"
MC_SWITCH = "MOONCAKE_ENABLE_SSD_OFFLOAD"
MC_PATH = "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"
MC_SIZES = ("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE")
MC_POLICY = "MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY"
REQUIRED = {"file": (FILE_DIR, FILE_MAX), "mooncake": (MC_SWITCH, MC_PATH, *MC_SIZES)}
#: Names that belong to the other backend (SGLang would ignore them).
FOREIGN = {"file": ("MOONCAKE_",), "mooncake": ("SGLANG_HICACHE_FILE_BACKEND_",)}
POLICIES = ("fifo", "lru")  # Mooncake: anything else is no eviction, silently
INT64_MAX = 2**63 - 1
#: What load_from_env needs besides kvagent's variables (the operator's master address).
OPERATOR_ENV = {"MOONCAKE_MASTER": "operator-master.invalid:50051"}
MOONCAKE_STORE = "srt/mem_cache/storage/mooncake_store/mooncake_store.py"
#: Top-level names of mooncake_store.py that MooncakeStoreConfig needs.
CONFIG_NAMES = {"DEFAULT_TENANT_ID", "_parse_global_segment_size", "_normalize_tenant_id",
                "MooncakeStoreConfig"}


@dataclass
class Engine:
    """SGLang's code the checker runs."""

    root: str
    server_args: Any
    record_fields: Any
    hicache_hook: Any
    resolving_view: Any
    environ: Any
    evictor: Any
    storage_config: Any


# ------------------------------------------------------------------ loading SGLang
def bare_package(v: checkkit.Verdict) -> str:
    """Register ``sglang`` over its installed directory without running its __init__."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        checkkit.fail_unavailable(v, "find sglang", ModuleNotFoundError("no sglang package"))
    pkg = types.ModuleType("sglang")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    sys.modules["sglang"] = pkg
    return pkg.__path__[0]


def load_engine(v: checkkit.Verdict) -> Engine:
    """Import SGLang's argument, environment and file-backend modules."""
    root = bare_package(v)
    names = ("sglang.srt.server_args", "sglang.srt.arg_groups.arg_utils",
             "sglang.srt.arg_groups.hicache_hook", "sglang.srt.arg_groups.overrides",
             "sglang.srt.environ", "sglang.srt.mem_cache.storage.file.lru_file_evictor",
             "sglang.srt.mem_cache.hicache_storage")
    try:
        mods = [importlib.import_module(n) for n in names]
    except Exception as exc:  # any import failure means unavailable
        checkkit.fail_unavailable(v, "import SGLang's modules", exc)
    v.engine_version = checkkit.dist_version(DIST) or _package_version()
    sa, arg_utils, hook, overrides, environ, lru, storage = mods
    return Engine(root, sa.ServerArgs, arg_utils.record_fields, hook, overrides.resolving_view,
                  environ, lru.LRUFileEvictor, storage.HiCacheStorageConfig)


def _package_version() -> str | None:
    try:
        return importlib.import_module("sglang.version").__version__
    except Exception:  # no version: say so, judge anyway
        return None


def method(v: checkkit.Verdict, backend: str) -> str:
    base = (f"loaded sglang {v.engine_version} from its files without running "
            "sglang/__init__.py: parsed sglang.args (after --model-path dummy) with the "
            "argparse of ServerArgs.add_cli_args, built ServerArgs.from_cli_args and ran "
            "hicache_hook.handle_hicache_ratio_default/handle_hicache; read each env file "
            "under exactly its environment through sglang.srt.environ.envs")
    if backend == "mooncake":
        return (base + ", MooncakeStoreConfig.load_from_env and MooncakeStore.__init__'s "
                "rank-subdirectory expression (both taken from mooncake_store.py with ast: "
                "the module imports Triton kernels and Mooncake's native client); "
                "Mooncake's native names from the strings of mooncake/store.so")
    return base + " and LRUFileEvictor._load_config (_parse_size_to_bytes)"


# ------------------------------------------------------------------ arguments
def parse_server_args(eng: Engine, p: checkkit.Payload, v: checkkit.Verdict) -> str | None:
    """SGLang's parser, record and hicache hooks on ``sglang.args``; the backend it names."""
    text = p.files.get(ARGS_FILE)
    if text is None:
        v.refuse(f"missing {ARGS_FILE}: SGLang needs --enable-hierarchical-cache and "
                 "--hicache-storage-backend")
        return None
    argv = checkkit.parse_args(text)
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    eng.server_args.add_cli_args(parser)
    said: list[str] = []
    with checkkit.engine_speaks(said):
        try:
            ns = parser.parse_args([*DUMMY_MODEL, *argv])
        except SystemExit:
            ns = None
    v.messages.extend(said)
    if ns is None:
        why = next((m for m in reversed(said) if "error:" in m), "refused")
        v.refuse(f"{ARGS_FILE}: SGLang's argument parser refused {argv}: {why}")
        return None
    _exact_options(parser, argv, v)
    view = _resolve_hicache(eng, ns, v)
    if view is None:
        return None
    if view.enable_hierarchical_cache is not True:
        v.refuse(f"{ARGS_FILE}: SGLang reads enable_hierarchical_cache="
                 f"{view.enable_hierarchical_cache!r}: HiCache (and its storage tier) is off")
    if view.hicache_storage_backend not in BACKENDS:
        v.refuse(f"{ARGS_FILE}: SGLang reads hicache_storage_backend="
                 f"{view.hicache_storage_backend!r}, not one kvagent renders for {BACKENDS}")
        return None
    return view.hicache_storage_backend


def _exact_options(parser: argparse.ArgumentParser, argv: list[str],
                   v: checkkit.Verdict) -> None:
    """argparse accepts unique prefixes; kvagent must write SGLang's own option names."""
    for word in argv:
        option = word.split("=", 1)[0]
        if option.startswith("--") and option not in parser._option_string_actions:
            v.refuse(f"{ARGS_FILE}: {option} is not one of SGLang's options (argparse took "
                     "it as an abbreviation)")


def _resolve_hicache(eng: Engine, ns: argparse.Namespace, v: checkkit.Verdict) -> Any:
    """ServerArgs from the namespace, then the hierarchical-cache hooks; the resolved view."""
    said: list[str] = []
    view = None
    with checkkit.engine_speaks(said):
        try:
            args = eng.server_args.from_cli_args(ns)
            args._raw_input = {f.name: getattr(args, f.name)
                               for f in eng.record_fields(type(args))}
            args._resolved_overrides = []
            eng.hicache_hook.handle_hicache_ratio_default(args)
            eng.hicache_hook.handle_hicache(args)
            view = eng.resolving_view(args)
        except Exception as exc:  # the engine's own refusal
            said.append(f"{type(exc).__name__}: {exc}")
            v.refuse(f"{ARGS_FILE}: SGLang's server-argument resolution refused it: {exc}")
    v.messages.extend(said)
    for message in said:
        if message.startswith(("WARNING", "ERROR", "warning:")):
            v.refuse(f"{ARGS_FILE}: SGLang rewrote or warned about the arguments: {message}")
    return view


# ------------------------------------------------------------------ env files
def env_names(eng: Engine) -> set[str]:
    """Variables SGLang declares (Envs fields)."""
    return {f.name for f in vars(eng.environ.Envs).values()
            if isinstance(f, eng.environ.EnvField)}


def python_names(path: str) -> set[str]:
    """Names a module reads with os.getenv / os.environ.get (ast)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("getenv", "get") and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and ast.unparse(node.func) in ("os.getenv", "os.environ.get")):
            names.add(node.args[0].value)
    return names


def native_names(v: checkkit.Verdict) -> set[str]:
    """MOONCAKE_* names in the strings of Mooncake's native store (not imported: it needs
    the GPU libraries)."""
    spec = importlib.util.find_spec("mooncake")
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    path = next((os.path.join(d, "store.so") for d in dirs
                 if os.path.isfile(os.path.join(d, "store.so"))), None)
    if path is None:
        checkkit.fail_unavailable(v, "find mooncake/store.so (SGLang's Mooncake backend needs "
                                  "mooncake-transfer-engine)", ModuleNotFoundError("mooncake"))
    with open(path, "rb") as f:
        data = f.read()
    return {m.decode() for m in re.findall(rb"(?<![A-Za-z0-9_])MOONCAKE_[A-Z0-9_]+", data)}


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """The process environment as an SGLang started with ``env`` sees it."""
    saved = dict(os.environ)
    for key in list(os.environ):
        if key.startswith(("SGLANG_", "MOONCAKE_", "MC_")) or key == "LOCAL_HOSTNAME":
            del os.environ[key]
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def check_names(env: dict[str, str], known: set[str], deprecated: set[str], backend: str,
                name: str, v: checkkit.Verdict) -> None:
    for key in sorted(set(env) - known):
        v.refuse(f"{name}: unknown variable {key}: SGLang does not declare it (Envs) and its "
                 f"{backend} backend does not read it")
    for key in sorted(set(env) & deprecated):
        v.refuse(f"{name}: {key} is deprecated in SGLang (it warns)")
    for key in sorted(k for k in set(env) & known if k.startswith(FOREIGN[backend])):
        v.refuse(f"{name}: {key} is not read by the {backend} backend the arguments choose")
    for key in REQUIRED[backend]:
        if key not in env:
            v.refuse(f"{name}: missing required variable {key}")


def engine_reads(read, env: dict[str, str], name: str, v: checkkit.Verdict) -> Any:
    """Run SGLang's reading code under ``env``; a warning or exception refuses the file."""
    said: list[str] = []
    result = None
    with environment(env), checkkit.engine_speaks(said):
        try:
            result = read()
        except Exception as exc:  # the engine's own refusal
            said.append(f"{type(exc).__name__}: {exc}")
            v.refuse(f"{name}: SGLang refused it: {exc}")
    v.messages.extend(f"{name}: {m}" for m in said)
    for message in said:
        if message.startswith(("WARNING", "ERROR", "warning:")):
            v.refuse(f"{name}: SGLang warned while reading it (a value it converts or "
                     f"drops): {message}")
    return result


def check_place(path: str | None, key: str, p: checkkit.Payload, name: str,
                v: checkkit.Verdict) -> str | None:
    """The engine directory holding ``path`` (None, refused: outside the pool)."""
    if path is None:
        return None
    directory = checkkit.owning_directory(path, p.directories)
    if directory is None or os.path.normpath(path) != path:
        v.refuse(f"{name}: {key}={path!r} is outside the pool's engine directories "
                 f"{p.directories}")
        return None
    return directory


def check_size(size: int, directory: str, key: str, p: checkkit.Payload, name: str,
               v: checkkit.Verdict) -> None:
    """One rank's size at most the directory's cap divided among the ranks that share it."""
    cap = p.directory_caps[p.directories.index(directory)]
    if size > cap // p.ranks:
        v.refuse(f"{name}: {key} reads as {size} bytes per rank, more than the quota of "
                 f"{directory} ({cap} bytes) divided among its {p.ranks} rank(s) "
                 f"({cap // p.ranks})")


# ------------------------------------------------------------------ file backend
def check_file_backend(eng: Engine, env: dict[str, str], p: checkkit.Payload, name: str,
                       v: checkkit.Verdict) -> str | None:
    """HiCacheFile's directory and each rank's LRUFileEvictor cap; the directory."""
    envs = eng.environ.envs

    def read() -> tuple[str | None, int]:
        evictor = eng.evictor.__new__(eng.evictor)
        evictor._load_config({})
        return envs.SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR.get(), evictor.max_size_bytes

    got = engine_reads(read, env, name, v)
    if got is None:
        return None
    path, size = got
    directory = check_place(path, FILE_DIR, p, name, v)
    if directory is not None and path not in p.directories + p.subdirectories:
        v.refuse(f"{name}: {FILE_DIR}={path!r} is not a directory kvagent makes: only TP rank "
                 "0 creates a missing one, racing the others")
    if FILE_MAX in env and size <= 0:
        v.refuse(f"{name}: {FILE_MAX}={env[FILE_MAX]!r} reads as {size} bytes: SGLang's "
                 "LRUFileEvictor does not evict and the ranks fill the quota")
    if directory is not None and size > 0:
        check_size(size, directory, FILE_MAX, p, name, v)
    return path


# ------------------------------------------------------------------ mooncake backend
@dataclass
class MooncakeCode:
    """SGLang's Mooncake config loader and rank-subdirectory expression (from its source)."""

    config: Any
    rank_path: Any


def load_mooncake_code(eng: Engine, v: checkkit.Verdict) -> MooncakeCode:
    """MooncakeStoreConfig and MooncakeStore.__init__'s ``os.path.join(ssd_offload_path,
    <rank>)`` second argument, compiled from mooncake_store.py's ast."""
    path = os.path.join(eng.root, MOONCAKE_STORE)
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError) as exc:
        checkkit.fail_unavailable(v, f"read {MOONCAKE_STORE}", exc)
    body = [n for n in tree.body if _defines(n) & CONFIG_NAMES]
    module = types.ModuleType("kvagent_check_mooncake_store_config")
    sys.modules[module.__name__] = module  # dataclass looks its module up
    ns = module.__dict__
    ns.update({"os": os, "json": json, "dataclass": dataclass, "Optional": Optional,
               "Any": Any, "envs": eng.environ.envs, "logger": logging.getLogger(__name__)})
    try:  # SGLang's own installed source: the code its server would run
        exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), ns)  # noqa: S102
    except Exception as exc:  # the source no longer stands alone
        checkkit.fail_unavailable(v, f"load MooncakeStoreConfig from {MOONCAKE_STORE}", exc)
    expr = _rank_expression(tree)
    if "MooncakeStoreConfig" not in ns or expr is None:
        checkkit.fail_unavailable(v, f"find MooncakeStoreConfig and the rank subdirectory in "
                                  f"{MOONCAKE_STORE}", LookupError("source changed"))
    code = compile(ast.Expression(body=expr), path, "eval")

    def rank_path(storage_config: Any) -> str:
        return eval(code, {"storage_config": storage_config})  # noqa: S307 - SGLang's own

    return MooncakeCode(ns["MooncakeStoreConfig"], rank_path)


def _defines(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    return set()


def _rank_expression(tree: ast.Module) -> ast.expr | None:
    """In MooncakeStore.__init__: ``os.path.join(ssd_offload_path, <this>)``."""
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name == "MooncakeStore"):
            continue
        for node in ast.walk(cls):
            if (isinstance(node, ast.Call) and ast.unparse(node.func) == "os.path.join"
                    and len(node.args) == 2 and isinstance(node.args[0], ast.Name)
                    and node.args[0].id == "ssd_offload_path"):
                return node.args[1]
    return None


def rank_paths(eng: Engine, code: MooncakeCode, base: str, p: checkkit.Payload) -> list[str]:
    """The path SGLang hands Mooncake's setup for each TP rank of one server."""
    out = []
    for tp_rank in range(p.tensor_parallel):
        storage = eng.storage_config(
            tp_rank=tp_rank, tp_size=p.tensor_parallel, pp_rank=0, pp_size=1, attn_cp_rank=0,
            attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
            is_page_first_layout=True, model_name=None)
        out.append(os.path.join(base, code.rank_path(storage)))
    return out


def int64_bytes(env: dict[str, str], key: str, name: str, v: checkkit.Verdict) -> int | None:
    """A size Mooncake's native store reads as int64 bytes."""
    raw = env.get(key)
    if raw is None:
        return None
    if not re.fullmatch(r"[0-9]+", raw) or not 0 < int(raw) <= INT64_MAX:
        v.refuse(f"{name}: {key}={raw!r} is not a positive whole number of bytes (int64): "
                 "Mooncake warns and falls back to its default (2 TB / 90% of the disk)")
        return None
    return int(raw)


def check_mooncake_backend(eng: Engine, code: MooncakeCode, env: dict[str, str],
                           p: checkkit.Payload, name: str, v: checkkit.Verdict) -> list[str]:
    """load_from_env, each rank's offload path and the native sizes; the rank paths."""
    cfg = engine_reads(code.config.load_from_env, {**OPERATOR_ENV, **env}, name, v)
    if cfg is None:
        return []
    if cfg.enable_ssd_offload is not True:
        v.refuse(f"{name}: SGLang reads enable_ssd_offload={cfg.enable_ssd_offload!r} "
                 f"({MC_SWITCH}={env.get(MC_SWITCH)!r}): SSD offload stays off")
    base = cfg.ssd_offload_path
    directory = check_place(base, MC_PATH, p, name, v)
    if directory is None:
        return []
    paths = rank_paths(eng, code, base, p)
    for path in paths:
        if checkkit.owning_directory(path, p.directories) != directory:
            v.refuse(f"{name}: SGLang's rank path {path!r} leaves {directory}")
    for key in MC_SIZES:
        size = int64_bytes(env, key, name, v)
        if size is not None:
            check_size(size, directory, key, p, name, v)
    if env.get(MC_POLICY, "lru") not in POLICIES:
        v.refuse(f"{name}: {MC_POLICY}={env[MC_POLICY]!r} is not fifo or lru: Mooncake "
                 "silently turns eviction off")
    return paths


def check_rank_paths(paths: dict[str, list[str]], p: checkkit.Payload,
                     v: checkkit.Verdict) -> None:
    """Every Mooncake client owns its directory (its bucket backend scans it recursively
    and truncates files it resumes); kvagent makes no directory SGLang does not use."""
    flat = sorted((path, name) for name, ps in paths.items() for path in ps)
    for i, (a, na) in enumerate(flat):
        for b, nb in flat[i + 1:]:
            if b == a or b.startswith(a.rstrip("/") + "/"):
                v.refuse(f"{na} and {nb}: two Mooncake clients share {a} / {b}: they would "
                         "truncate and evict each other's bucket files")
    used = {path for path, _ in flat}
    for sub in p.subdirectories:
        if not any(u == sub or u.startswith(sub.rstrip("/") + "/") for u in used):
            v.refuse(f"subdirectory {sub} is not the path (or a parent of it) SGLang hands any "
                     "rank's Mooncake client")


# ------------------------------------------------------------------ main
def backend_of_env(files: dict[str, str]) -> str:
    return "mooncake" if any(MC_PATH in t for t in files.values()) else "file"


def check_env_files(eng: Engine, backend: str, p: checkkit.Payload,
                    v: checkkit.Verdict) -> None:
    known = env_names(eng) | python_names(os.path.join(eng.root, "srt/mem_cache/"
                                                       "hicache_storage.py"))
    code = None
    if backend == "mooncake":
        known |= native_names(v) | python_names(os.path.join(eng.root, MOONCAKE_STORE))
        code = load_mooncake_code(eng, v)
    deprecated = set(getattr(eng.environ, "_DEPRECATED_ENVS", {}))
    seen: dict[str, list[str]] = {}
    for name, text in sorted(p.files.items()):
        if name == ARGS_FILE:
            continue
        if not name.endswith(".env"):
            v.refuse(f"{name}: SGLang reads its storage settings from the environment")
            continue
        try:
            env = checkkit.parse_env(text)
        except ValueError as exc:
            v.refuse(f"{name}: not an env file: {exc}")
            continue
        check_names(env, known, deprecated, backend, name, v)
        if code is None:
            path = check_file_backend(eng, env, p, name, v)
            seen[name] = [path] if path else []
        else:
            seen[name] = check_mooncake_backend(eng, code, env, p, name, v)
    if not seen:
        v.refuse("no env file rendered: SGLang would use its defaults (/tmp/hicache, no cap)")
    if code is not None:
        check_rank_paths(seen, p, v)
    else:
        _one_server_per_directory(seen, v)


def _one_server_per_directory(seen: dict[str, list[str]], v: checkkit.Verdict) -> None:
    """Two env files for one directory would double its ranks past the cap."""
    by_path: dict[str, str] = {}
    for name, paths in sorted(seen.items()):
        for path in paths:
            if path in by_path:
                v.refuse(f"{by_path[path]} and {name} both point SGLang at {path}: their ranks "
                         "together exceed its quota")
            by_path[path] = name


def main() -> None:
    p = checkkit.read_payload()
    v = checkkit.Verdict()
    eng = load_engine(v)
    backend = parse_server_args(eng, p, v) or backend_of_env(p.files)
    v.method = method(v, backend)
    check_env_files(eng, backend, p, v)
    checkkit.emit(v)


if __name__ == "__main__":
    checkkit.run(main)

"""LMCache's verdict on kvagent's ``lmcache.yaml`` (run as a file by the engine's Python).

What runs, all of it LMCache's own code:

- its config loader, imported: ``LMCacheEngineConfig.from_file`` then
  ``update_config_from_env`` (which calls ``validate``), as vLLM's integration
  (``lmcache.integration.vllm.utils.lmcache_get_or_create_config``) loads
  ``LMCACHE_CONFIG_FILE``; every warning it logs (unknown or deprecated key, a value its
  converter fails on) refuses the render;
- ``PathSharder`` (``lmcache/v1/storage_backend/path_sharder.py``), imported, or loaded
  from its file where its package's ``__init__`` cannot import (it pulls in every storage
  backend): the paths each worker's LocalDiskBackend would use;
- from ``lmcache/v1/storage_backend/__init__.py`` (``CreateStorageBackends``) the condition
  under which a LocalDiskBackend is created, and from ``local_disk_backend.py``
  (``LocalDiskBackend.__init__``) the expression that turns ``max_local_disk_size`` into
  bytes (``self.max_cache_size = ...``): both read with ``ast`` and evaluated on the
  loaded config (the module needs LMCache's GPU stack to import);
- the ``extra_config`` keys LMCache reads, collected with ``ast`` from its sources.

Workers: each GPU rank runs one LocalDiskBackend; its PathSharder picks a path by the
rank's CUDA device index. An instance's ``tensor_parallel`` ranks are consecutive devices
starting anywhere; ``data_parallel`` instances each add theirs. A directory's worst case
(workers that can land on it × bytes each) must fit its cap.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkkit

DIST = "lmcache"
CONFIG_NAME = "lmcache.yaml"
#: Keys without which LMCache makes no disk backend (CreateStorageBackends).
REQUIRED = ("local_disk", "max_local_disk_size")
BACKENDS = os.path.join("v1", "storage_backend")


def quiet_environment() -> None:
    """Judge the file alone: no LMCACHE_* variable of this shell overrides it, and
    LMCache logs at INFO (its loggers take their level from LMCACHE_LOG_LEVEL)."""
    for name in [n for n in os.environ if n.startswith("LMCACHE_")]:
        del os.environ[name]
    os.environ["LMCACHE_LOG_LEVEL"] = "INFO"


def load_file_module(name: str, path: str) -> Any:
    """A module of LMCache loaded from its file (its package __init__ is not run)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def path_sharder(root: str) -> tuple[Any, str]:
    """LMCache's PathSharder class and how it was loaded."""
    name = "lmcache.v1.storage_backend.path_sharder"
    try:
        from lmcache.v1.storage_backend.path_sharder import PathSharder
        return PathSharder, f"imported {name}"
    except ImportError as exc:
        module = load_file_module(name, os.path.join(root, BACKENDS, "path_sharder.py"))
        return module.PathSharder, (f"loaded {name} from its file ({BACKENDS}/__init__ "
                                    f"does not import here: {exc})")


def parse(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), filename=path)


def function(tree: ast.AST, name: str) -> ast.FunctionDef:
    """The (first) function or method ``name`` in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"no function {name}")


def max_cache_size_expr(root: str) -> ast.expr:
    """The right-hand side of ``self.max_cache_size = ...`` in LocalDiskBackend.__init__."""
    tree = parse(os.path.join(root, BACKENDS, "local_disk_backend.py"))
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and cls.name == "LocalDiskBackend":
            for node in ast.walk(function(cls, "__init__")):
                if (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and ast.unparse(node.targets[0]) == "self.max_cache_size"):
                    return node.value
    raise LookupError("no self.max_cache_size assignment in LocalDiskBackend.__init__")


def disk_backend_condition(root: str) -> ast.expr:
    """The ``if`` test in CreateStorageBackends that guards ``LocalDiskBackend(...)``."""
    tree = parse(os.path.join(root, BACKENDS, "__init__.py"))
    for node in ast.walk(function(tree, "CreateStorageBackends")):
        if isinstance(node, ast.If) and any(
                isinstance(c, ast.Call) and ast.unparse(c.func) == "LocalDiskBackend"
                for stmt in node.body for c in ast.walk(stmt)):
            return node.test
    raise LookupError("no if-statement creating LocalDiskBackend in CreateStorageBackends")


def evaluate(expr: ast.expr, config: Any) -> Any:
    """Evaluate one of LMCache's expressions with its ``config`` (no backends skipped)."""
    code = compile(ast.Expression(expr), "<lmcache>", "eval")
    return eval(code, {"__builtins__": {"int": int, "float": float}},  # noqa: S307
                {"config": config, "_skip": set()})


def reads_extra_key(root: str, key: str) -> bool:
    """Whether LMCache's sources read ``extra_config`` key ``key`` (``.extra_config.get``,
    ``get_extra_config_value``, ``extra_config[...]``, ``... in extra_config``); only the
    files that name the key are parsed."""
    quoted = (f'"{key}"', f"'{key}'")
    for folder, _, names in os.walk(root):
        for name in names:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if ("extra_config" in text and any(q in text for q in quoted)
                    and key in _keys_in(ast.parse(text, filename=path))):
                return True
    return False


def _names_extra(node: ast.expr) -> bool:
    text = ast.unparse(node)
    return text.endswith("extra_config") or text.endswith("extra_config or {}")


def _keys_in(tree: ast.AST) -> set[str]:
    keys = set()
    for node in ast.walk(tree):
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            if isinstance(f, ast.Attribute) and (
                    f.attr == "get_extra_config_value"
                    or (f.attr in ("get", "pop") and _names_extra(f.value))):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and _names_extra(node.value):
            key = node.slice
        elif (isinstance(node, ast.Compare) and len(node.comparators) == 1
              and isinstance(node.ops[0], (ast.In, ast.NotIn))
              and _names_extra(node.comparators[0])):
            key = node.left
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            keys.add(key.value)
    return keys


def load_config(text: str, v: checkkit.Verdict) -> Any:
    """LMCache's config from the rendered YAML; what it said goes to v.messages and
    refuses the render. None when it raised."""
    from lmcache.v1.config import LMCacheEngineConfig

    said: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, CONFIG_NAME)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        config = None
        with checkkit.engine_speaks(said):
            try:
                config = LMCacheEngineConfig.from_file(path)
                config.update_config_from_env()
            except Exception as exc:  # the engine refused the file
                said.append(f"{type(exc).__name__}: {exc}")
                config = None
    v.messages.extend(said)
    for line in said:
        v.refuse(f"LMCache's config loader said: {line}")
    return config


def check_required(config: Any, root: str, v: checkkit.Verdict) -> bool:
    """LMCache creates a LocalDiskBackend from this config (its own condition)."""
    user_set = getattr(config, "_user_set_keys", set())
    for key in REQUIRED:
        if key not in user_set:
            v.refuse(f"required key {key} is missing (LMCache then uses its default "
                     f"{getattr(config, key)!r})")
    try:
        made = bool(evaluate(disk_backend_condition(root), config))
    except TypeError as exc:
        made = False
        v.messages.append(f"CreateStorageBackends' condition raised TypeError: {exc}")
    if not made:
        v.refuse(f"LMCache creates no LocalDiskBackend: local_disk={config.local_disk!r}, "
                 f"max_local_disk_size={config.max_local_disk_size!r}")
    return made


def check_extra(config: Any, root: str, v: checkkit.Verdict) -> None:
    """extra_config: only keys LMCache reads; use_odirect a real boolean."""
    extra = config.extra_config or {}
    for key in sorted(k for k in extra if not reads_extra_key(root, str(k))):
        v.refuse(f"extra_config key {key!r} is read nowhere in LMCache")
    if "use_odirect" in extra and not isinstance(extra["use_odirect"], bool):
        v.refuse(f"extra_config.use_odirect is {extra['use_odirect']!r}, not a boolean: "
                 "LocalDiskBackend uses it as a truth value")


def check_paths(config: Any, sharder: Any, p: checkkit.Payload,
                v: checkkit.Verdict) -> list[str] | None:
    """Every path LMCache would use is inside one of the pool's engine directories."""
    try:
        paths = sharder(config.local_disk, config.local_disk_path_sharding, "cuda:0").all_paths
    except ValueError as exc:
        v.refuse(f"PathSharder refused local_disk: {exc}")
        return None
    for path in paths:
        if checkkit.owning_directory(path, p.directories) is None:
            v.refuse(f"local_disk path {path!r} is outside the pool's {p.engine} "
                     f"directories {p.directories}")
    return paths


def workers_on(directory: str, config: Any, sharder: Any, n: int,
               p: checkkit.Payload) -> int:
    """The most workers whose PathSharder can select ``directory``: per instance, the
    worst start device for its tensor_parallel consecutive devices; times data_parallel."""
    def lands(device: int) -> bool:
        chosen = sharder(config.local_disk, config.local_disk_path_sharding,
                         f"cuda:{device}").selected
        return checkkit.owning_directory(chosen, p.directories) == directory

    per_instance = max(sum(lands(s + k) for k in range(p.tensor_parallel))
                       for s in range(n))
    return p.data_parallel * per_instance


def check_sizes(config: Any, sharder: Any, paths: list[str], root: str,
                p: checkkit.Payload, v: checkkit.Verdict) -> None:
    """Per directory: workers that can land on it × LocalDiskBackend's bytes <= its cap."""
    each = evaluate(max_cache_size_expr(root), config)
    v.messages.append(f"LocalDiskBackend.max_cache_size = {each} bytes per worker")
    for d, cap in zip(p.directories, p.directory_caps, strict=True):
        workers = workers_on(d, config, sharder, len(paths), p)
        if workers * each > cap:
            v.refuse(f"{d}: up to {workers} LMCache worker(s) × {each} bytes "
                     f"(max_local_disk_size {config.max_local_disk_size} × 1024**3) = "
                     f"{workers * each} bytes exceeds its cap of {cap} bytes")


def main() -> None:
    p = checkkit.read_payload()
    v = checkkit.Verdict()
    quiet_environment()
    try:
        import lmcache
        from lmcache.v1.config import LMCacheEngineConfig  # noqa: F401
    except Exception as exc:  # any import failure: unavailable
        checkkit.fail_unavailable(v, "import lmcache.v1.config", exc)
    root = os.path.dirname(os.path.abspath(lmcache.__file__))
    v.engine_version = checkkit.dist_version(DIST) or getattr(lmcache, "__version__", None)
    try:
        sharder, how = path_sharder(root)
    except Exception as exc:
        checkkit.fail_unavailable(v, "load PathSharder", exc)
    v.method = (f"imported lmcache {v.engine_version} from {root} and called "
                "LMCacheEngineConfig.from_file + update_config_from_env (validate); "
                f"{how}; evaluated CreateStorageBackends' LocalDiskBackend condition and "
                "LocalDiskBackend.__init__'s max_cache_size expression read with ast "
                "(local_disk_backend needs LMCache's GPU stack to import); extra_config "
                "keys collected from LMCache's sources with ast")
    text = p.files.get(CONFIG_NAME)
    if text is None:
        v.refuse(f"no {CONFIG_NAME} in the render (files: {sorted(p.files)})")
        checkkit.emit(v)
    judge(text, root, sharder, p, v)
    checkkit.emit(v)


def judge(text: str, root: str, sharder: Any, p: checkkit.Payload,
          v: checkkit.Verdict) -> None:
    """All checks on the rendered YAML."""
    config = load_config(text, v)
    if config is None:
        return
    check_extra(config, root, v)
    if not check_required(config, root, v):
        return
    paths = check_paths(config, sharder, p, v)
    if paths:
        check_sizes(config, sharder, paths, root, p, v)


if __name__ == "__main__":
    checkkit.run(main)

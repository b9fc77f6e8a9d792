"""vLLM's own code judges kvagent's ``--kv-transfer-config`` files.

Run as a file by the Python vLLM is installed in (``python check_vllm.py < payload.json``);
see checkkit.py for the payload and the verdict. For each rendered JSON file it:

1. parses the text as ``vllm serve --kv-transfer-config`` does (vllm/engine/arg_utils.py:
   ``_expand_json_human_readable_numbers``, then pydantic's ``TypeAdapter(KVTransferConfig)
   .validate_json``; the config forbids unknown fields) and looks ``kv_connector`` up in
   ``KVConnectorFactory``'s registry;
2. refuses ``kv_connector_extra_config`` keys that no code of that connector reads (found
   with ``ast`` in its modules: vLLM ignores unknown keys silently).

For the ``OffloadingConnector`` (a CPU tier with an fs tier behind it) it then:

3. builds the offloading spec as vLLM does, ``OffloadingSpecFactory.create_spec(
   OffloadingConfig(...))``, for a small model (:data:`MODEL`) at the payload's tensor
   parallel size: vLLM's own exceptions (e.g. "cpu_bytes_to_use must be specified") and
   warnings are the refusal; a CPU tier that holds no chunk (a size not in bytes) is refused;
4. binds each secondary tier's keys to its class's constructor (``SecondaryTierFactory.
   get_tier_class``, ``inspect.signature``, the keys ``create_secondary_tier`` pops removed)
   and requires each fs tier's ``root_dir`` inside one of the pool's directories.

For the ``SimpleCPUOffloadConnector`` (its disk backend) it then:

3. builds the connector as vLLM does, ``KVConnectorFactory.create_connector`` in the
   worker role, from a stand-in for the VllmConfig holding the parsed KVTransferConfig,
   prefix caching on (vLLM's default) and the payload's tensor-parallel world size: the
   connector's own exceptions ("requires disk_path", "requires disk_capacity_bytes > 0",
   an unknown backend) and warnings ("ignoring disk-only config") are the refusal, and a
   backend that is not ``disk`` keeps everything in host RAM;
4. for each tensor-parallel rank, runs the worker's own sizing (``_resolve_num_cpu_blocks``
   for :data:`MODEL`'s bytes per block) and ``_init_disk_mode`` on CUDA device ``rank``
   with its ``DiskBackend`` replaced by a recorder of what vLLM hands it (the real one pins
   host memory and creates the file): the file path and its slots × bytes per block. Every
   worker's file must lie in a pool directory, be no other worker's (vLLM unlinks the name
   at start), and all of a directory's files together fit its quota.

Every pool directory must be used by some file. Nothing is written.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkkit

#: The model the spec is built for: Llama-3-8B-like attention (32 layers, 8 KV heads of
#: 128, bfloat16, 16-token blocks), its KV heads split over the tensor-parallel ranks.
MODEL = {"name": "meta-llama/Llama-3.1-8B", "layers": 32, "kv_heads": 8, "head_dim": 128,
         "dtype": "bfloat16", "dtype_bytes": 2, "block_tokens": 16, "max_model_len": 32768}
OFFLOADING = "OffloadingConnector"
SIMPLE = "SimpleCPUOffloadConnector"
#: Where vLLM reads ``kv_connector_extra_config``, per connector kvagent renders (relative
#: to the vllm package).
EXTRA_CONFIG_READERS = {
    OFFLOADING: ("v1/kv_offload", "distributed/kv_transfer/kv_connector/v1/offloading",
                 "distributed/kv_transfer/kv_connector/v1/offloading_connector.py"),
    SIMPLE: ("distributed/kv_transfer/kv_connector/v1/simple_cpu_offload_connector.py",
             "v1/simple_kv_offload"),
}
#: Loggers of the disk backend's code: what they warn about a render is a refusal.
SIMPLE_LOGGERS = re.compile(r"^(?:WARNING|ERROR|CRITICAL) vllm\.(?:distributed\.kv_transfer\."
                            r"kv_connector\.v1\.simple_cpu_offload_connector|v1\."
                            r"simple_kv_offload)")
#: Keys ``SecondaryTierFactory.create_secondary_tier`` pops before calling the tier class,
#: and the arguments it passes itself.
TIER_POPPED = ("type", "module_path", "backpressure")
TIER_PASSED = ("offloading_spec", "primary_kv_view", "tier_type", "backpressure_detector")


@dataclass
class Vllm:
    """The vLLM modules the checks call."""

    version: str
    root: Path
    arg_utils: ModuleType
    kv_transfer: ModuleType
    connectors: ModuleType
    offload_config: ModuleType
    specs: ModuleType
    tiers: ModuleType


def load(v: checkkit.Verdict) -> Vllm:
    """Import vLLM's modules by their normal names (exit 3 when they do not import)."""
    said: list[str] = []
    try:
        with checkkit.engine_speaks(said):
            import vllm
            import vllm.distributed.kv_transfer.kv_connector.factory as connectors
            import vllm.v1.kv_offload.config as offload_config
            import vllm.v1.kv_offload.factory as specs
            import vllm.v1.kv_offload.tiering.factory as tiers
            from vllm.config import kv_transfer
            from vllm.engine import arg_utils
            from vllm.platforms import current_platform
            from vllm.version import __version__

            current_platform.device_type  # noqa: B018 - resolved here: its warnings are the host's
    except Exception as exc:  # any import failure means the engine is not usable here
        checkkit.fail_unavailable(v, "importing vllm", exc)
        raise  # pragma: no cover - fail_unavailable exits
    v.messages.extend(f"import: {m}" for m in dict.fromkeys(said))
    version = checkkit.dist_version("vllm") or __version__
    return Vllm(version, Path(vllm.__file__).parent, arg_utils, kv_transfer, connectors,
                offload_config, specs, tiers)


# ------------------------------------------------------------------ what vLLM reads
def extra_config_keys(root: Path, readers: tuple[str, ...]) -> set[str]:
    """Every ``kv_connector_extra_config`` key the ``readers`` read (``ast``)."""
    keys: set[str] = set()
    for rel in readers:
        path = root / rel
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            keys |= keys_read(ast.parse(file.read_text(), str(file)))
    return keys


def keys_read(tree: ast.AST) -> set[str]:
    """String keys of ``<…extra_config>.get("k")``, ``<…extra_config>["k"]`` and
    ``"k" in <…extra_config>``."""
    keys: set[str] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get" and is_extra_config(node.func.value)
                and node.args and is_str(node.args[0])):
            keys.add(node.args[0].value)
        elif (isinstance(node, ast.Subscript) and is_extra_config(node.value)
              and is_str(node.slice)):
            keys.add(node.slice.value)
        elif (isinstance(node, ast.Compare) and is_str(node.left)
              and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
              and any(is_extra_config(c) for c in node.comparators)):
            keys.add(node.left.value)
    return keys


def is_extra_config(node: ast.AST) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name.endswith("extra_config")


def is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


# ------------------------------------------------------------------ one file
def parse_cli(vl: Vllm, text: str) -> Any:
    """The file's text read as ``--kv-transfer-config`` (vllm/engine/arg_utils.py)."""
    from pydantic import TypeAdapter

    expanded = vl.arg_utils._expand_json_human_readable_numbers(text)
    return TypeAdapter(vl.kv_transfer.KVTransferConfig).validate_json(expanded)


def describe(exc: BaseException) -> str:
    """An exception in one line (pydantic's errors as ``field: message``)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}"
                         for e in exc.errors())
    return f"{type(exc).__name__}: {exc}"


def worker_bytes_per_block(tp: int) -> int:
    """One worker's bytes of a KV block of :data:`MODEL` at tensor parallel ``tp``."""
    heads = max(1, MODEL["kv_heads"] // tp)
    per_layer = 2 * MODEL["block_tokens"] * heads * MODEL["head_dim"] * MODEL["dtype_bytes"]
    return per_layer * MODEL["layers"]


def offloading_config(vl: Vllm, extra: dict[str, Any], payload: checkkit.Payload) -> Any:
    """An OffloadingConfig as build_offloading_config makes it for :data:`MODEL`."""
    c = vl.offload_config
    tp = payload.tensor_parallel
    layers = tuple(f"model.layers.{i}.self_attn.attn" for i in range(MODEL["layers"]))
    return c.OffloadingConfig(
        groups=(c.OffloadingGroupConfig(tokens_per_block=MODEL["block_tokens"],
                                        layer_names=layers, group_id=0),),
        worker_kv_bytes_per_block=worker_bytes_per_block(tp),
        enable_kv_cache_events=False, extra_config=extra, engine_id="kvagent-check_dp0",
        model=c.OffloadingModelConfig(name=MODEL["name"], dtype=MODEL["dtype"],
                                      max_model_len=MODEL["max_model_len"]),
        cache=c.OffloadingCacheConfig(tokens_per_hash=MODEL["block_tokens"],
                                      blocks_per_chunk=1),
        parallel=c.OffloadingParallelConfig(
            rank=0, world_size=tp, tp_size=tp, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=payload.data_parallel,
            data_parallel_rank_local=None, is_parallelism_agnostic=True))


def stand_in_config(cfg: Any, tp: int) -> Any:
    """What ``KVConnectorFactory.create_connector`` and SimpleCPUOffloadConnector read of a
    VllmConfig (a real one needs the model's files): the parsed KVTransferConfig, the
    hybrid KV cache manager on and prefix caching on (vLLM's defaults), ``tp`` workers."""
    ns = types.SimpleNamespace
    return ns(kv_transfer_config=cfg,
              scheduler_config=ns(disable_hybrid_kv_cache_manager=False),
              cache_config=ns(enable_prefix_caching=True),
              parallel_config=ns(world_size=tp))


@dataclass
class DiskFile:
    """One worker's file of the disk backend, as vLLM's worker code would open it."""

    name: str  # the rendered file it comes from
    rank: int
    path: str
    size: int  # slots x bytes per block: what the worker's ftruncate gives it


class Recorder:
    """Stands in for the disk backend's DiskBackend: records what ``init`` is handed."""

    calls: ClassVar[list[tuple[Any, ...]]] = []

    def init(self, *args: Any, **kwargs: Any) -> None:
        Recorder.calls.append(args)


class Judge:
    """The checks of one rendered file; ``root_dirs`` collects the fs tiers' directories
    and ``disk_files`` the disk backend's files, across all rendered files."""

    def __init__(self, vl: Vllm, payload: checkkit.Payload, v: checkkit.Verdict,
                 known: dict[str, set[str]]) -> None:
        self.vl, self.payload, self.v, self.known = vl, payload, v, known
        self.root_dirs: list[str] = []
        self.disk_files: list[DiskFile] = []

    def file(self, name: str, text: str) -> None:
        said: list[str] = []
        try:
            with checkkit.engine_speaks(said):
                cfg = parse_cli(self.vl, text)
        except Exception as exc:
            self.v.messages.append(f"{name}: {type(exc).__name__}: {exc}")
            self.v.refuse(f"{name}: vLLM's --kv-transfer-config parser refuses it: "
                          f"{describe(exc)}")
            return
        self.spoke(name, "parsing it", said)
        if not self.connector(name, cfg):
            return
        extra = dict(cfg.kv_connector_extra_config)
        self.unknown_keys(name, extra, cfg.kv_connector)
        if cfg.kv_connector == SIMPLE:
            self.disk_backend(name, cfg, extra)
            return
        self.note_root_dirs(extra)
        spec = self.spec(name, extra)
        if spec is not None:
            self.tiers(name, spec)

    def spoke(self, name: str, doing: str, said: list[str]) -> None:
        """vLLM warned or logged while ``doing``: it converted or doubted a value."""
        for message in dict.fromkeys(said):
            self.v.messages.append(f"{name}: {message}")
            self.v.refuse(f"{name}: vLLM warned while {doing}: {message}")

    def connector(self, name: str, cfg: Any) -> bool:
        registry = self.vl.connectors.KVConnectorFactory._registry
        if cfg.kv_connector is None:
            self.v.refuse(f"{name}: kv_connector is missing: vLLM would run without "
                          "offloading")
            return False
        if cfg.kv_connector not in registry:
            self.v.refuse(f"{name}: kv_connector {cfg.kv_connector!r} is not a connector "
                          f"vLLM registers ({', '.join(sorted(registry))})")
            return False
        if cfg.kv_connector not in EXTRA_CONFIG_READERS:
            self.v.refuse(f"{name}: kv_connector {cfg.kv_connector!r}: kvagent's render is "
                          f"judged for {' and '.join(EXTRA_CONFIG_READERS)} only")
            return False
        return True

    def note_root_dirs(self, extra: dict[str, Any]) -> None:
        """The fs tiers' directories, as written (whether or not vLLM takes the rest)."""
        tiers = extra.get("secondary_tiers")
        for tier in tiers if isinstance(tiers, list) else []:
            if isinstance(tier, dict) and isinstance(tier.get("root_dir"), str):
                self.root_dirs.append(os.path.normpath(tier["root_dir"]))

    def unknown_keys(self, name: str, extra: dict[str, Any], connector: str) -> None:
        for key in sorted(set(extra) - self.known[connector]):
            self.v.refuse(f"{name}: unknown key kv_connector_extra_config.{key}: no "
                          f"code of vLLM's {connector} reads it (vLLM ignores it silently)")

    # -------------------------------------------------------------- disk backend
    def disk_backend(self, name: str, cfg: Any, extra: dict[str, Any]) -> None:
        """SimpleCPUOffloadConnector's worker, built by vLLM's factory; each rank's file."""
        factory = self.vl.connectors.KVConnectorFactory
        said: list[str] = []
        with checkkit.engine_speaks(said):  # its import's warnings are the host's
            factory.get_connector_class_by_name(SIMPLE)
        self.v.messages.extend(f"import: {m}" for m in dict.fromkeys(said)
                               if f"import: {m}" not in self.v.messages)
        from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole

        tp = self.payload.tensor_parallel
        said = []
        try:
            with checkkit.engine_speaks(said):
                connector = factory.create_connector(stand_in_config(cfg, tp),
                                                     KVConnectorRole.WORKER, None)
        except Exception as exc:
            self.v.messages.append(f"{name}: {type(exc).__name__}: {exc}")
            self.v.refuse(f"{name}: vLLM's {SIMPLE} refuses it: {describe(exc)}")
            return
        self.spoke(name, f"building the {SIMPLE}",
                   [m for m in said if SIMPLE_LOGGERS.match(m)])
        self.v.messages.extend(f"{name}: {m}" for m in dict.fromkeys(said)
                               if not SIMPLE_LOGGERS.match(m))
        worker = connector.worker_handler
        if worker is None:
            self.v.refuse(f"{name}: vLLM made no offloading worker: the connector is off")
            return
        if not worker.disk_mode:
            self.v.refuse(f"{name}: kv_offload_backend "
                          f"{extra.get('kv_offload_backend', 'cpu')!r} keeps blocks in host "
                          "RAM: nothing reaches the pool")
            return
        if "use_page_cache" in extra and type(extra["use_page_cache"]) is not bool:
            self.v.refuse(f"{name}: use_page_cache={extra['use_page_cache']!r} is not a bool "
                          "(vLLM's bool() reads any non-empty string as true)")
        for rank in range(tp):
            found = self.worker_file(name, worker, rank)
            if found is None:
                return
            self.disk_files.append(found)

    def worker_file(self, name: str, worker: Any, rank: int) -> DiskFile | None:
        """The file the worker on CUDA device ``rank`` opens, by vLLM's own code."""
        import torch

        module = sys.modules[type(worker).__module__]
        bpb = worker_bytes_per_block(self.payload.tensor_parallel)
        real = module.DiskBackend
        module.DiskBackend = Recorder
        Recorder.calls = []
        said: list[str] = []
        try:
            with checkkit.engine_speaks(said):
                worker.num_cpu_blocks = worker._resolve_num_cpu_blocks(
                    worker.disk_capacity_bytes, bpb)
                worker._init_disk_mode({}, bpb, torch.device("cuda", rank))
        except Exception as exc:
            self.v.messages.append(f"{name}: {type(exc).__name__}: {exc}")
            self.v.refuse(f"{name}: vLLM's disk worker on cuda:{rank} refuses it: "
                          f"{describe(exc)}")
            return None
        finally:
            module.DiskBackend = real
        self.spoke(name, f"sizing the disk worker on cuda:{rank}",
                   [m for m in said if SIMPLE_LOGGERS.match(m)])
        (args,) = Recorder.calls
        path, slots, block_bytes = args[4], args[5], args[6]
        return DiskFile(name, rank, path, slots * block_bytes)

    def preload(self, name: str, extra: dict[str, Any]) -> bool:
        """Import the spec and tier modules the file names, only from vLLM's registries
        (their import-time warnings are the host's, not the file's)."""
        spec_name = extra.get("spec_name", "CPUOffloadingSpec")
        specs = self.vl.specs.OffloadingSpecFactory._registry
        if spec_name not in specs:
            self.v.refuse(f"{name}: spec_name {spec_name!r} is not a spec vLLM registers "
                          f"({', '.join(sorted(specs))})")
            return False
        tiers = self.vl.tiers.SecondaryTierFactory._registry
        said: list[str] = []
        with checkkit.engine_speaks(said):
            specs[spec_name]()
            listed = extra.get("secondary_tiers")
            for tier in listed if isinstance(listed, list) else []:
                kind = tier.get("type") if isinstance(tier, dict) else None
                if isinstance(kind, str) and kind in tiers:
                    tiers[kind]()
        self.v.messages.extend(f"import: {m}" for m in dict.fromkeys(said)
                               if f"import: {m}" not in self.v.messages)
        return True

    def spec(self, name: str, extra: dict[str, Any]) -> Any:
        said: list[str] = []
        if not self.preload(name, extra):
            return None
        try:
            with checkkit.engine_speaks(said):
                spec = self.vl.specs.OffloadingSpecFactory.create_spec(
                    offloading_config(self.vl, extra, self.payload))
                cls = type(spec)
                cls.build_metric_definitions(extra)
                cls.config_info_keys(extra)
        except Exception as exc:
            self.v.messages.append(f"{name}: {type(exc).__name__}: {exc}")
            self.v.refuse(f"{name}: vLLM's offloading spec refuses it: {describe(exc)}")
            return None
        self.spoke(name, "building the offloading spec", said)
        if not hasattr(spec, "secondary_tier_configs"):
            self.v.refuse(f"{name}: spec {type(spec).__name__} has no secondary tiers: nothing "
                          "of vLLM's KV cache reaches the pool")
            return None
        if spec.num_chunks < 1:
            self.v.refuse(
                f"{name}: cpu_bytes_to_use={extra.get('cpu_bytes_to_use')!r} holds no chunk "
                f"of {spec.kv_bytes_per_chunk} bytes (vLLM reads it as bytes: a size in "
                "another unit?): the CPU tier, and so the fs tier behind it, holds nothing")
        return spec

    def tiers(self, name: str, spec: Any) -> None:
        factory = self.vl.tiers.SecondaryTierFactory
        if not spec.secondary_tier_configs:
            self.v.refuse(f"{name}: secondary_tiers is empty: nothing reaches the pool")
        for i, tier in enumerate(spec.secondary_tier_configs):
            where = f"{name}: secondary_tiers[{i}]"
            if tier.get("type") not in factory._registry:
                self.v.refuse(f"{where}: type {tier.get('type')!r} is not a tier vLLM "
                              f"registers ({', '.join(sorted(factory._registry))})")
                continue
            try:
                cls = factory.get_tier_class(tier)
            except Exception as exc:
                self.v.refuse(f"{where}: vLLM refuses the tier: {describe(exc)}")
                continue
            self.bind(where, cls, tier)
            if tier.get("type") == "fs":
                self.root_dir(where, tier.get("root_dir"))

    def bind(self, where: str, cls: type, tier: dict[str, Any]) -> None:
        """The tier's keys against its constructor, as create_secondary_tier calls it."""
        kwargs = {k: v for k, v in tier.items() if k not in TIER_POPPED}
        sig = inspect.signature(cls)
        for key in sorted(set(kwargs) & set(TIER_PASSED)):
            self.v.refuse(f"{where}: key {key!r} is vLLM's own argument to {cls.__name__}")
            kwargs.pop(key)
        unknown = sorted(k for k in kwargs if k not in sig.parameters)
        for key in unknown:
            self.v.refuse(f"{where}: unknown key {key!r}: {cls.__name__}{sig} takes no such "
                          "argument")
        try:
            sig.bind(**dict.fromkeys(TIER_PASSED), **{k: kwargs[k] for k in kwargs
                                                     if k not in unknown})
        except TypeError as exc:
            self.v.refuse(f"{where}: {cls.__name__} refuses its keys: {exc}")
        for key, value in kwargs.items():
            want = sig.parameters[key].annotation if key in sig.parameters else None
            if want in (str, int, bool) and type(value) is not want:
                self.v.refuse(f"{where}: {key}={value!r} is not a {want.__name__}")

    def root_dir(self, where: str, root: Any) -> None:
        if not isinstance(root, str):
            return  # the signature check said so
        if checkkit.owning_directory(root, self.payload.directories) is None:
            self.v.refuse(f"{where}: root_dir {root!r} is outside the pool's "
                          f"{self.payload.engine} directories {self.payload.directories}")


def disk_files(payload: checkkit.Payload, found: list[DiskFile], v: checkkit.Verdict) -> None:
    """Every worker's file in a pool directory and its own; each at most its directory's
    quota divided among the payload's ranks, and all of a directory's together at most
    its quota."""
    owners: dict[str, DiskFile] = {}
    totals: dict[str, int] = {}
    for f in found:
        where = f"{f.name}: the worker on cuda:{f.rank}"
        directory = checkkit.owning_directory(f.path, payload.directories)
        if directory is None:
            v.refuse(f"{where} opens {f.path}, outside the pool's {payload.engine} "
                     f"directories {payload.directories}")
            continue
        other = owners.setdefault(f.path, f)
        if other is not f:
            v.refuse(f"{where} opens {f.path}, as does {other.name}'s worker on "
                     f"cuda:{other.rank}: vLLM unlinks the name at start, so the workers "
                     "race for it and one's blocks fill an unlinked file")
        cap = payload.cap_of(f.path) or 0
        if f.size > cap // payload.ranks:
            v.refuse(f"{where} may fill {f.size} bytes of {f.path}, more than the quota of "
                     f"{directory} ({cap} bytes) divided among its {payload.ranks} "
                     f"worker(s) ({cap // payload.ranks})")
        totals[directory] = totals.get(directory, 0) + f.size
    for directory, total in sorted(totals.items()):
        cap = payload.directory_caps[payload.directories.index(directory)]
        if total > cap:
            v.refuse(f"the disk backend's files in {directory} may fill {total} bytes "
                     f"together, more than its quota ({cap} bytes)")


def unused_directories(payload: checkkit.Payload, roots: list[str], v: checkkit.Verdict) -> None:
    """Each of the pool's directories is some file's fs tier or holds some worker's disk
    file (else its quota is unused)."""
    for d in payload.directories:
        if not any(checkkit.owning_directory(r, [d]) for r in roots):
            v.refuse(f"no file's fs tier or disk backend uses the pool directory {d}")


def main() -> None:
    payload = checkkit.read_payload()
    v = checkkit.Verdict()
    vl = load(v)
    v.engine_version = vl.version
    v.method = (
        f"imported vllm {vl.version} and called: arg_utils._expand_json_human_readable_numbers "
        "+ TypeAdapter(KVTransferConfig).validate_json on each file (as vllm serve "
        "--kv-transfer-config parses it), KVConnectorFactory._registry; for the "
        "OffloadingConnector OffloadingSpecFactory.create_spec(OffloadingConfig(...)) for a "
        f"{MODEL['name']}-like model at tensor_parallel={payload.tensor_parallel}, "
        "build_metric_definitions, config_info_keys, SecondaryTierFactory.get_tier_class and "
        "inspect.signature(tier class).bind; for the SimpleCPUOffloadConnector "
        "KVConnectorFactory.create_connector (worker role, a stand-in VllmConfig) and, per "
        "rank, the worker's _resolve_num_cpu_blocks and _init_disk_mode (DiskBackend "
        "recorded, not run); read the connectors' sources with ast for the "
        "kv_connector_extra_config keys vLLM reads")
    known = {c: extra_config_keys(vl.root, r) for c, r in EXTRA_CONFIG_READERS.items()}
    judge = Judge(vl, payload, v, known)
    if not payload.files:
        v.refuse("no file rendered")
    for name, text in sorted(payload.files.items()):
        judge.file(name, text)
    disk_files(payload, judge.disk_files, v)
    unused_directories(payload, judge.root_dirs + [f.path for f in judge.disk_files], v)
    checkkit.emit(v)


if __name__ == "__main__":
    checkkit.run(main)

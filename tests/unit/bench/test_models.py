"""The built-in model table and config.json reading, against DESIGN.md's reference values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.bench.models import (
    BUILTIN,
    ModelConfigError,
    builtin_model,
    builtin_names,
    load_model_config,
    model_from_config,
)
from agent.errors import EXIT_USAGE, UsageError

KIB = 1024


@pytest.mark.parametrize(("name", "expected"), [
    # DESIGN.md "KV-cache arithmetic": 2 · layers · kv_heads · head_dim · dtype_bytes
    ("Llama-3.1-8B", 128 * KIB),   # 2 · 32 · 8 · 128 · 2 = 131,072
    ("Llama-3.1-70B", 320 * KIB),  # 2 · 80 · 8 · 128 · 2 = 327,680
    ("Qwen2.5-7B", 56 * KIB),      # head_dim 3584/28 = 128; 2 · 28 · 4 · 128 · 2 = 57,344
    ("Qwen2.5-32B", 256 * KIB),    # head_dim 5120/40 = 128; 2 · 64 · 8 · 128 · 2 = 262,144
    ("Qwen2.5-72B", 320 * KIB),    # 2 · 80 · 8 · 128 · 2
    ("Mixtral-8x7B", 128 * KIB),   # 2 · 32 · 8 · 128 · 2 (experts do not change the KV)
    ("DeepSeek-V3", 70272),        # MLA: 61 · (512 + 64) · 2 = 70,272
])
def test_kv_bytes_per_token_match_the_reference_values(name: str, expected: int) -> None:
    assert builtin_model(name).kv_bytes_per_token == expected


def test_deepseek_is_about_68_6_kib_as_design_says() -> None:
    m = builtin_model("DeepSeek-V3")
    assert m.mla and m.moe
    assert round(m.kv_bytes_per_token / KIB, 1) == 68.6


def test_moe_models_carry_active_parameters() -> None:
    mixtral = builtin_model("Mixtral-8x7B")
    assert (mixtral.params_total, mixtral.params_active) == (46_700_000_000, 12_900_000_000)
    ds = builtin_model("DeepSeek-V3")
    assert (ds.params_total, ds.params_active) == (671_000_000_000, 37_000_000_000)
    dense = builtin_model("Llama-3.1-70B")
    assert dense.params_total == dense.params_active and not dense.moe


def test_builtin_lookup_is_case_insensitive_and_unknown_names_are_usage_errors() -> None:
    assert builtin_model("qwen2.5-7b").name == "Qwen2.5-7B"
    assert builtin_names() == ["Llama-3.1-8B", "Llama-3.1-70B", "Qwen2.5-7B", "Qwen2.5-32B",
                               "Qwen2.5-72B", "Mixtral-8x7B", "DeepSeek-V3"]
    with pytest.raises(UsageError, match=r"unknown model 'gpt-5'.*Llama-3\.1-8B") as exc:
        builtin_model("gpt-5")
    assert exc.value.exit_code == EXIT_USAGE


def test_parameter_estimate_of_llama_8b_is_exact() -> None:
    # embed + lm_head: 2 · 128256 · 4096                       = 1,050,673,152
    # per layer: q,o 2 · 4096·4096 = 33,554,432; k,v 2 · 4096·1024 = 8,388,608;
    #            mlp 3 · 4096 · 14336 = 176,160,768; norms 2 · 4096 = 8,192
    #            = 218,112,000; × 32 layers                    = 6,979,584,000
    # final norm                                               = 4,096
    # total                                                    = 8,030,261,248
    cfg = BUILTIN["Llama-3.1-8B"].config
    m = model_from_config(cfg, "x", "test")
    assert m.params_estimated
    assert m.params_total == m.params_active == 8_030_261_248


@pytest.mark.parametrize("name", list(BUILTIN))
def test_parameter_estimate_agrees_with_published_counts(name: str) -> None:
    # --model-config has no published counts; the estimator must land near them.
    # DeepSeek's published 37B active excludes its 0.93B input embedding (36.6B + 0.9B head
    # in its weights README), so allow 2%.
    entry = BUILTIN[name]
    m = model_from_config(entry.config, name, "test")
    assert m.params_total == pytest.approx(entry.params_total, rel=0.01)
    assert m.params_active == pytest.approx(entry.params_active, rel=0.02)


def write(tmp_path: Path, data: object, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def qwen7b() -> dict:
    return {"_name_or_path": "Qwen/Qwen2.5-7B-Instruct", **BUILTIN["Qwen2.5-7B"].config}


def test_model_config_is_read_like_the_builtin(tmp_path: Path) -> None:
    m = load_model_config(write(tmp_path, qwen7b()))
    assert m.name == "Qwen2.5-7B-Instruct"
    assert m.kv_bytes_per_token == 56 * KIB
    assert m.params_estimated
    assert m.params_active == pytest.approx(7.61e9, rel=0.01)


@pytest.mark.parametrize("field", ["num_hidden_layers", "num_attention_heads", "hidden_size",
                                   "vocab_size", "intermediate_size"])
def test_missing_required_field_is_named(tmp_path: Path, field: str) -> None:
    cfg = qwen7b()
    del cfg[field]
    path = write(tmp_path, cfg)
    with pytest.raises(ModelConfigError) as exc:
        load_model_config(path)
    assert f"missing field '{field}'" in exc.value.message
    assert str(path) in exc.value.message
    assert exc.value.exit_code == EXIT_USAGE


def test_optional_fields_default_like_huggingface_and_say_so(tmp_path: Path) -> None:
    cfg = qwen7b()
    del cfg["num_key_value_heads"], cfg["torch_dtype"]
    m = load_model_config(write(tmp_path, cfg))
    # MHA: 2 · 28 layers · 28 heads · 128 · 2 bytes = 401,408
    assert m.kv_bytes_per_token == 401_408
    assert any("num_key_value_heads missing" in n for n in m.notes)
    assert any("torch_dtype missing: assumed bfloat16" in n for n in m.notes)


def test_explicit_head_dim_and_newer_dtype_key(tmp_path: Path) -> None:
    # head_dim given (64) differs from hidden/heads (4096/32 = 128), so it must win;
    # 'dtype' is the newer name of torch_dtype: 2 · 36 · 8 · 64 · 4 (float32) = 147,456.
    cfg = {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
           "hidden_size": 4096, "head_dim": 64, "dtype": "float32", "vocab_size": 1000,
           "intermediate_size": 100}
    m = load_model_config(write(tmp_path, cfg))
    assert m.kv_bytes_per_token == 147_456
    assert m.dtype == "float32"


def test_multimodal_config_reads_text_config(tmp_path: Path) -> None:
    cfg = {"model_type": "llava", "text_config": BUILTIN["Llama-3.1-8B"].config}
    m = load_model_config(write(tmp_path, cfg))
    assert m.kv_bytes_per_token == 128 * KIB
    assert any("text_config" in n for n in m.notes)


def test_mla_config_needs_its_rope_dim(tmp_path: Path) -> None:
    cfg = dict(BUILTIN["DeepSeek-V3"].config)
    del cfg["qk_rope_head_dim"]
    with pytest.raises(ModelConfigError, match="missing field 'qk_rope_head_dim'"):
        load_model_config(write(tmp_path, cfg))


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    (json.dumps({**BUILTIN["Qwen2.5-7B"].config, "torch_dtype": "int3"}),
     "field 'torch_dtype' is 'int3'"),
    (json.dumps({**BUILTIN["Qwen2.5-7B"].config, "num_hidden_layers": "28"}),
     "field 'num_hidden_layers' must be an integer"),
    (json.dumps({**BUILTIN["Qwen2.5-7B"].config, "num_hidden_layers": 0}),
     "field 'num_hidden_layers' must be at least 1"),
])
def test_bad_model_configs_are_usage_errors(tmp_path: Path, content: str, message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        load_model_config(write(tmp_path, content))

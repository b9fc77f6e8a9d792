"""Load-vs-recompute arithmetic against values computed by hand (arithmetic in comments)."""

from __future__ import annotations

import pytest

from agent.bench.kvmath import (
    GPU_PRESETS,
    assess_prefix,
    attention_flops,
    break_even_bandwidth,
    format_factor,
    linear_flops_per_token,
    load_time,
    prefix_flops,
    recompute_time,
    throughput,
    verdict,
)
from agent.bench.models import ModelSpec, builtin_model
from agent.errors import UsageError


def tiny(**over: object) -> ModelSpec:
    """2 layers, 4 heads (2 KV heads) of width 8, bf16, 1000 active parameters."""
    values: dict = dict(name="tiny", source="test", num_layers=2, num_attention_heads=4,
                        num_kv_heads=2, head_dim=8, dtype="bfloat16", dtype_bytes=2,
                        params_total=1000, params_active=1000, params_estimated=False,
                        qk_head_dim=8, v_head_dim=8)
    values.update(over)
    return ModelSpec(**values)


def test_tiny_model_by_hand() -> None:
    m = tiny()
    # KV: 2 · 2 layers · 2 kv heads · 8 · 2 bytes = 128 bytes/token
    assert m.kv_bytes_per_token == 128
    # weights: 2 · 1000 = 2000 FLOPs/token
    assert linear_flops_per_token(m.params_active) == 2000
    # attention, n = 3: causal pairs 3·4/2 = 6; one pair in one layer costs
    # 2·4·8 (QK) + 2·4·8 (AV) = 128; × 2 layers × 6 pairs = 1536 = 2·4·16·3·4
    assert attention_flops(2, 4, 8, 8, 3) == 1536
    # prefix: 2000 · 3 + 1536 = 7536
    assert prefix_flops(m, 3) == 7536


def test_mla_kv_bytes_by_hand() -> None:
    m = tiny(num_layers=3, kv_lora_rank=10, qk_rope_head_dim=2)
    # 3 layers · (10 + 2) · 2 bytes = 72 (one latent per layer, no separate V)
    assert m.kv_bytes_per_token == 72


def test_beats_recompute_by_hand() -> None:
    m = tiny()
    # effective 3768 FLOP/s: recompute of 3 tokens = 7536 / 3768 = 2 s
    # load: 3 · 128 = 384 bytes at 384 B/s, no latency = 1 s → ratio 2/1 = 2
    a = assess_prefix(m, 3, bandwidth=384, latency_s=0.0, effective_flops=3768)
    assert a.bytes == 384
    assert a.recompute_s == pytest.approx(2.0)
    assert a.load_s == pytest.approx(1.0)
    assert a.ratio == pytest.approx(2.0)
    assert a.beats_recompute
    assert a.verdict == "beats recompute by 2.0×"
    # break-even: FLOPs/token = 7536 / 3 = 2512; 128 B · 3768 / 2512 = 192 B/s
    # (check: 384 B at 192 B/s = 2 s = the recompute time)
    assert a.break_even_bytes_per_s == pytest.approx(192.0)


def test_slower_than_recompute_by_hand() -> None:
    m = tiny()
    # load: 384 B at 96 B/s = 4 s, + 1 s latency = 5 s; recompute 2 s → ratio 0.4 → 2.5×
    a = assess_prefix(m, 3, bandwidth=96, latency_s=1.0, effective_flops=3768)
    assert a.load_s == pytest.approx(5.0)
    assert a.ratio == pytest.approx(0.4)
    assert not a.beats_recompute
    assert a.verdict == "slower than recompute by 2.5×"


def test_design_break_even_for_8b_and_70b() -> None:
    # DESIGN.md: ≈3–5 GB/s per GPU for an 8B GQA model at 400–600 TFLOP/s, ≈1 GB/s for 70B.
    # 8B at 400 TFLOP/s: 131072 B · 4e14 / (2 · 8.03e9) = 5.24288e19 / 1.606e10 = 3.2646e9 B/s
    assert break_even_bandwidth(131072, 400e12, 2 * 8.03e9) == pytest.approx(3.2646e9, rel=1e-4)
    # 8B at 600 TFLOP/s: 131072 · 6e14 / 1.606e10 = 4.8968e9 B/s
    assert break_even_bandwidth(131072, 600e12, 2 * 8.03e9) == pytest.approx(4.8968e9, rel=1e-4)
    # 70B at 400 TFLOP/s: 327680 · 4e14 / (2 · 70.6e9) = 1.31072e20 / 1.412e11 = 9.2827e8 B/s
    assert break_even_bandwidth(327680, 400e12, 2 * 70.6e9) == pytest.approx(9.2827e8, rel=1e-4)


def test_llama_8b_1k_prefix_on_h100_by_hand() -> None:
    m = builtin_model("Llama-3.1-8B")
    thr = throughput("h100", 0.5)
    # 989 · 0.5 = 494.5 TFLOP/s
    assert thr.effective_flops == pytest.approx(4.945e14)
    a = assess_prefix(m, 1024, bandwidth=2e9, latency_s=100e-6,
                      effective_flops=thr.effective_flops)
    # bytes: 1024 · 131072 = 134,217,728
    assert a.bytes == 134_217_728
    # weights: 2 · 8.03e9 · 1024 = 1.644544e13
    # attention: 32 layers · 32 heads · (128 + 128) · 1024 · 1025 = 262144 · 1,049,600
    #          = 2.751463424e11
    # total 1.644544e13 + 2.751463424e11 = 1.67205863424e13
    assert a.flops == pytest.approx(1.67205863424e13)
    # recompute: 1.67205863424e13 / 4.945e14 = 0.0338131 s
    assert a.recompute_s == pytest.approx(0.0338131, rel=1e-5)
    # load: 134217728 / 2e9 + 1e-4 = 0.067108864 + 0.0001 = 0.067208864 s
    assert a.load_s == pytest.approx(0.067208864)
    # ratio 0.0338131 / 0.0672089 = 0.50311 → slower by 1/0.50311 = 1.988 → "1.99×"
    assert a.ratio == pytest.approx(0.50311, rel=1e-4)
    assert a.verdict == "slower than recompute by 1.99×"


def test_attention_makes_long_prefixes_favour_loading() -> None:
    m = builtin_model("Llama-3.1-8B")
    eff = throughput("h100", 0.5).effective_flops
    short, long = (assess_prefix(m, n, 2e9, 0.0, eff) for n in (1024, 131072))
    # load time is linear in n, recompute grows faster (the n² attention term)
    assert long.ratio > short.ratio
    assert long.break_even_bytes_per_s < short.break_even_bytes_per_s


def test_throughput_presets_and_given_tflops() -> None:
    assert GPU_PRESETS["h100"].peak_tflops == GPU_PRESETS["h200"].peak_tflops == 989.0
    # 989 · 0.4 = 395.6; 989 · 0.6 = 593.4
    assert throughput("h100", 0.4).effective_tflops == pytest.approx(395.6)
    assert throughput("H200", 0.6).effective_tflops == pytest.approx(593.4)
    given = throughput(tflops=450)
    assert given.effective_flops == 450e12 and given.gpu is None and given.mfu is None


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"gpu": "a100"}, "unknown GPU 'a100'"),
    ({"mfu": 1.5}, "--mfu must be in"),
    ({"mfu": 0.0}, "--mfu must be in"),
    ({"tflops": -3.0}, "--tflops must be a positive"),
])
def test_bad_throughput_is_a_usage_error(kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        throughput(**kwargs)


def test_verdict_wording_and_factor_format() -> None:
    assert verdict(1.0, 1.0).text == "beats recompute by 1.00×"
    assert verdict(2.0, 24.8).text == "beats recompute by 12×"   # 24.8 / 2 = 12.4
    assert verdict(4.0, 1.0).text == "slower than recompute by 4.0×"
    assert verdict(1.0, 0.98).text == "slower than recompute by 1.02×"  # 1 / 0.98 = 1.0204
    assert format_factor(1500.4) == "1500×"


def test_primitives_reject_nonsense() -> None:
    with pytest.raises(ValueError):
        load_time(100, 0)
    with pytest.raises(ValueError):
        recompute_time(100, 0)
    with pytest.raises(ValueError):
        break_even_bandwidth(100, 1e12, 0)
    # load_time adds the latency once: 100 B at 50 B/s = 2 s, + 0.25 s
    assert load_time(100, 50, 0.25) == pytest.approx(2.25)

"""Load-vs-recompute arithmetic for KV-cache prefixes. Pure functions, no I/O.

Formulas (all FLOPs are multiply-adds counted as 2):

- Linear (weights) cost of recomputing one token: ``2 · active_params``.
- Attention cost: per layer, one (query, key) pair costs ``2 · heads · qk_dim``
  for Q·Kᵀ and ``2 · heads · v_dim`` for the weighted sum of V. With a causal
  mask, prefilling ``n`` tokens forms ``n(n+1)/2`` pairs, so

      attention_flops(n) = layers · 2 · heads · (qk_dim + v_dim) · n(n+1)/2
                         = layers · heads · (qk_dim + v_dim) · n · (n+1)

  For ordinary attention (qk_dim = v_dim = head_dim) that is
  ``2 · layers · heads · head_dim · n(n+1)``: quadratic in n overall, and
  ``2 · 2 · layers · (heads · head_dim) · (n+1)/2`` per token on average (the
  last token costs twice the average; a causal kernel skips the masked half).
  MLA (DeepSeek) prefill attends with qk_dim = nope + rope and v_dim = v_head_dim.
- ``prefix_flops(n) = 2 · active_params · n + attention_flops(n)``.
- Effective throughput = peak dense BF16 FLOP/s × MFU, or what the user gives.
- Recompute time = prefix_flops / effective FLOP/s.
- Load time = prefix bytes / measured read bandwidth + one I/O's p50 latency.
- Break-even bandwidth = bytes/token × effective FLOP/s ÷ FLOPs/token, where
  FLOPs/token is ``prefix_flops(n) / n`` (so it grows with the prefix);
  at n → 0 it is the weights-only figure quoted in DESIGN.md.
- Verdict: ratio = recompute / load; ≥ 1 "beats recompute by ratio×",
  else "slower than recompute by (1/ratio)×".
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from .models import ModelSpec

#: Prefix lengths the verdict is given for.
PREFIX_TOKENS: tuple[int, ...] = (1024, 32768, 131072)
#: Typical model FLOP utilisations of prefill.
MFU_PRESETS: tuple[float, ...] = (0.4, 0.5, 0.6)
TERA = 1e12


@dataclass(frozen=True)
class GpuPreset:
    """A GPU's dense (no sparsity) BF16 tensor-core peak."""

    key: str
    name: str
    peak_tflops: float


#: NVIDIA's datasheets: H100 SXM5 and H200 SXM both 989 TFLOP/s dense BF16
#: (1,979 is the 2:4-sparsity figure).
GPU_PRESETS: dict[str, GpuPreset] = {
    "h100": GpuPreset("h100", "H100 SXM", 989.0),
    "h200": GpuPreset("h200", "H200 SXM", 989.0),
}


@dataclass(frozen=True)
class Throughput:
    """The effective FLOP/s recompute runs at, and where it came from."""

    label: str
    effective_tflops: float
    gpu: str | None = None
    peak_tflops: float | None = None
    mfu: float | None = None

    @property
    def effective_flops(self) -> float:
        return self.effective_tflops * TERA


def throughput(gpu: str = "h100", mfu: float = 0.5, tflops: float | None = None) -> Throughput:
    """Effective throughput: ``tflops`` (TFLOP/s, as measured by the user) or a preset × MFU."""
    if tflops is not None:
        if not tflops > 0:
            raise UsageError(f"--tflops must be a positive number, got {tflops:g}")
        return Throughput(f"{tflops:g} TFLOP/s effective (given)", tflops)
    preset = GPU_PRESETS.get(gpu.lower())
    if preset is None:
        raise UsageError(f"unknown GPU {gpu!r}; presets: {', '.join(GPU_PRESETS)}",
                         "or give the effective throughput with --tflops")
    if not 0 < mfu <= 1:
        raise UsageError(f"--mfu must be in (0, 1], got {mfu:g}")
    eff = preset.peak_tflops * mfu
    return Throughput(f"{preset.name} {preset.peak_tflops:g} TFLOP/s × {mfu:g} MFU = "
                      f"{eff:g} TFLOP/s effective", eff, preset.key,
                      preset.peak_tflops, mfu)


def linear_flops_per_token(active_params: float) -> float:
    """Weights-only recompute cost of one token: 2 · active parameters."""
    return 2.0 * active_params


def attention_flops(layers: int, heads: int, qk_dim: int, v_dim: int, tokens: int) -> float:
    """Causal attention FLOPs of prefilling ``tokens``: layers·heads·(qk+v)·n·(n+1)."""
    return float(layers) * heads * (qk_dim + v_dim) * tokens * (tokens + 1)


def prefix_flops(model: ModelSpec, tokens: int) -> float:
    """FLOPs to recompute the KV of a ``tokens``-long prefix (weights + attention)."""
    return linear_flops_per_token(model.params_active) * tokens + attention_flops(
        model.num_layers, model.num_attention_heads, model.qk_head_dim, model.v_head_dim,
        tokens)


def break_even_bandwidth(bytes_per_token: float, effective_flops: float,
                         flops_per_token: float) -> float:
    """Bytes/s at which loading a token's KV takes as long as recomputing it."""
    if flops_per_token <= 0:
        raise ValueError("flops_per_token must be positive")
    return bytes_per_token * effective_flops / flops_per_token


def load_time(prefix_bytes: float, bandwidth: float, latency_s: float = 0.0) -> float:
    """Seconds to read ``prefix_bytes`` at ``bandwidth`` bytes/s, plus one I/O's latency."""
    if bandwidth <= 0:
        raise ValueError("bandwidth must be positive")
    return prefix_bytes / bandwidth + latency_s


def recompute_time(flops: float, effective_flops: float) -> float:
    """Seconds to compute ``flops`` at ``effective_flops`` FLOP/s."""
    if effective_flops <= 0:
        raise ValueError("effective_flops must be positive")
    return flops / effective_flops


@dataclass(frozen=True)
class Verdict:
    """Load vs recompute: ratio = recompute time / load time (> 1: loading wins)."""

    ratio: float
    beats: bool
    factor: float
    text: str


def format_factor(k: float) -> str:
    """``1.02×``, ``3.2×``, ``12×``, ``1500×``: never exponent notation, never a bare ``1.0×``."""
    if k < 2:
        return f"{k:.2f}×"
    return f"{k:.1f}×" if k < 10 else f"{k:.0f}×"


def verdict(load_s: float, recompute_s: float) -> Verdict:
    """The verdict on load vs recompute.

    "beats recompute by k×" when loading is at least as fast, else
    "slower than recompute by k×".
    """
    if load_s <= 0:
        raise ValueError("load time must be positive")
    ratio = recompute_s / load_s
    if ratio >= 1:
        return Verdict(ratio, True, ratio, f"beats recompute by {format_factor(ratio)}")
    factor = 1 / ratio if ratio > 0 else float("inf")
    return Verdict(ratio, False, factor, f"slower than recompute by {format_factor(factor)}")


@dataclass(frozen=True)
class PrefixAssessment:
    """Loading vs recomputing one prefix of one model."""

    tokens: int
    bytes: int
    flops: float
    load_s: float
    recompute_s: float
    break_even_bytes_per_s: float
    ratio: float
    beats_recompute: bool
    verdict: str


def assess_prefix(model: ModelSpec, tokens: int, bandwidth: float, latency_s: float,
                  effective_flops: float) -> PrefixAssessment:
    """Load time, recompute time, break-even bandwidth and verdict for one prefix length."""
    size = tokens * model.kv_bytes_per_token
    flops = prefix_flops(model, tokens)
    load_s = load_time(size, bandwidth, latency_s)
    recompute_s = recompute_time(flops, effective_flops)
    v = verdict(load_s, recompute_s)
    be = break_even_bandwidth(model.kv_bytes_per_token, effective_flops, flops / tokens)
    return PrefixAssessment(tokens, size, flops, load_s, recompute_s, be, v.ratio, v.beats,
                            v.text)

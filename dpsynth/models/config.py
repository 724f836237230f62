"""Model configuration: a frozen, validated dataclass and the named presets.

Presets (`get_config(name, **overrides)`):

| preset | d_model | layers | heads x head_dim | d_ff | vocab | max_len | params (tied) |
|--------|---------|--------|------------------|------|-------|---------|---------------|
| tiny   | 64      | 2      | 4 x 16           | 128  | 512   | 1024    | ~0.1M         |
| cpu    | 128     | 4      | 4 x 32           | 384  | 8192  | 512     | ~1.9M         |
| small  | 256     | 4      | 4 x 64           | 768  | 8192  | 1024    | ~5.5M         |
| 1b     | 2048    | 16     | 16 x 128         | 8192 | 32000 | 2048    | ~1.14B        |
| 8b     | 4096    | 32     | 32 x 128         | 16384| 32000 | 2048    | ~8.72B        |

`cpu` is sized by measurement for pretraining in about an hour on 2 CPU cores
(`bench/train_step.py`, docs/models.md): at ~1.9M parameters (1.05M of them the tied 8k
embedding) it trains ~1.5x faster per token than a 3.3M-parameter d_model-192 shape and
~2.5x faster than `small`, and an hour of it is ~15M tokens, near the compute-optimal
tokens-per-parameter ratio for that budget, where the larger shapes would see 3-5 tokens per
parameter.

`1b` and `8b` follow the shape of the paper's LaMDA-like decoders (1B and 8B parameters,
32k SentencePiece vocabulary); they are meant for accelerators and never built in tests
(their sizes are checked with `jax.eval_shape` against `num_params`).

Embeddings are tied: the output projection is the transposed input embedding (which saves
`vocab * d_model` parameters); the embedding is initialized with std `d_model ** -0.5` and
multiplied by `sqrt(d_model)` on input (as in Gemma), so both uses start at unit scale.

Imported models (`dpsynth.models.hf_import`) use the same `Transformer` with the options below
(all defaults reproduce the native architecture exactly): grouped-query attention
(`num_kv_heads`), an untied output head, LayerNorm or RMSNorm (optionally `(1 + w)`), q/k/v,
output and MLP biases, q/k norm, post-attention/post-MLP norms, plain GELU MLPs, learned
absolute positions, Llama-3/linear rope scaling, sliding-window layers, attention and final
logit soft-capping and `query_pre_attn_scalar`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

LORA_TARGETS = ("attention", "mlp", "all")
MLP_KINDS = ("gated_gelu", "swiglu", "gelu")
DTYPES = ("float32", "bfloat16")
NORM_KINDS = ("rms", "layernorm")
POSITION_KINDS = ("rope", "learned")
ROPE_SCALINGS = ("none", "linear", "llama3")
LAYER_KINDS = ("full", "sliding")
# The fields that describe adapters (LoRA, soft prompt) rather than the base model: a tuned
# model's config differs from its base's only in these (`ModelConfig.base` resets them).
ADAPTER_FIELDS = ("lora_rank", "lora_alpha", "lora_targets", "prompt_length")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape and options of the decoder-only Transformer.

    Attributes:
      vocab_size: number of token ids (the tokenizer's vocabulary size).
      d_model: residual stream width.
      num_layers: number of decoder blocks.
      num_heads: attention heads.
      head_dim: width of each head.
      d_ff: hidden width of the gated MLP.
      max_len: longest token sequence the model supports (positions are rotary, so this is a
        checked limit, not a parameter shape); soft-prompt slots come on top of it.
      mlp: "gated_gelu" or "swiglu".
      rope_base: rotary frequency base.
      norm_eps: RMSNorm epsilon.
      lora_rank: LoRA rank r; 0 disables LoRA (no variables, no compute).
      lora_alpha: LoRA scale numerator (the update is `alpha / r * x @ A @ B`).
      lora_targets: which projections get adapters: "attention" (q, k, v, o), "mlp"
        (gate, up, down) or "all".
      prompt_length: number P of soft-prompt vectors; 0 disables them.
      dtype: compute dtype ("float32" or "bfloat16"); the logits are always float32.
      remat: rematerialize each block in the backward pass (saves memory on big presets).
      preset: the preset this config came from ("custom" otherwise); recorded in checkpoints.
      num_kv_heads: key/value heads (grouped-query attention; None = num_heads). Each K/V head
        serves `num_heads // num_kv_heads` consecutive query heads; the KV cache holds these.
      tie_embeddings: the output layer is the transposed input embedding; otherwise a
        separate `lm_head` kernel [d_model, vocab].
      scale_embedding: multiply the input embedding by sqrt(d_model).
      norm: "rms" (RMSNorm, no bias) or "layernorm" (mean-centred, with a bias).
      norm_scale_offset: the norm multiplies by `scale + offset` (Gemma's `1 + w`: 1.0).
      qkv_bias / o_bias / mlp_bias: biases on the q/k/v, output and MLP projections.
      qk_norm: RMSNorm (same kind/offset as the others) over each q and k head.
      post_norms: extra norms on the attention and MLP outputs before the residual add
        (Gemma 2/3).
      positions: "rope" (rotary) or "learned" (absolute embedding [max_len, d_model], GPT-2).
      rope_scaling: "none", "linear" (frequencies / factor) or "llama3" (Llama 3.1 bands).
      rope_factor / rope_low_freq_factor / rope_high_freq_factor / rope_original_max_len:
        the scaling's parameters.
      rope_local_base: rotary base of sliding-window layers (None = rope_base, unscaled).
      sliding_window: window w of "sliding" layers (a token sees the w most recent positions,
        itself included).
      layer_kinds: per-layer "full" or "sliding" (empty = all full).
      query_pre_attn_scalar: scores are scaled by this ** -0.5 (None: head_dim ** -0.5).
      attn_softcap / final_softcap: `cap * tanh(x / cap)` on attention scores / logits.
    """

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    head_dim: int
    d_ff: int
    max_len: int
    mlp: str = "gated_gelu"
    rope_base: float = 10_000.0
    norm_eps: float = 1e-6
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: str = "all"
    prompt_length: int = 0
    dtype: str = "float32"
    remat: bool = False
    preset: str = "custom"
    num_kv_heads: int | None = None
    tie_embeddings: bool = True
    scale_embedding: bool = True
    norm: str = "rms"
    norm_scale_offset: float = 0.0
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False
    positions: str = "rope"
    rope_scaling: str = "none"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    rope_local_base: float | None = None
    sliding_window: int | None = None
    layer_kinds: tuple[str, ...] = ()
    query_pre_attn_scalar: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None

    def __post_init__(self):
        if isinstance(self.layer_kinds, list):  # from JSON
            object.__setattr__(self, "layer_kinds", tuple(self.layer_kinds))
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "head_dim", "d_ff", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for rotary positions, got {self.head_dim}")
        if self.mlp not in MLP_KINDS:
            raise ValueError(f"ModelConfig.mlp must be one of {MLP_KINDS}, got {self.mlp!r}")
        if self.lora_targets not in LORA_TARGETS:
            raise ValueError(f"ModelConfig.lora_targets must be one of {LORA_TARGETS}, got {self.lora_targets!r}")
        if not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise ValueError(f"ModelConfig.lora_rank must be an int >= 0, got {self.lora_rank!r}")
        if self.lora_rank and self.lora_alpha <= 0:
            raise ValueError(f"ModelConfig.lora_alpha must be > 0, got {self.lora_alpha}")
        if not isinstance(self.prompt_length, int) or self.prompt_length < 0:
            raise ValueError(f"ModelConfig.prompt_length must be an int >= 0, got {self.prompt_length!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"ModelConfig.dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.rope_base <= 0 or self.norm_eps <= 0:
            raise ValueError("ModelConfig.rope_base and norm_eps must be positive")
        kv = self.kv_heads
        if not isinstance(kv, int) or kv <= 0 or self.num_heads % kv:
            raise ValueError(f"ModelConfig.num_kv_heads must be a positive divisor of num_heads={self.num_heads}, "
                             f"got {self.num_kv_heads!r}")
        for name, allowed in (("norm", NORM_KINDS), ("positions", POSITION_KINDS), ("rope_scaling", ROPE_SCALINGS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"ModelConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.layer_kinds:
            if len(self.layer_kinds) != self.num_layers or any(k not in LAYER_KINDS for k in self.layer_kinds):
                raise ValueError(f"ModelConfig.layer_kinds must be {self.num_layers} entries of {LAYER_KINDS}, "
                                 f"got {self.layer_kinds!r}")
            if "sliding" in self.layer_kinds and (not isinstance(self.sliding_window, int) or self.sliding_window <= 0):
                raise ValueError(f"ModelConfig.sliding_window must be a positive int when layers slide, "
                                 f"got {self.sliding_window!r}")
        for name in ("rope_factor", "query_pre_attn_scalar", "attn_softcap", "final_softcap", "rope_local_base"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {value!r}")

    # ------------------------------------------------------------------ derived values
    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    def layer_kind(self, i: int) -> str:
        return self.layer_kinds[i] if self.layer_kinds else "full"

    @property
    def lora_scale(self) -> float:
        return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

    def lora_applies(self, kind: str) -> bool:
        """Whether projections of `kind` ("attention" or "mlp") carry LoRA adapters."""
        return self.lora_rank > 0 and self.lora_targets in (kind, "all")

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def base(self) -> "ModelConfig":
        """The same model without adapters (what a pretrained checkpoint stores): every field of
        `ADAPTER_FIELDS` at its default, so a base compares equal to its base whatever the
        adapters' rank, scale, targets or prompt length."""
        defaults = {f.name: f.default for f in dataclasses.fields(self) if f.name in ADAPTER_FIELDS}
        return self.replace(**defaults)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"ModelConfig: unknown fields {sorted(unknown)} (written by a newer dpsynth?)")
        return cls(**data)

    # ------------------------------------------------------------------ sizes
    def num_params(self, collections: tuple[str, ...] = ("params", "lora", "prompt")) -> int:
        """Closed-form parameter count of the given variable collections."""
        d, f, hq = self.d_model, self.d_ff, self.num_heads * self.head_dim
        hkv = self.kv_heads * self.head_dim
        n_mlp = 2 if self.mlp == "gelu" else 3
        norm = d * (2 if self.norm == "layernorm" else 1)
        total = 0
        if "params" in collections:
            per_layer = (4 if self.post_norms else 2) * norm + 2 * d * hq + 2 * d * hkv + n_mlp * d * f
            per_layer += (hq + 2 * hkv) * self.qkv_bias + d * self.o_bias
            per_layer += (f * (n_mlp - 1) + d) * self.mlp_bias
            per_layer += 2 * self.head_dim * (2 if self.norm == "layernorm" else 1) * self.qk_norm
            total += self.vocab_size * d + self.num_layers * per_layer + norm
            total += 0 if self.tie_embeddings else self.vocab_size * d
            total += self.max_len * d if self.positions == "learned" else 0
        if "lora" in collections and self.lora_rank:
            r, per_layer = self.lora_rank, 0
            if self.lora_applies("attention"):
                per_layer += r * (2 * d + 2 * hq) + 2 * r * (d + hkv)
            if self.lora_applies("mlp"):
                per_layer += n_mlp * r * (d + f)
            total += self.num_layers * per_layer
        if "prompt" in collections:
            total += self.prompt_length * d
        return total

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward = 3x forward), PaLM-style estimate.

        6 * N (matmul parameters, embeddings included because they are the output layer)
        plus the attention score/value matmuls 12 * layers * heads * head_dim * seq_len / 2
        (causal: half the square is computed usefully).
        """
        n = self.num_params(("params",)) - self.d_model * (2 * self.num_layers + 1)
        attn = 12 * self.num_layers * self.num_heads * self.head_dim * seq_len / 2
        return 6.0 * n + attn


PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=512, d_model=64, num_layers=2, num_heads=4, head_dim=16, d_ff=128, max_len=1024),
    "cpu": dict(vocab_size=8192, d_model=128, num_layers=4, num_heads=4, head_dim=32, d_ff=384, max_len=512),
    "small": dict(vocab_size=8192, d_model=256, num_layers=4, num_heads=4, head_dim=64, d_ff=768, max_len=1024),
    "1b": dict(vocab_size=32000, d_model=2048, num_layers=16, num_heads=16, head_dim=128, d_ff=8192, max_len=2048,
               dtype="bfloat16", remat=True),
    "8b": dict(vocab_size=32000, d_model=4096, num_layers=32, num_heads=32, head_dim=128, d_ff=16384, max_len=2048,
               dtype="bfloat16", remat=True),
}


def get_config(preset: str, **overrides: Any) -> ModelConfig:
    """The config of a named preset, with keyword overrides (e.g. `vocab_size=tok.vocab_size`)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; choose one of {sorted(PRESETS)}")
    fields = {**PRESETS[preset], "preset": preset, **overrides}
    return ModelConfig(**fields)

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
"""

from __future__ import annotations

import dataclasses
from typing import Any

LORA_TARGETS = ("attention", "mlp", "all")
MLP_KINDS = ("gated_gelu", "swiglu")
DTYPES = ("float32", "bfloat16")


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
      dtype: compute dtype ("float32" or "bfloat16"); parameters stay float32 and the
        logits are always float32.
      remat: rematerialize each block in the backward pass (saves memory on big presets).
      preset: the preset this config came from ("custom" otherwise); recorded in checkpoints.
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

    def __post_init__(self):
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

    # ------------------------------------------------------------------ derived values
    @property
    def lora_scale(self) -> float:
        return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

    def lora_applies(self, kind: str) -> bool:
        """Whether projections of `kind` ("attention" or "mlp") carry LoRA adapters."""
        return self.lora_rank > 0 and self.lora_targets in (kind, "all")

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def base(self) -> "ModelConfig":
        """The same model without adapters (what a pretrained checkpoint stores)."""
        return self.replace(lora_rank=0, prompt_length=0)

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
        total = 0
        if "params" in collections:
            per_layer = 2 * d + 4 * d * hq + 3 * d * f
            total += self.vocab_size * d + self.num_layers * per_layer + d
        if "lora" in collections and self.lora_rank:
            r, per_layer = self.lora_rank, 0
            if self.lora_applies("attention"):
                per_layer += 4 * r * (d + hq)
            if self.lora_applies("mlp"):
                per_layer += 3 * r * (d + f)
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

"""The sampler's configuration: `SamplerConfig`, its user-facing `SamplingOptions`, and the
logit filters the options define (`filter_logits`).

This module imports no JAX at load (the experiment config validates sampling options through
it cheaply); `filter_logits` imports it when traced. A new sampling option is a field here
(declared with `_option`: flag, experiment key, report column and stage-hash rule follow) and,
when it filters the distribution, its lines in `filter_logits`. See `dpsynth.generate.sampler`
for the sampling semantics.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dpsynth import binding
from dpsynth.binding import SettingError
from dpsynth.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from dpsynth.train.prompts import GUIDANCE_CONTRASTS

NEG_INF = -1e30

# Field metadata key of a sampling option: a setting a user chooses per generation job. The
# options (and only they) are `dpsynth generate`'s sampling flags, the experiment's
# `generate.samplings` entries (`SamplingOptions`) and the report's generation card, so a new
# option is one field here (declared with `_option`) and its use in `filter_logits`.
OPTION = "sampling_option"


def _option(default: Any, help: str, **kwargs: Any) -> Any:
    return binding.setting(default, help=help, **kwargs, **{OPTION: True})


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplerConfig:
    """How to sample.

    The sampling options (`OPTION`: temperature, top_k, min_p, num_decodes, guidance,
    guidance_contrast) carry their help text; the others are set by the job.

    Attributes:
      temperature: softmax temperature; 0 means greedy decoding.
      top_k: sample among the k most likely tokens only; 0 means the full distribution.
      min_p: sample among the tokens whose probability is at least min_p times the most
        likely token's; 0 means off.
      num_decodes: candidates per prompt; the most likely one (total log-likelihood) is kept.
      max_len: maximum total tokens per row (prompt + generated).
      batch_size: prompts per compiled call (the last batch is padded to this size).
      prompt_bucket: prompt lengths are padded up to a multiple of this, so prompts of
        similar length share one compiled function.
      eos_id: end-of-sequence id; pad_id: id written after a row's end.
      vocab_limit: ids >= this are never drawn (a model vocabulary larger than the
        tokenizer's); None = no limit.
      banned_ids: ids never drawn (padding and BOS by default).
      guidance: w of label-guided sampling (0 = unguided; see `dpsynth.generate.sampler`); rows then
        need contrast prompts (`Sampler.sample(..., contrasts=...)`).
      guidance_contrast: what the job contrasts each row's prompt with ("others": the other
        labels' prompts; "null": the null prompt); the sampler takes the contrast prompts it
        is given, so this is not part of its `identity` (the job records it).
      cache_block: the decode loop runs in phases of this many steps (at most `MAX_PHASES`,
        widened to fit) over a KV cache that grows between them to what the next phase's rows
        can fill (`dpsynth.generate.sampler`); 0 = one loop over a cache of `max_len`. Speed
        only: the logits agree to float32 rounding.
    """

    temperature: float = _option(1.0, "softmax temperature; 0 = greedy")
    top_k: int = _option(0, "sample among the k most likely tokens; 0 = all")
    min_p: float = _option(0.0, "sample among the tokens at least this fraction as likely as the most likely one; "
                                "0 = off", unless_default=True)
    num_decodes: int = _option(1, "candidates per example; the most likely is kept")
    max_len: int = 512
    batch_size: int = 16
    prompt_bucket: int = 16
    eos_id: int = EOS_ID
    pad_id: int = PAD_ID
    vocab_limit: int | None = None
    banned_ids: tuple[int, ...] = (PAD_ID, BOS_ID)
    guidance: float = _option(0.0, "label-guided sampling weight w (0 = unguided): l(x|y) + w (l(x|y) - "
                                   "l(x|contrast)); no privacy cost", unless_default=True)
    guidance_contrast: str = _option("others", "contrast of the guidance: the other labels' prompts, or the null "
                                     "prompt (a model DP-tuned with `dp-tune --label-dropout`)", choices=GUIDANCE_CONTRASTS,
                                     unless_default="guidance")
    cache_block: int = binding.setting(128, help="decode steps per phase of a growing KV cache (0 = one cache of max_len)",
                                       unless_default=True)

    def __post_init__(self):
        if not (self.temperature >= 0.0 and np.isfinite(self.temperature)):
            raise SettingError("temperature", f"must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SettingError("top_k", f"must be >= 0 (0 = full distribution), got {self.top_k}")
        if not (0.0 <= self.min_p <= 1.0):
            raise SettingError("min_p", f"must be in [0, 1] (0 = off), got {self.min_p}")
        object.__setattr__(self, "min_p", float(self.min_p))
        if self.num_decodes < 1:
            raise SettingError("num_decodes", f"must be >= 1, got {self.num_decodes}")
        if self.max_len < 2:
            raise ValueError(f"max_len must be >= 2, got {self.max_len}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.vocab_limit is not None and self.vocab_limit <= self.eos_id:
            raise ValueError(f"vocab_limit {self.vocab_limit} must exceed eos_id {self.eos_id}")
        if self.cache_block < 0:
            raise ValueError(f"cache_block must be >= 0 (0 = one cache of max_len), got {self.cache_block}")
        if self.prompt_bucket < 1:
            raise ValueError(f"prompt_bucket must be >= 1, got {self.prompt_bucket}")
        if not (np.isfinite(self.guidance) and self.guidance >= 0.0):
            raise SettingError("guidance", f"must be a finite number >= 0 (0 = unguided), got {self.guidance}")
        object.__setattr__(self, "guidance", float(self.guidance))
        if self.guidance_contrast not in GUIDANCE_CONTRASTS:
            raise SettingError("guidance_contrast", f"must be one of {', '.join(GUIDANCE_CONTRASTS)}; "
                               f"got {self.guidance_contrast!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def guided(self) -> bool:
        return self.guidance != 0.0

    def identity(self) -> dict[str, Any]:
        """The fields that determine the output, as JSON (a job's config hash covers them).

        A setting added later (`binding.UNLESS_DEFAULT`: min_p, guidance) appears only when
        set, so earlier jobs' hashes stay valid; `guidance_contrast` never (the job records it).
        """
        d = binding.stage_dict(self)
        d.pop("guidance_contrast", None)
        d["banned_ids"] = tuple(d["banned_ids"])  # as `dataclasses.asdict` gave it (JSON: a list either way)
        return d

    def options(self) -> "SamplingOptions":
        """The sampling options of this sampler."""
        return SamplingOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(SamplingOptions)})


def _options_label(self) -> str:
    """A short id of the options for file and trial names: `t1-k0-n1`, plus `-p0.05` with min-p,
    `-g1.5` with guidance (and `-null` with its null contrast)."""
    label = f"t{self.temperature:g}-k{self.top_k}-n{self.num_decodes}"
    if self.min_p:
        label += f"-p{self.min_p:g}"
    if self.guidance:
        label += f"-g{self.guidance:g}" + ("-null" if self.guidance_contrast == "null" else "")
    return label


def _options_sampler(self, **job: Any) -> SamplerConfig:
    """The `SamplerConfig` of these options and the job's other fields (max_len, batch_size, ...);
    raises `SettingError` naming the field at fault."""
    return SamplerConfig(**dataclasses.asdict(self), **job)


def _options_validate(self) -> None:
    """Raises `SettingError` naming the option at fault (the check is `SamplerConfig`'s)."""
    self.sampler()


# The sampling options alone (`OPTION` fields of `SamplerConfig`, declared there): one
# `dpsynth generate` job's choice (`GenerateConfig.sampling`), one entry of an experiment's
# `generate.samplings`. `identity()` gives the stage hashes' view (added options only when set).
SamplingOptions = binding.subconfig(
    "SamplingOptions", SamplerConfig, lambda f: f.metadata.get(OPTION, False), module=__name__,
    namespace={"label": property(_options_label), "sampler": _options_sampler, "validate": _options_validate,
               "identity": binding.stage_dict},
    doc="The sampling options of `SamplerConfig` (declared there; `OPTION`), e.g. one grid point of an experiment.")



def allowed_ids(vocab: int, vocab_limit: int | None, banned_ids) -> np.ndarray:
    """`[vocab]` bool: the ids a sampler may draw (below `vocab_limit`, not in `banned_ids`); a NumPy
    constant of the compiled function (an imported tokenizer bans thousands of control ids)."""
    allowed = np.arange(vocab) < (vocab_limit if vocab_limit is not None else vocab)
    banned = np.asarray([b for b in banned_ids if 0 <= int(b) < vocab], np.int64)
    allowed[banned] = False
    return allowed


def filter_logits(scaled, cfg: SamplerConfig):
    """`scaled[R, V]` (logits already divided by the temperature) with the tokens the options
    exclude set to `NEG_INF`: those outside the top k (`top_k`), and those whose probability is
    below `min_p` times the row's largest (`min_p`)."""
    import jax
    import jax.numpy as jnp

    if cfg.top_k and cfg.top_k < scaled.shape[-1]:
        kth = jax.lax.top_k(scaled, cfg.top_k)[0][:, -1:]
        scaled = jnp.where(scaled < kth, NEG_INF, scaled)
    if cfg.min_p:  # p(x) >= min_p * max p  <=>  scaled(x) >= max scaled + log(min_p) (same normaliser)
        floor = jnp.max(scaled, axis=-1, keepdims=True) + jnp.log(jnp.asarray(cfg.min_p, scaled.dtype))
        scaled = jnp.where(scaled < floor, NEG_INF, scaled)
    return scaled

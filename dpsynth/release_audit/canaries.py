"""Canaries through the whole release: plant, DP-tune, generate, attack the synthetic corpus.

Procedure (`release_canary_audit`):
  1. draw 2k random canaries (`dpsynth.dp.audit.make_canaries`, the base model's vocabulary);
     the first k are inserted into D_train, each `repeats` times, under labels assigned in
     turn; the last k are held out (never seen by anything);
  2. DP-tune the base model on the augmented D_train (`dpsynth.train.finetune.dp_tune`) and
     generate a synthetic corpus from it (`dpsynth.generate.job.generate`), as a user would;
  3. the attacker holds only the release: an n-gram LM (`dpsynth.release_audit.ngram`) is
     fit on the synthetic corpus (both splits) and scores each canary by its mean
     log-probability per token;
  4. `dpsynth.dp.audit.canary_statistics` of inserted vs held-out scores: AUROC, exposure,
     and the epsilon lower bounds of `jax_privacy.auditing.CanaryScoreAuditor`
     (Clopper-Pearson and the one-run bound), reported beside the accounted epsilon.

`canary_verdict` reads the statistics at the audit's significance: `contradicts the privacy
report` when a lower bound exceeds the accounted epsilon with one-time canaries, `planted
records distinguished` when the AUROC's permutation p-value is below the significance (DP at
epsilon > 0 allows some of that), `at chance` otherwise.

Reading the result: the generator's guarantee covers the corpus (post-processing), so for
one-time canaries (repeats = 1) every lower bound must stay below the accounted epsilon up to
the bound's 5% failure probability; a canary inserted r times is protected only at the group
level (about r times epsilon). Without DP (epsilon = inf) and with repeats, the model
memorises the canaries, the corpus repeats them and the bounds rise clearly above 0: that is
the control showing that the audit can see memorisation.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpsynth.dp.audit import DEFAULT_SIGNIFICANCE
from dpsynth.release_audit import ngram

AT_CHANCE, DISTINGUISHED, CONTRADICTED = ("at chance", "planted records distinguished",
                                          "contradicts the privacy report")
DEFAULT_NUM_CANARIES = 32
DEFAULT_CANARY_LENGTH = 12


@dataclasses.dataclass(frozen=True)
class CanaryConfig:
    """The canaries and the attacker.

    Attributes:
      num_canaries: k inserted and k held out.
      repeats: copies of each inserted canary in D_train.
      length: tokens per canary (uniformly random vocabulary pieces).
      seed: seed of the canaries and of their labels.
      order: n of the attacker's n-gram LM.
    """

    num_canaries: int = DEFAULT_NUM_CANARIES
    repeats: int = 1
    length: int = DEFAULT_CANARY_LENGTH
    seed: int = 0
    order: int = ngram.DEFAULT_ORDER

    def __post_init__(self):
        for name in ("num_canaries", "repeats", "length"):
            if getattr(self, name) < 1:
                raise ValueError(f"canary {name} must be >= 1, got {getattr(self, name)}")


def _eps(x: float | None) -> float | str | None:
    """An epsilon as the privacy report writes it ("inf" for no privacy)."""
    return None if x is None else ("inf" if math.isinf(x) else float(x))


def plant(train_records: Sequence[dict], canaries: Sequence[str], labels: Sequence[str],
          repeats: int) -> list[dict]:
    """D_train plus each canary `repeats` times, canary i under labels[i % len(labels)]."""
    if not labels:
        raise ValueError("planting canaries needs at least one label")
    return list(train_records) + [
        {"id": f"canary-{i}-{r}", "text": text, "label": str(labels[i % len(labels)])}
        for i, text in enumerate(canaries) for r in range(repeats)]


def score_canaries(synthetic_texts: Sequence[str], canaries: Sequence[str], tokenizer, *,
                   order: int = ngram.DEFAULT_ORDER) -> tuple[np.ndarray, np.ndarray]:
    """(scores, longest runs): each canary's mean log-probability per token under an n-gram LM
    fit on the synthetic texts, and the longest token sequence it shares with any of them."""
    from dpsynth.dedup.match import longest_shared_with

    synth = tokenizer.encode_batch(list(synthetic_texts))
    docs = tokenizer.encode_batch(list(canaries))
    vocab = max([tokenizer.vocab_size] + [int(d.max()) + 1 for d in synth + docs if d.size])
    lm = ngram.NgramLM(synth, vocab, order=order)
    return lm.score(docs), longest_shared_with(synth, docs)


def canary_verdict(stats: dict[str, Any], *, accounted_epsilon: float | None, repeats: int) -> str:
    """The verdict of `dpsynth.dp.audit.canary_statistics` output at its own significance (see the module)."""
    bound = max(stats["epsilon_lb_clopper_pearson"], stats["epsilon_lb_one_run"])
    if repeats == 1 and accounted_epsilon is not None and bound > accounted_epsilon:
        return CONTRADICTED
    return DISTINGUISHED if stats["auroc_p_value"] < stats["significance"] else AT_CHANCE


def release_canary_audit(base_dir: str, train_records: Sequence[dict], valid_records: Sequence[dict], work_dir: str,
                         tune_config, *, num_examples: int, valid_examples: int = 0, canaries: CanaryConfig = CanaryConfig(),
                         labels: Sequence[str] | None = None, generate_options: dict[str, Any] | None = None,
                         beam_args: Sequence[str] = (), significance: float = DEFAULT_SIGNIFICANCE) -> dict[str, Any]:
    """Plants canaries, DP-tunes and generates into `work_dir` (owner-only), attacks the corpus.

    Args:
      base_dir: the base model directory (as for `dpsynth dp-tune`).
      train_records, valid_records: D_train and D_valid ({"id", "text", "label"}).
      work_dir: owner-only directory for the canaried model (`model/`), its private state
        (`state/`) and corpus (`corpus/`): they were trained on the canaries and D_train and
        are never a release.
      tune_config: the `TuneConfig` of the run (as the user's dp-tune).
      num_examples, valid_examples: synthetic examples to generate.
      canaries: the canaries and the attacker.
      labels: the label set (default: the sorted labels of D_train).
      generate_options: further `GenerateConfig` fields (sampling, max_len, ...).
      beam_args: Beam flags of the generation.
      significance: level of the canary verdict; the epsilon lower bounds hold with probability
        1 - significance.

    Returns:
      Numbers only (no canary text): the canary statistics, the accounted epsilon and delta,
      and the canaries' longest runs found verbatim in the corpus.
    """
    from dpsynth.data.tokenizers import load_tokenizer
    from dpsynth.dp import audit
    from dpsynth.generate.job import GenerateConfig, generate
    from dpsynth.owner_only import make_private_dir
    from dpsynth.train.finetune import dp_tune

    work_dir = make_private_dir(work_dir)
    labels = list(labels) if labels is not None else sorted({str(r["label"]) for r in train_records})
    tokenizer = load_tokenizer(base_dir)
    texts = audit.make_canaries(tokenizer, 2 * canaries.num_canaries, length=canaries.length, seed=canaries.seed)
    inserted, held_out = texts[: canaries.num_canaries], texts[canaries.num_canaries :]
    augmented = plant(train_records, inserted, labels, canaries.repeats)
    model_dir, corpus_dir = os.path.join(work_dir, "model"), os.path.join(work_dir, "corpus")
    result = dp_tune(base_dir, augmented, list(valid_records), model_dir, tune_config, labels=labels,
                     state_dir=os.path.join(work_dir, "state"), progress_interval=60.0)
    accounted = result.epsilon.get(tune_config.accountant)
    generate(GenerateConfig(model_dir=model_dir, out_dir=corpus_dir, num_examples=num_examples,
                            valid_examples=valid_examples, allow_non_private=not result.report.get("private", False),
                            **(generate_options or {})), beam_args=beam_args)
    from dpsynth.release_audit.run import read_release

    synthetic = [r["text"] for r in read_release(corpus_dir)[0]]  # (empty rows carry no canary)
    scores, runs = score_canaries(synthetic, inserted + held_out, tokenizer, order=canaries.order)
    k = canaries.num_canaries
    stats = audit.canary_statistics(scores[:k], scores[k:], delta=result.delta, significance=significance)
    return {
        "canaries": dataclasses.asdict(canaries),
        "attacker": f"{canaries.order}-gram LM fit on the synthetic corpus only (mean log-probability per token)",
        "accounted_epsilon": _eps(accounted), "target_epsilon": _eps(tune_config.epsilon), "delta": float(result.delta),
        "accountant": tune_config.accountant, "dp_tune_steps": int(result.steps),
        "num_train_with_canaries": len(augmented), "num_synthetic": len(synthetic),
        **stats,
        "verdict": canary_verdict(stats, accounted_epsilon=accounted, repeats=canaries.repeats),
        "longest_run_in_corpus": {"inserted_mean": float(runs[:k].mean()), "held_out_mean": float(runs[k:].mean()),
                                  "inserted_max": int(runs[:k].max()), "held_out_max": int(runs[k:].max())},
        "work_dir": work_dir,
    }


@dataclasses.dataclass(frozen=True)
class Replay:
    """How the audited corpus was made, as its files record it (what a canary run repeats)."""

    model_dir: str
    base_dir: str | None
    tune_config: Any  # dpsynth.train.tune_config.TuneConfig, with a fresh secret seed
    labels: tuple[str, ...]
    num_examples: int
    valid_examples: int
    generate_options: dict[str, Any]


def replay_of(corpus_dir: str) -> Replay:
    """Reads the dp-tune config (the generator model's manifest) and the generation config
    (`generation_config.json`) of a synthetic corpus, to rerun both with canaries planted.

    The recorded seed is withheld from the manifest, so the rerun draws a secret one; labels
    are drawn uniformly (a DP label histogram is not redrawn: it would spend budget anew).
    """
    from dpsynth import fileio
    from dpsynth.generate.postprocess import PostprocessConfig
    from dpsynth.generate.sampler_config import SamplingOptions
    from dpsynth.release_audit.run import AuditError
    from dpsynth.train.tune_config import TuneConfig

    def read(path):
        try:
            return fileio.read_json(path)
        except (OSError, ValueError) as e:
            raise AuditError(f"{path}: unreadable ({e})") from e

    gen = read(os.path.join(corpus_dir, "generation_config.json"))
    model_dir = gen.get("model_dir")
    if not model_dir or not os.path.isfile(os.path.join(model_dir, "manifest.json")):
        raise AuditError(f"{corpus_dir}: its generator model {model_dir!r} is not here (the canary run repeats its dp-tune)")
    manifest = read(os.path.join(model_dir, "manifest.json"))
    recorded = dict((manifest.get("dp_tune") or {}).get("config") or {})
    if not recorded:
        raise AuditError(f"{model_dir}/manifest.json: records no dp-tune config (not a DP-tuned model)")
    fields = {f.name for f in dataclasses.fields(TuneConfig)}
    recorded = {k: v for k, v in recorded.items() if k in fields and k != "seed"}
    if recorded.get("epsilon") == "inf":
        recorded["epsilon"] = math.inf
    # A record holds the resolved contrast and leaves out 0 (`TuneConfig.to_json`): absent is off,
    # not the "auto" a new run starts from; likewise its form leaves out "full" (the one form of
    # older records): absent is full, not the "auto" that samples above 4 labels.
    recorded.setdefault("label_contrast", 0.0)
    recorded.setdefault("label_contrast_form", "full")
    try:
        tune = TuneConfig(**recorded)
    except (TypeError, ValueError) as e:
        raise AuditError(f"{model_dir}/manifest.json: its dp-tune config cannot be replayed ({e})") from e
    sampler = gen.get("sampler") or {}
    sampling = {f.name: sampler[f.name] for f in dataclasses.fields(SamplingOptions) if sampler.get(f.name) is not None}
    if gen.get("guidance_contrast"):  # the job records it beside the sampler
        sampling["guidance_contrast"] = gen["guidance_contrast"]
    options: dict[str, Any] = {k: sampler[k] for k in ("max_len", "batch_size") if sampler.get(k) is not None}
    options["sampling"] = SamplingOptions(**sampling)
    options["seed"] = int(gen.get("seed", 0))
    options["examples_per_shard"] = int(gen.get("examples_per_shard", 256))
    if gen.get("postprocess"):
        post = {k: tuple(v) if isinstance(v, list) else v for k, v in gen["postprocess"].items()}
        options["postprocess"] = PostprocessConfig(**post)
    labels = tuple((gen.get("label_distribution") or {}).get("labels") or manifest.get("labels") or ())
    counts = gen.get("num_examples") or {}
    base = manifest.get("base")
    return Replay(model_dir=model_dir, base_dir=base.get("path") if isinstance(base, dict) else None, tune_config=tune,
                  labels=labels, num_examples=int(counts.get("train", 0)), valid_examples=int(counts.get("valid", 0)),
                  generate_options=options)

"""Does a base model already know D? The contamination probe of `dpsynth probe`.

dpsynth's own pretraining cuts every >= 50-token overlap between the public corpus and the
sensitive data (`dpsynth.dedup`). An imported base model (`dpsynth import-model`) was pretrained
on data nobody deduplicated against D: if D (a public benchmark, scraped text) was in it, the
model can reproduce D whatever the DP fine-tuning's epsilon. This probe asks the model, before
any tuning, whether it behaves as if it had seen D, by comparing D with a control set:

* Verbatim continuation: of `records` records sampled (seeded) from each set, every record with
  at least `prefix_tokens + match_tokens` tokens is prompted with BOS and its first
  `prefix_tokens` tokens; the continuation decoded greedily by the generation sampler
  (`dpsynth.generate.sampler`, temperature 0) counts as a hit when its first `match_tokens`
  tokens equal the record's next ones exactly. Shorter records are counted (`too_short`), not
  tested. The hit counts of D and control are compared by Fisher's exact test, one-sided
  (D has more hits).
* Likelihood: every sampled record's mean log-likelihood per token (BOS, then its first
  `max_tokens` tokens; `dpsynth.evaluate.lm.LanguageModel.mean_log_likelihoods`); D against
  control by the Mann-Whitney U test, one-sided (D more likely), and the AUROC (the probability
  that a D record is more likely than a control record, ties counted half).

Each test's verdict at `significance`: `SEEN` ("evidence the model has seen D") when its p-value
is below it, else `UNSEEN` ("no evidence"). Both are only as good as the control (`CAVEAT`): it
must be text the model cannot have seen, matched to D in domain and length; and the probe can
show presence, never prove absence.

Privacy: the probe reads D without DP, so its figures are non-DP statistics of D. They go only
into the owner-only `OUT` (0700; `contamination_probe.json` and `.md`, 0600; docs/formats.md),
never into a published report: `dp-tune --contamination-probe OUT` keeps the verdicts in the
tuned model's private state, and its privacy report says only whether a probe ran
(`dpsynth.train.tune_report.imported_base_channel`). No record text is written or logged, only
counts and statistics.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpsynth import binding, fileio
from dpsynth.binding import SettingError
from dpsynth.data import dead_letters
from dpsynth.errors import DpsynthError

FORMAT = "dpsynth.contamination_probe"
FORMAT_VERSION = 1
REPORT_JSON, REPORT_MD = "contamination_probe.json", "contamination_probe.md"
SEEN = "evidence the model has seen D"
UNSEEN = "no evidence"
NOTICE = ("This probe reads D without differential privacy: its figures are non-DP statistics of D, for the data "
          "owner only; never publish them or ship them with a model or corpus.")
CAVEAT = ("The control set must be text the model cannot have seen (e.g. written after its training data was "
          "collected), matched to D in domain and length: a control from another domain or of other lengths differs "
          "in likelihood for reasons other than memorisation, and a control the model has also seen hides it. The probe "
          "can show that the model has seen D, never prove that it has not: 'no evidence' is not evidence of absence "
          "(a model may know D without reproducing it verbatim from these prefixes).")

logger = logging.getLogger("dpsynth.evaluate.contamination")


class ProbeError(DpsynthError, ValueError):
    """Bad input of `dpsynth probe` (names the file or flag and the reason)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProbeConfig:
    """What the probe samples and tests (module docstring)."""

    records: int = binding.setting(128, help="records sampled (seeded) from each of --data and --control")
    prefix_tokens: int = binding.setting(32, help="verbatim test: the record's first tokens given as the prompt")
    match_tokens: int = binding.setting(32, help="verbatim test: greedy continuation tokens that must equal the "
                                                 "record's next tokens exactly (k)")
    max_tokens: int = binding.setting(512, help="likelihood test: tokens scored per record (longer records are cut; "
                                                "at most the model's max_len)")
    significance: float = binding.setting(0.05, help="level of both tests' verdicts")
    batch_size: int = binding.setting(16, help="records per compiled model call")
    seed: int = binding.setting(0, help="seed of the record samples")

    def __post_init__(self):
        for name in ("records", "prefix_tokens", "match_tokens", "max_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise SettingError(name, f"must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.significance < 1.0:
            raise SettingError("significance", f"must be in (0, 1), got {self.significance}")


# ----------------------------------------------------------------------------- statistics


def fisher_greater(hits: int, n: int, control_hits: int, control_n: int) -> float:
    """One-sided Fisher exact p-value that D's hit rate (`hits` of `n`) exceeds the control's; 1.0
    when either set has no tested record."""
    import scipy.stats

    if n == 0 or control_n == 0:
        return 1.0
    table = [[hits, n - hits], [control_hits, control_n - control_hits]]
    return float(scipy.stats.fisher_exact(table, alternative="greater").pvalue)


def auroc(scores: Sequence[float], control: Sequence[float]) -> float | None:
    """P(a D score > a control score) + P(equal) / 2 (ranks; None when a set is empty)."""
    import scipy.stats

    x, y = np.asarray(scores, np.float64), np.asarray(control, np.float64)
    if not len(x) or not len(y):
        return None
    ranks = scipy.stats.rankdata(np.concatenate([x, y]))  # ties: mean ranks
    u = float(ranks[: len(x)].sum()) - len(x) * (len(x) + 1) / 2.0
    return u / (len(x) * len(y))


def mann_whitney_greater(scores: Sequence[float], control: Sequence[float]) -> float:
    """One-sided Mann-Whitney U p-value that D's scores are stochastically larger; 1.0 when a set is
    empty or every score is equal."""
    import scipy.stats

    x, y = np.asarray(scores, np.float64), np.asarray(control, np.float64)
    if not len(x) or not len(y) or np.ptp(np.concatenate([x, y])) == 0.0:
        return 1.0
    return float(scipy.stats.mannwhitneyu(x, y, alternative="greater").pvalue)


def verdict(p_value: float, significance: float) -> str:
    return SEEN if p_value < significance else UNSEEN


# ----------------------------------------------------------------------------- the model's answers


def sample(records: Sequence[dict], n: int, seed: int, stream: int) -> list[dict]:
    """`n` records (all when fewer) drawn without replacement with `default_rng([seed, stream])`,
    in file order."""
    if len(records) <= n:
        return list(records)
    chosen = np.sort(np.random.default_rng([seed, stream]).choice(len(records), size=n, replace=False))
    return [records[i] for i in chosen]


def split_verbatim(tokens: np.ndarray, prefix_tokens: int, match_tokens: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(the first `prefix_tokens` tokens, the next `match_tokens`), or None for a shorter record."""
    if len(tokens) < prefix_tokens + match_tokens:
        return None
    return tokens[:prefix_tokens], tokens[prefix_tokens : prefix_tokens + match_tokens]


def greedy_hits(bundle, prefixes: Sequence[np.ndarray], targets: Sequence[np.ndarray], *, batch_size: int) -> np.ndarray:
    """bool [n]: whether the model's greedy continuation of BOS + prefix i starts with `targets[i]`.

    Decoded by the generation sampler at temperature 0 (`dpsynth.generate.sampler.Sampler`), with
    the model's own special ids and vocabulary limit (`transforms.worker_sampler_config`); a row
    that ends (EOS) before `len(targets[i])` tokens is no hit.
    """
    from dpsynth.data.tokenizers import BOS_ID
    from dpsynth.generate.sampler import Sampler, SamplerConfig, example_keys, seed_to_key_data
    from dpsynth.generate.transforms import worker_sampler_config

    if not prefixes:
        return np.zeros((0,), bool)
    bos = getattr(bundle.tokenizer, "bos_id", BOS_ID)
    prompts = [np.concatenate([[bos], p]).astype(np.int32) for p in prefixes]
    width, match = max(len(p) for p in prompts), max(len(t) for t in targets)
    cfg = worker_sampler_config(SamplerConfig(temperature=0.0, max_len=width + match, batch_size=batch_size,
                                              prompt_bucket=width), bundle.tokenizer)
    keys = example_keys(seed_to_key_data(0), range(len(prompts)))  # (unused: greedy draws nothing)
    out = Sampler(bundle.decoder, cfg).sample(bundle.params, prompts, keys)
    return np.asarray([out.lengths[i] >= len(t) and np.array_equal(out.tokens[i, : len(t)], t)
                       for i, t in enumerate(targets)], bool)


def _describe(values: np.ndarray) -> dict[str, Any]:
    if not len(values):
        return {"records": 0, "mean": None, "median": None}
    return {"records": int(len(values)), "mean": float(np.mean(values)), "median": float(np.median(values))}


def probe_model(model_dir: str, data: Sequence[dict], control: Sequence[dict], config: ProbeConfig = ProbeConfig(),
                *, loaded=None) -> dict[str, Any]:
    """Runs both tests on records sampled from `data` and `control` ({"text", ...}); returns the
    report's figures (module docstring). `loaded`: the model (`dpsynth.models.directory.load_model`
    of `model_dir`), when the caller has it."""
    from dpsynth.evaluate.lm import LanguageModel
    from dpsynth.generate.model_info import ModelBundle
    from dpsynth.generate.sampler import TransformerDecodeModel

    if loaded is None:
        from dpsynth.models.directory import load_model

        loaded = load_model(model_dir)
    max_len = loaded.config.max_len
    if config.prefix_tokens + 1 + config.match_tokens > max_len:
        raise ProbeError(f"--prefix-tokens {config.prefix_tokens} + --match-tokens {config.match_tokens} + BOS exceed "
                         f"the model's max_len {max_len}")
    tok = loaded.tokenizer
    sets = {"data": sample(data, config.records, config.seed, 0), "control": sample(control, config.records, config.seed, 1)}
    tokens = {name: [np.asarray(t, np.int32) for t in tok.encode_batch([r["text"] for r in rows])]
              for name, rows in sets.items()}
    bundle = ModelBundle(decoder=TransformerDecodeModel(loaded.config), params=loaded.variables, tokenizer=tok)
    lm = LanguageModel(loaded.config, loaded.variables, tok)
    keep = min(config.max_tokens, max_len)
    verbatim, likelihood, scores = {}, {}, {}
    for name, rows in tokens.items():
        split = [split_verbatim(t, config.prefix_tokens, config.match_tokens) for t in rows]
        tested = [s for s in split if s is not None]
        hits = greedy_hits(bundle, [s[0] for s in tested], [s[1] for s in tested], batch_size=config.batch_size)
        verbatim[name] = {"sampled": len(rows), "tested": len(tested), "too_short": len(rows) - len(tested),
                          "exact": int(hits.sum())}
        scored = [t[:keep] for t in rows if len(t)]
        scores[name] = lm.mean_log_likelihoods(scored, batch_size=config.batch_size)
        likelihood[name] = {**_describe(scores[name]), "no_tokens": len(rows) - len(scored),
                            "truncated": sum(len(t) > keep for t in rows)}
        logger.info("probe: %s: %d of %d records tested verbatim, %d scored", name, len(tested), len(rows),
                    len(scored))
    d, c = verbatim["data"], verbatim["control"]
    p_verbatim = fisher_greater(d["exact"], d["tested"], c["exact"], c["tested"])
    p_likelihood = mann_whitney_greater(scores["data"], scores["control"])
    verbatim.update(test="Fisher's exact test, one-sided (D has more exact continuations)", p_value=p_verbatim,
                    verdict=verdict(p_verbatim, config.significance))
    likelihood.update(test="Mann-Whitney U, one-sided (D's records more likely)", p_value=p_likelihood,
                      auroc=auroc(scores["data"], scores["control"]), verdict=verdict(p_likelihood, config.significance))
    overall = SEEN if SEEN in (verbatim["verdict"], likelihood["verdict"]) else UNSEEN
    return {"config": dataclasses.asdict(config), "verbatim": verbatim, "likelihood": likelihood, "verdict": overall}


# ----------------------------------------------------------------------------- the owner-only output


def check_location(out_dir: str, model_dir: str) -> None:
    """Raises `ProbeError` unless `out_dir` lies outside the model directory (which may be published)
    and is (or can be made) a writable directory."""
    from dpsynth.owner_only import check_report_location

    try:
        check_report_location(out_dir, model_dir, "--out: the probe directory")
    except ValueError as e:
        raise ProbeError(str(e)) from e


def check_out(out_dir: str, model_dir: str) -> str:
    """Creates the owner-only `out_dir` (0700) after `check_location` and checking that it holds no
    probe yet and nothing but the command's run files and dead letters; returns its absolute path."""
    from dpsynth.owner_only import make_report_dir

    try:
        return make_report_dir(out_dir, model_dir, what="--out: the probe directory", report_file=REPORT_JSON,
                               allowed=(dead_letters.FILE,))
    except ValueError as e:
        raise ProbeError(str(e)) from e


def _files(paths: Sequence[str]) -> list[dict[str, str]]:
    return [{"path": os.path.abspath(p), "sha256": fileio.sha256_file(p)} for p in paths if os.path.isfile(p)]


def run_probe(model_dir: str, data: Sequence[dict], control: Sequence[dict], out_dir: str,
              config: ProbeConfig = ProbeConfig(), *, data_files: Sequence[str] = (),
              control_files: Sequence[str] = ()) -> dict[str, Any]:
    """Probes the model in `model_dir` and writes the owner-only report into `out_dir`.

    Args:
      model_dir: a dpsynth model directory (imported, pretrained or tuned).
      data, control: the records ({"text", ...}) of D and of the control set.
      out_dir: owner-only output directory (0700), outside `model_dir`; refused when it holds a
        probe or anything but the command's run files and dead letters.
      config: the probe's settings.
      data_files, control_files: the files the records came from (recorded with their SHA-256).

    Returns:
      The report (also `out_dir/contamination_probe.json` and `.md`).
    """
    from dpsynth.models.directory import load_model
    from dpsynth.owner_only import write_private_json, write_private_text

    out_dir = check_out(out_dir, model_dir)
    loaded = load_model(model_dir)
    manifest = loaded.manifest
    report: dict[str, Any] = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "dp": False, "notice": NOTICE, "caveat": CAVEAT,
        "model_dir": os.path.abspath(model_dir),
        "model_manifest_sha256": fileio.sha256_file(os.path.join(model_dir, "manifest.json")),
        "imported": bool(manifest.get("source") or manifest.get("base_source")),
        "data_files": _files(data_files), "control_files": _files(control_files),
        "data_records": len(data), "control_records": len(control),
        **probe_model(model_dir, data, control, config, loaded=loaded),
    }
    write_private_json(os.path.join(out_dir, REPORT_JSON), report)
    write_private_text(os.path.join(out_dir, REPORT_MD), render_markdown(report))
    return report


def read_probe(probe_dir: str) -> dict[str, Any]:
    """The report in `probe_dir` (`dpsynth probe --out`); raises `ProbeError` when absent or foreign."""
    path = os.path.join(probe_dir, REPORT_JSON)
    try:
        report = fileio.read_json(path)
    except FileNotFoundError:
        raise ProbeError(f"{path}: missing; is {probe_dir!r} the --out of a finished `dpsynth probe`?") from None
    except (OSError, ValueError) as e:
        raise ProbeError(f"{path}: unreadable JSON ({e})") from e
    if not isinstance(report, dict) or report.get("format") != FORMAT:
        raise ProbeError(f"{path}: not a contamination probe (format {report.get('format') if isinstance(report, dict) else None!r})")
    if report.get("format_version") != FORMAT_VERSION:
        raise ProbeError(f"{path}: probe format version {report.get('format_version')} is not {FORMAT_VERSION}")
    return report


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """The figures `dpsynth probe` prints (to its owner's terminal): counts, p-values, AUROC, verdicts."""
    v, lk = report["verbatim"], report["likelihood"]
    return {"verbatim": {"data_exact": v["data"]["exact"], "data_tested": v["data"]["tested"],
                         "control_exact": v["control"]["exact"], "control_tested": v["control"]["tested"],
                         "p_value": v["p_value"], "verdict": v["verdict"]},
            "likelihood": {"auroc": lk["auroc"], "p_value": lk["p_value"], "verdict": lk["verdict"]},
            "verdict": report["verdict"]}


def _f(x, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown (numbers only)."""
    v, lk, cfg = report["verbatim"], report["likelihood"], report["config"]
    lines = ["# Contamination probe (owner-only, NOT differentially private)", "", report["notice"], "",
             f"Model: `{report['model_dir']}`" + (" (imported: its pretraining data was not deduplicated against D)"
                                                 if report["imported"] else ""), "",
             f"**Verdict: {report['verdict']}** (at significance {cfg['significance']}).", "",
             "## Verbatim continuation", "",
             f"Prompt: BOS + a record's first {cfg['prefix_tokens']} tokens; a hit: the greedy continuation's first "
             f"{cfg['match_tokens']} tokens equal the record's next ones.", "",
             "| set | sampled | tested | too short | exact |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {v[name]['sampled']} | {v[name]['tested']} | {v[name]['too_short']} | {v[name]['exact']} |"
              for name in ("data", "control")]
    lines += ["", f"{v['test']}: p = {_f(v['p_value'])}: **{v['verdict']}**.", "",
              "## Likelihood", "",
              f"Mean log-likelihood per token of each record (its first {cfg['max_tokens']} tokens at most).", "",
              "| set | records | mean | median | truncated |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {lk[name]['records']} | {_f(lk[name]['mean'])} | {_f(lk[name]['median'])} | "
              f"{lk[name]['truncated']} |" for name in ("data", "control")]
    lines += ["", f"{lk['test']}: p = {_f(lk['p_value'])}, AUROC {_f(lk['auroc'])} (0.5: D no more likely than the "
                  f"control): **{lk['verdict']}**.", "", "## Caveat", "", report["caveat"]]
    return "\n".join(lines) + "\n"

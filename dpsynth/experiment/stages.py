"""The real stage functions of the experiment runner: thin adapters over the stage libraries.

Each function takes a `cache.StageContext` (its config subset, its inputs' output
directories, a directory to write) and calls ONE library function of its stage; it returns a
small JSON summary (counts, metrics, hashes: never private text) and writes a short human
report with `ctx.report`. What must not be published (the DP-tuned
model's non-DP train/valid losses, the opt-in memorisation audit against D_train) goes to the
stage's private state (`ctx.private_path`, `ROOT/private/<stage>/<hash16>/`), never into its
stage directory, `report.txt` or `stage.json`.

Output layout of each stage directory (besides `stage.json` and `report.txt`):

| stage      | files                                                                      |
|------------|----------------------------------------------------------------------------|
| sensitive  | `data/{train,valid,test}.jsonl` (`id`, `text`, `label`), `dead_letters.jsonl` (file, record, reason) |
| public     | `corpus/public.jsonl` (`id`, `text`), `planted.json` (ids only)             |
| dedup      | the dedup job's output: `clean/` (JSONL), `contamination.json` (its temporary tokenizer: private state) |
| tokenizer  | `tokenizer.model` (trained on `dedup/clean` only), `clean_tokens/` (the clean corpus re-tokenized) |
| pretrain   | `model/` (a `dpsynth.models.directory` model directory + its training checkpoints) |
| base_model | `model` (a link to the `base_model:` directory, in place of public/dedup/tokenizer/pretrain) |
| dp_tune    | `model/` (tuned adapters + base pointer, `privacy_report.json`/`.md`)       |
| labels     | `label_distribution.json` (one DP label histogram draw per DP-tuned model)  |
| generate   | the generation job's output (`train.jsonl`, `valid.jsonl`, `generation_report.json`) |
| evaluate   | the batch report (`metrics.json`, `metrics.csv`, `report.html`, `plots/`), `corpora/` links |
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

from dpsynth import fileio
from dpsynth.binding import make_config
from dpsynth.experiment import privacy
from dpsynth.experiment.cache import StageContext
from dpsynth.owner_only import write_private_json

PLANT_MIN_WORDS = 80  # planted reviews must be long enough to hold a >= 50-token sequence


# ----------------------------------------------------------------------------- data


def _embedded():
    from dpsynth.data import embedded

    return embedded


def _quiet(fn):
    """Calls `fn()` without the `rdata` package's warnings about R classes it maps."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return fn()


def load_sensitive_splits(config: Mapping[str, Any], data_dir: str | None = None
                          ) -> tuple[dict[str, list[dict[str, Any]]], list[Any]]:
    """The train/valid/test records of the `sensitive` config subset, plus a dead-letter summary
    (`dpsynth.data.dead_letters.Summary`) per file read that had any.

    Raises `dead_letters.TooManyDeadLetters` when a file has more than `max_dead_letters`
    (default `dead_letters.DEFAULT_LIMIT`): the dry run (which counts D_train this way) says so
    before anything runs.

    Embedded: the fine-food reviews (`dpsynth.data.embedded`, from `data_dir`). Files: read with
    `dpsynth.data.readers.read_sensitive` and split by `dpsynth.data.splits.make_splits`
    (the `split` options; by default, without a valid file, the last 10% of train is valid,
    and `max_*` keep the first N records of each split).
    With `user_column` the train records carry "user" (the split trained on at user level).
    """
    from dpsynth.data import splits as splits_lib

    dead: list[Any] = []
    spec = splits_lib.SplitSpec(**dict(config.get("split") or {}))
    max_sizes = {s: config.get(f"max_{s}") for s in splits_lib.SPLITS}
    if config["embedded"]:
        splits = _quiet(lambda: _embedded().fine_food_splits(data_dir))
        splits = {s: splits_lib.subsample(r, max_sizes[s], spec.subsample, spec.seed) if max_sizes[s] else r
                  for s, r in splits.items()}
    else:
        from dpsynth.data import dead_letters, readers

        fmt = config.get("format", "auto")
        sources = {}
        for split in splits_lib.SPLITS:
            path = config.get(split)
            if not path:
                continue
            named = fmt != "auto" and not readers.REGISTRY[fmt].suffixes  # e.g. label_text: named, never a suffix
            if fmt != "auto" and not named:
                for f in readers.resolve_inputs(path, encoding=config.get("encoding")):
                    if f.format != fmt:
                        raise readers.InputError(f"{f.path}: sensitive.format is {fmt!r} but the file is {f.format}")
            ds = readers.read_sensitive(path, text_column=config["text_column"], label_column=config["label_column"],
                                        format=fmt if named else None,
                                        extra_columns=[spec.split_column] if spec.split_column else (),
                                        user_column=config.get("user_column") if split == "train" else None,
                                        encoding=config.get("encoding"))
            summary = dead_letters.summarize(ds, name=f"sensitive.{split} ({path})",
                                             limit=config.get("max_dead_letters"))
            if summary.dead:
                dead.append(summary)
            sources[split] = [{**r, "label": str(r["label"])} for r in ds.records]
        dead_letters.enforce(dead)  # past max_dead_letters: refused (the error carries every summary)
        splits = splits_lib.make_splits(sources, spec, max_sizes)
    names = {str(k): str(v) for k, v in (config.get("label_names") or {}).items()}
    if names:
        for split, records in splits.items():
            unknown = sorted({r["label"] for r in records} - set(names))
            if unknown:
                raise ValueError(f"sensitive.label_names: no name for label(s) {unknown} found in the {split} split")
            splits[split] = [{**r, "label": names[r["label"]]} for r in records]
    return splits, dead


def count_train(config: Mapping[str, Any], data_dir: str | None = None) -> int:
    """|D_train| of a `sensitive` config subset (reads the data; used by dry runs)."""
    splits, _ = load_sensitive_splits(config, data_dir)
    return len(splits["train"])


def count_train_users(config: Mapping[str, Any], data_dir: str | None = None) -> int | None:
    """The distinct users of D_train (None without a user column; reads the data; dry runs)."""
    if not config.get("user_column"):
        return None
    splits, _ = load_sensitive_splits(config, data_dir)
    return len({r["user"] for r in splits["train"]})


def sensitive_data(ctx: StageContext) -> dict[str, Any]:
    """Reads the sensitive dataset once into `train/valid/test.jsonl` (the stages' one copy)."""
    from dpsynth.data import readers

    from dpsynth.data import dead_letters  # every rejected record: listed (file, record, reason), counted, explained

    dead_path = os.path.join(ctx.out_dir, dead_letters.FILE)
    try:
        splits, dead = load_sensitive_splits(ctx.config, ctx.data_dir)
    except dead_letters.TooManyDeadLetters as e:  # the refused run still lists what was wrong
        dead_letters.write(dead_path, e.summaries)
        raise
    for split, records in splits.items():
        if not records:
            raise readers.EmptyDatasetError(f"sensitive.{split}: no records")
        readers.write_jsonl(os.path.join(ctx.out_dir, "data", f"{split}.jsonl"), records)
    dead_file = dead_letters.write(dead_path, dead)
    labels = sorted({r["label"] for r in splits["train"]})
    unknown = sorted({r["label"] for s in ("valid", "test") for r in splits[s]} - set(labels))
    if unknown:
        raise readers.InputError(f"sensitive: labels {unknown} appear in valid/test but not in train")
    summary = {f"num_{s}": len(r) for s, r in splits.items()}
    summary.update(labels=labels, dead_lettered=sum(len(s.dead) for s in dead))
    if ctx.config.get("user_column"):
        summary["num_train_users"] = len({r["user"] for r in splits["train"]})
    source = "embedded fine-food reviews" if ctx.config["embedded"] else "files"
    ctx.report(
        f"sensitive data ({source}): train {summary['num_train']} / valid {summary['num_valid']} / "
        f"test {summary['num_test']} examples; labels {', '.join(labels)}; {summary['dead_lettered']} dead-lettered"
        + "".join(f"\n  {s.describe(dead_file)}" for s in dead))
    return summary


def plant_documents(
    documents: list[dict[str, Any]], candidates: Sequence[dict[str, Any]], n: int, seed: int
) -> tuple[list[dict[str, Any]], list[str]]:
    """Copies `n` long candidate texts into public documents at paragraph boundaries.

    For the demo only: it contaminates the public corpus ON PURPOSE, so the dedup stage
    can be seen to find and cut the planted reviews. Candidates of >= PLANT_MIN_WORDS words
    are sampled with `seed`; the insertion is the data library's
    (`dpsynth.data.demo_stage.plant`). Returns (new documents, planted ids).
    """
    from dpsynth.data.demo_stage import plant

    rng = random.Random(seed)
    long_enough = [c for c in candidates if len(c["text"].split()) >= PLANT_MIN_WORDS]
    if len(long_enough) < n:
        raise ValueError(f"public.plant: only {len(long_enough)} sensitive training texts have >= {PLANT_MIN_WORDS} words; asked for {n}")
    chosen = sorted(rng.sample(long_enough, n), key=lambda c: c["id"])
    return plant(documents, chosen, seed), [c["id"] for c in chosen]


def public_corpus(ctx: StageContext) -> dict[str, Any]:
    """Collects the public corpus into `corpus/public.jsonl`; plants sensitive texts if asked."""
    from dpsynth.data import readers

    docs: list[dict[str, Any]] = []
    if ctx.config["embedded"]:
        docs += [{"id": f"austen/{d['id']}", "text": d["text"]} for d in _quiet(lambda: _embedded().austen_documents(ctx.data_dir))]
    if ctx.config["paths"]:
        ds = readers.read_public(list(ctx.config["paths"]), encoding=ctx.config.get("encoding"))
        docs += [{"id": r["id"], "text": r["text"]} for r in ds.records]
        if ds.dead_letters:
            readers.write_jsonl(os.path.join(ctx.out_dir, "dead_letters.jsonl"), [d.to_json() for d in ds.dead_letters])
    if ctx.config.get("max_documents"):
        docs = docs[: ctx.config["max_documents"]]
    planted: list[str] = []
    if ctx.config["plant"]:
        train = fileio.read_jsonl(ctx.inputs["sensitive"].path("data", "train.jsonl"))
        docs, planted = plant_documents(docs, train, ctx.config["plant"], ctx.config["seed"])
    os.makedirs(os.path.join(ctx.out_dir, "corpus"))
    readers.write_jsonl(os.path.join(ctx.out_dir, "corpus", "public.jsonl"), docs)
    fileio.write_json(os.path.join(ctx.out_dir, "planted.json"), {"planted_ids": planted}, newline=False)
    size = sum(len(d["text"].encode("utf-8")) for d in docs)
    text = f"public corpus: {len(docs)} documents, {size / 1e6:.2f} MB"
    if planted:
        text += (f"\n  DEMO: planted {len(planted)} sensitive training reviews into the public corpus on purpose "
                 f"(ids {', '.join(planted)}); the dedup stage must find and cut them")
    ctx.report(text)
    return {"num_documents": len(docs), "bytes": size, "planted_ids": planted}


# ----------------------------------------------------------------------------- tokenizer


def tokenizer_config(config: Mapping[str, Any]):
    """The `dpsynth.data.tokenizer_training.TokenizerConfig` of a `tokenizer` stage config (the
    experiment's section and its seed)."""
    from dpsynth.data.tokenizer_training import TokenizerConfig

    return make_config(TokenizerConfig, config, "tokenizer")


def tokenizer(ctx: StageContext) -> dict[str, Any]:
    """The RELEASED tokenizer: SentencePiece on the deduplicated public corpus only, and that
    corpus re-tokenized with it (`dpsynth.beam.jobs.release_tokenizer`)."""
    from dpsynth.beam import jobs

    out = jobs.release_tokenizer([ctx.inputs["dedup"].path("clean")], out_dir=ctx.out_dir,
                                 config=tokenizer_config(ctx.config))
    ctx.report(f"tokenizer: {out['vocab_size']} pieces from the deduplicated public corpus only, sha256 "
               f"{out['sha256'][:12]}; clean corpus re-tokenized: {out['manifest']['num_tokens']} tokens")
    return {"vocab_size": out["vocab_size"], "sha256": out["sha256"], "num_tokens": out["manifest"]["num_tokens"]}


# ----------------------------------------------------------------------------- dedup


def _contaminated_ids(report: Mapping[str, Any]) -> set[str]:
    """Ids of sensitive examples that the contamination report lists as found."""
    found: set[str] = set()
    for entry in report.get("sensitive", []):
        for key in ("shared_example_ids",):
            if key in entry:
                found.update(str(i) for i in entry[key])
    return found


DEDUP_TOKENIZER = "dedup_tokenizer.model"  # the temporary tokenizer, in the dedup stage's private state


def dedup(ctx: StageContext) -> dict[str, Any]:
    """Cuts every >= min_tokens sequence shared with the sensitive data (`dpsynth.beam.jobs.dedup`).

    Tokenizes with a temporary tokenizer trained on the uncleaned public corpus (the planted
    or otherwise overlapping sensitive text included): it serves this stage only and is kept
    in its private state, never released; the `tokenizer` stage trains the released one on
    `clean/`. The job's `clean_tokens/` (in the temporary tokenizer's ids) is removed.
    """
    import shutil

    from dpsynth.beam import jobs
    from dpsynth.data import tokenizer_training as training
    from dpsynth.dedup import report as report_lib

    temporary = ctx.private_path(DEDUP_TOKENIZER)  # trained like the released one (its stage config)
    training.train_public_tokenizer([ctx.inputs["public"].path("corpus")], out=temporary,
                                    config=tokenizer_config(ctx.config["tokenizer"]))
    os.chmod(temporary, 0o600)
    if "sensitive_sets" in ctx.inputs:  # dedup.also_against: every listed set, by name
        sensitive = [f"{name}={out.path('data')}" for name, out in zip(ctx.config["sets"], ctx.inputs["sensitive_sets"])]
    else:
        sensitive = [f"sensitive={ctx.inputs['sensitive'].path('data')}"]
    report = jobs.dedup(
        [ctx.inputs["public"].path("corpus")],
        sensitive,
        tokenizer_path=temporary,
        out_dir=ctx.out_dir,
        min_tokens=ctx.config["min_tokens"],
        threads=os.cpu_count() or 1,
        state_dir=ctx.private_path("dedup"),  # the sensitive tokens and index: never in the stage's output
    )
    shutil.rmtree(os.path.join(ctx.out_dir, "clean_tokens"), ignore_errors=True)
    ctx.report(report_lib.summarize(report), echo=False)  # the job printed it already
    planted = list(ctx.inputs["public"].summary.get("planted_ids", []))
    sha = report.get("report_sha256") or fileio.sha256_file(os.path.join(ctx.out_dir, "contamination.json"))
    summary: dict[str, Any] = {
        "contamination_sha256": sha,
        "tokens_removed": report.get("public", {}).get("tokens_removed"),
        "documents_touched": report.get("public", {}).get("documents_touched"),
        "sensitive_examples_shared": sum(e.get("num_examples_shared", 0) for e in report.get("sensitive", [])),
    }
    if planted:
        found = _contaminated_ids(report)
        hit = [i for i in planted if i in found]
        summary.update(planted=len(planted), planted_found=len(hit))
        ctx.report(f"DEMO check: {len(hit)} of the {len(planted)} planted reviews were found and cut from the public corpus"
                   + ("" if len(hit) == len(planted) else f" (missed: {', '.join(i for i in planted if i not in found)})"))
    return summary


# ----------------------------------------------------------------------------- pretrain


PREVIEW_SAMPLES = 3  # samples of the pretrained LM shown in its stage report


def pretrain(ctx: StageContext) -> dict[str, Any]:
    """Pretrains the LM on the cleaned public corpus (`dpsynth.train.pretrain.run_pretrain`).

    Resumable: an interrupted run continues from its last checkpoint in the work directory.
    """
    from dpsynth.train import pretrain as lib

    c = ctx.config
    options = dict(c.get("options") or {})
    # The model's vocabulary is exactly the tokenizer's (no padding to a multiple of 128), so
    # a sampler can never emit an id the tokenizer cannot decode.
    overrides = {"vocab_size": int(ctx.inputs["tokenizer"].summary["vocab_size"]), **dict(options.pop("model_overrides", {}))}
    config = make_config(lib.PretrainConfig, dict(
        preset=c["preset"], steps=c["steps"], seq_len=c["seq_len"], batch_size=c["batch_size"],
        learning_rate=c["learning_rate"], seed=c["seed"], model_overrides=overrides, **options,
    ), "pretrain.options")
    model_dir = os.path.join(ctx.out_dir, "model")
    summary = lib.run_pretrain(
        ctx.inputs["tokenizer"].path("clean_tokens"),  # the clean corpus in the released tokenizer's ids
        ctx.inputs["tokenizer"].path("tokenizer.model"),
        model_dir,
        config,
        resume=ctx.resume,
    )
    valid = summary.get("valid") or {}
    train = summary.get("train") or {}
    ppl = valid.get("perplexity")
    ctx.report(
        f"pretrain: preset {summary.get('preset')} ({summary.get('num_params', 0) / 1e6:.2f}M params), "
        f"{summary.get('step')} steps of {config.batch_size} x {config.seq_len} tokens; "
        f"train loss {train.get('loss', float('nan')):.3f}; "
        + (f"validation perplexity {ppl:.2f} on held-out public text" if ppl is not None else "no validation split")
    )
    groups = {g: m.get("perplexity") for g, m in (summary.get("valid_groups") or {}).items() if m.get("perplexity")}
    if groups:
        ctx.report("pretrain: validation perplexity on held-out public documents by id prefix: "
                   + ", ".join(f"{g} {v:.2f}" for g, v in groups.items()))
    samples = []
    if summary.get("finished"):
        from dpsynth.generate.preview import preview_samples

        samples = preview_samples(model_dir, PREVIEW_SAMPLES, max_len=min(64, config.seq_len), seed=c["seed"])
        ctx.report("pretrain: samples of the pretrained LM (public data only; top-k 40):\n"
                   + "\n".join(f"  {' '.join(t.split())[:EXAMPLE_CHARS]}" for t in samples))
    keep = ("preset", "step", "num_params", "train_rows", "valid_rows", "compile_s")
    return {**{k: summary.get(k) for k in keep}, "valid_perplexity": ppl, "train_loss": train.get("loss"),
            "valid_group_perplexity": groups, "samples": samples,
            "contamination_sha256": ctx.inputs["dedup"].summary.get("contamination_sha256")}


# ----------------------------------------------------------------------------- an imported base model


def base_model(ctx: StageContext) -> dict[str, Any]:
    """The `base_model:` directory as the model DP tuning starts from: `model` links to it.

    Refused when the directory changed since the plan hashed it (its manifest's SHA-256): the
    cache key would no longer name what the DP tuning reads.
    """
    from dpsynth.models.directory import MANIFEST

    path = ctx.config["path"]
    manifest_path = os.path.join(path, MANIFEST)
    sha = fileio.sha256_file(manifest_path) if os.path.isfile(manifest_path) else "missing"
    if sha != ctx.config["manifest_sha256"]:
        raise ValueError(f"base_model: {path}: its {MANIFEST} changed since the plan was made (re-imported?); "
                         "rerun the command to plan it again")
    manifest = fileio.read_json(manifest_path)
    os.symlink(path, os.path.join(ctx.out_dir, "model"))
    source = manifest.get("source") or manifest.get("base_source") or {}
    caveat = privacy.base_model_caveat(manifest, path)
    ctx.report(f"base model: {path} ({source.get('family') or manifest.get('preset') or 'dpsynth model'}, manifest "
               f"sha256 {sha[:12]}); in place of the public corpus, dedup, tokenizer and pretraining\n"
               f"  privacy: {caveat}")
    return {"path": path, "manifest_sha256": sha, "family": source.get("family"), "imported": bool(source),
            "caveat": caveat, "contamination_sha256": manifest.get("contamination_sha256")}


# ----------------------------------------------------------------------------- DP tuning


# The experiment's seed never fixes the DP noise: the tuner draws a secret one (`options: {seed: N}` fixes it).
_NOT_TUNE_FIELDS = ("seed",)


def tune_config(config: Mapping[str, Any]):
    """The `dpsynth.train.tune_config.TuneConfig` of a `dp_tune` config subset (also used by dry runs).

    Every key named like a `TuneConfig` field is that field (a null value keeps the tuner's
    default); `loss: full` sets `full_lm`; `options` may set any field.
    """
    from dpsynth.train.tune_config import TuneConfig

    fields = {f.name for f in dataclasses.fields(TuneConfig)}
    kwargs: dict[str, Any] = {k: v for k, v in config.items()
                              if k in fields and k not in _NOT_TUNE_FIELDS and v is not None}
    kwargs["epsilon"] = float(config["epsilon"])
    kwargs["full_lm"] = config["loss"] == "full"
    kwargs.setdefault("label_contrast", 0.0)  # absent from a node: off (`dpsynth.experiment.plan.label_contrast_key`)
    kwargs.update(config.get("options") or {})
    return make_config(TuneConfig, kwargs, "dp_tune.options")


def dp_tune(ctx: StageContext) -> dict[str, Any]:
    """DP fine-tuning of the pretrained LM on D_train (`dpsynth.train.finetune.dp_tune`).

    Resumable: the tuner resumes from its checkpoint (ledger included, nothing double-counted).
    """
    from dpsynth.dp import report as report_lib
    from dpsynth.train import finetune as lib, tune_report

    config = tune_config(ctx.config)
    sens = ctx.inputs["sensitive"]
    model_dir = os.path.join(ctx.out_dir, "model")
    # Checkpoints (with the secret sampling/noise seed) live in the stage's private state, never in model/.
    state_dir = ctx.private_path(TUNE_STATE_DIR)
    checkpoints = os.path.join(state_dir, "checkpoints")
    resume = ctx.resume and os.path.isdir(checkpoints) and bool(os.listdir(checkpoints))
    if not resume and os.path.isdir(checkpoints):
        shutil.rmtree(checkpoints)  # a fresh run: an earlier attempt's checkpoints are not continued
    if ctx.resume and not resume and os.path.isdir(model_dir):
        shutil.rmtree(model_dir)  # killed before its first checkpoint: nothing to resume
    result = lib.dp_tune(
        ctx.inputs["pretrain"].path("model"),
        fileio.read_jsonl(sens.path("data", "train.jsonl")),
        fileio.read_jsonl(sens.path("data", "valid.jsonl")),
        model_dir,
        config,
        labels=sens.summary.get("labels"),
        contamination_sha256=ctx.inputs["pretrain"].summary.get("contamination_sha256"),
        resume=resume,
        state_dir=state_dir,
    )
    ctx.report(report_lib.render_markdown(result.report))
    eps = dict(result.epsilon)
    ctx.report(
        f"dp_tune: {config.mode} at target epsilon {config.epsilon:g}: {result.steps} steps, noise multiplier "
        f"{result.noise_multiplier:.4f}, epsilon spent {', '.join(f'{k} {v:.3f}' for k, v in eps.items())} at delta "
        f"{result.delta:.3g}"
    )
    # The train/valid losses are computed on D_train/D_valid without DP: private state only.
    losses = ctx.private_path(tune_report.LOSSES_FILE)
    write_private_json(losses, {"train_loss": result.train_loss, "valid_loss": result.valid_loss,
                                "truncated_train": result.truncated_train, "dp": False, "notice": NON_DP_LOSSES_NOTICE})
    print(f"dp_tune: the train/valid losses (NOT DP) are in the owner-only {losses}", flush=True)
    return {
        "mode": config.mode, "target_epsilon": config.epsilon, "epsilon": eps, "delta": result.delta,
        "steps": result.steps, "noise_multiplier": result.noise_multiplier,
    }  # (the exact truncation count is not DP: it is in the private losses file, never in stage.json)


# ----------------------------------------------------------------------------- generation


def __getattr__(name: str) -> Any:
    """`LOSSES_FILE`: the tuner's (`dpsynth.train.tune_report`), the name of the non-DP losses in
    the dp_tune stage's private state too; read on use (that module imports JAX)."""
    if name == "LOSSES_FILE":
        from dpsynth.train import tune_report

        return tune_report.LOSSES_FILE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


TUNE_STATE_DIR = "tune_state"  # the tuner's private state (checkpoints, secret seed) in the stage's private state
NON_DP_LOSSES_NOTICE = ("losses of the DP-tuned model on D_train/D_valid, computed without noise: NOT differentially "
                        "private; for the data owner only, never published with the model or the experiment's reports")

EXAMPLES_PER_LABEL = 2
EXAMPLE_CHARS = 300


def labels(ctx: StageContext) -> dict[str, Any]:
    """The DP label histogram of D_train for one DP-tuned model (`dpsynth.generate.job.dp_label_distribution`).

    Drawn once per model: every generate node of that model (all samplings and multiples)
    reads this draw, so the root releases one histogram per model. The noise seed is secret
    (OS entropy); the draw (noisy counts, weights) is DP and is what this stage writes.
    """
    from dpsynth.generate import job as lib
    from dpsynth.generate.labels import LabelDistribution

    sigma = ctx.config["noise_multiplier"]
    path = os.path.join(ctx.out_dir, privacy.LABEL_DISTRIBUTION_FILE)
    if ctx.resume and os.path.exists(path):  # an interrupted stage: reuse its draw, never draw twice
        dist = LabelDistribution.from_json(fileio.read_json(path))
    else:
        dist = lib.dp_label_distribution(ctx.inputs["model"].path("model"),
                                         ctx.inputs["sensitive"].path("data", "train.jsonl"), noise_multiplier=float(sigma))
        fileio.write_json(path, dist.to_json(), newline=False)
    ctx.report(f"DP label histogram of D_train (Gaussian, sigma {float(sigma):g}, sensitivity 1; one draw for this model): "
               + ", ".join(f"{l} {w:.3f}" for l, w in zip(dist.labels, dist.weights)))
    return {"noise_multiplier": float(sigma), "labels": list(dist.labels), "weights": list(dist.weights)}


def _label_distribution(ctx: StageContext):
    """The model's DP label histogram (the `labels` node's one draw)."""
    from dpsynth.generate.labels import LabelDistribution

    return LabelDistribution.from_json(fileio.read_json(ctx.inputs["labels"].path(privacy.LABEL_DISTRIBUTION_FILE)))


def generate(ctx: StageContext) -> dict[str, Any]:
    """Generates the synthetic train/valid splits (`dpsynth.generate.job.generate`).

    Sizes: train = multiple x |D_train|, valid = valid_fraction x train. Resumable: the job
    regenerates only the shards missing from the work directory.
    """
    from dpsynth.generate import job as lib

    c = ctx.config
    sens = ctx.inputs["sensitive"]
    num_train = max(1, int(round(c["multiple"] * sens.summary["num_train"])))
    num_valid = max(1, int(round(c["valid_fraction"] * num_train)))
    sampling = c["sampling"]  # the `SamplingOptions` of this grid point, as set (`SamplingOptions.identity`)
    # The epsilon = inf baseline trial is non-private on purpose: its output is marked so.
    non_private = float(ctx.inputs["model"].summary.get("target_epsilon", 0.0)) == float("inf")
    distribution = None
    if c.get("label_distribution", "uniform") == "dp_histogram":
        distribution = _label_distribution(ctx)
    config = make_config(lib.GenerateConfig, dict(
        model_dir=ctx.inputs["model"].path("model"), out_dir=ctx.out_dir, num_examples=num_train,
        valid_examples=num_valid, seed=c["seed"], sampling=sampling, max_len=c["max_tokens"], batch_size=c["batch_size"],
        allow_non_private=non_private, label_distribution=distribution, **dict(c.get("options") or {}),
    ), "generate.options")
    if c.get("audit_memorisation"):  # off by default; the audit goes to the private state only
        audit_dir = ctx.private_path()
        lib.generate(config, train_path=sens.path("data", "train.jsonl"), audit_dir=audit_dir)
        print(f"generate: the memorisation audit vs D_train (NOT DP) is in the owner-only "
              f"{os.path.join(audit_dir, lib.MEMORISATION_AUDIT_FILE)}", flush=True)
    else:
        lib.generate(config)
    report = fileio.read_json(os.path.join(ctx.out_dir, lib.REPORT_FILE))
    records = fileio.read_jsonl(os.path.join(ctx.out_dir, "train.jsonl"))
    ctx.report(_render_generation(records, report))
    train_split = report.get("splits", {}).get("train", {})
    return {
        "num_train": num_train, "num_valid": num_valid,
        "duplicate_rate": train_split.get("duplicates", {}).get("duplicate_rate"),
    }


def _render_generation(records: Sequence[Mapping[str, Any]], report: Mapping[str, Any]) -> str:
    """A few SYNTHETIC examples per label (DP output, fine to show) and the report's numbers."""
    lines = ["generated examples (synthetic, DP):"]
    by_label: dict[str, list[str]] = {}
    for r in records:
        by_label.setdefault(r["label"], []).append(r["text"])
    for label in sorted(by_label):
        for text in by_label[label][:EXAMPLES_PER_LABEL]:
            short = " ".join(text.split())
            short = short if len(short) <= EXAMPLE_CHARS else short[:EXAMPLE_CHARS] + " ..."
            lines.append(f"  [{label}] {short}")
    lines.append("generation report:")
    for split, info in sorted((report.get("splits") or {}).items()):
        dup = info.get("duplicates", {})
        lengths = info.get("length_tokens", {})
        balance = info.get("label_balance", {})
        counts = balance.get("counts") if isinstance(balance, Mapping) else None
        lines.append(
            f"  {split}: {dup.get('num_examples')} examples, duplicate rate {dup.get('duplicate_rate', float('nan')):.3%}"
            + (f", labels {dict(counts)}" if counts else "")
            + (f", mean length {lengths.get('mean'):.1f} tokens" if isinstance(lengths.get("mean"), (int, float)) else "")
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- DP selection


def select(ctx: StageContext) -> dict[str, Any]:
    """DP-selects one corpus of a DP run group on the real D_valid (`dpsynth.evaluate.dp_select`).

    The stage directory is the selected corpus (splits, composed privacy report, `selection.json`);
    the non-DP counts go to the stage's owner-only private state. D_valid is first checked disjoint
    from D_train (`dpsynth.dp.disjoint`: refused when it shares far more records than the split explains).
    """
    from dpsynth.dp import disjoint
    from dpsynth.evaluate import corpora, dp_select

    c = ctx.config
    valid = corpora.read_real(ctx.inputs["sensitive"].path("data", "valid.jsonl"), "real valid")
    paths = {trial: out.dir for trial, out in zip(c["candidates"], ctx.inputs["synthetic"])}
    config = make_config(dp_select.SelectConfig, {"epsilon": c["epsilon"], "mechanism": c["mechanism"],
                                                 "split": c["split"], **dict(c.get("options") or {})}, "select.options")
    train = corpora.read_real(ctx.inputs["sensitive"].path("data", "train.jsonl"), "real train")
    disjointness, overlaps = dp_select.check_disjoint(valid, [("the experiment's D_train", disjoint.record_hashes(train))])
    selection = dp_select.select_corpora(paths, valid, config, disjointness=disjointness, overlaps=overlaps)
    dp_select.write_selection(ctx.out_dir, selection, paths, private_dir=ctx.private_path())
    s = selection.report["selection"]
    ctx.report(f"DP selection among {len(paths)} corpora on the real D_valid ({s['mechanism']}, epsilon "
               f"{s['epsilon']:g}): {selection.winner_name}; {s['composition']} composition with the tuning, epsilon "
               f"{privacy.fmt_eps(selection.report['epsilon'])}")
    return {"selected": selection.winner_name, "candidates": len(paths), "composition": s["composition"],
            "epsilon": selection.report["epsilon"]}


# ----------------------------------------------------------------------------- evaluation


def evaluate(ctx: StageContext) -> dict[str, Any]:
    """The batch metric report over every trial's synthetic data (`dpsynth.evaluate.report.evaluate`).

    Each trial's corpus is linked as `corpora/<trial id>` (relative links to the generate
    stage directories) so the report's rows carry readable names.
    """
    from dpsynth.evaluate import report as lib
    from dpsynth.evaluate import scoring, tables

    c = ctx.config
    sens = ctx.inputs["sensitive"]
    links = os.path.join(ctx.out_dir, "corpora")
    os.makedirs(links)
    dirs = []
    for trial, out in zip(c["trials"], ctx.inputs["synthetic"]):
        link = os.path.join(links, trial["id"])
        os.symlink(os.path.relpath(out.dir, links), link)
        dirs.append(link)
    for group, out in zip(c.get("selected", ()), ctx.inputs.get("selected", ())):  # the DP-selected corpora
        link = os.path.join(links, f"selected-{group}")
        os.symlink(os.path.relpath(out.dir, links), link)
        dirs.append(link)
    real = scoring.load_real(sens.path("data", "train.jsonl"), sens.path("data", "test.jsonl"), sens.path("data", "valid.jsonl"))
    epsilons = sorted({float(t["epsilon"]) for t in c["trials"]} - {float("inf")}) if c["baselines"] else []
    config = make_config(scoring.EvaluateConfig, {
        "classifiers": tuple(c["classifiers"]),
        "model_dir": ctx.inputs["pretrain"].path("model"),
        "dp_epsilons": tuple(epsilons),
        "real_baseline": bool(c["baselines"]),
        **privacy.evaluate_options(c),
    }, "evaluate.options")
    result = lib.evaluate(dirs, real, ctx.out_dir, config)
    table = tables.summary_table(result, config.classifiers)
    ctx.report("evaluation summary (accuracy, balanced accuracy and macro-F1 on the real test set):\n" + table, echo=False)  # the caller prints `table`
    print(f"evaluate: {len(result['rows'])} synthetic corpora and {len(result['baselines'])} baselines scored", flush=True)
    # What publishing the whole root costs: every release about D_train, composed from the ledgers.
    root = privacy.completed_releases(
        eval_cfg=c, models=ctx.inputs.get("models", ()), labels=ctx.inputs.get("labels", ()),
        baselines=result["baselines"], out_dir=ctx.out_dir, num_train=len(real.train),
        selections=ctx.inputs.get("selected", ()), base_caveat=ctx.inputs["pretrain"].summary.get("caveat"))
    privacy.write(root, ctx.out_dir, title="what publishing the whole root costs")
    privacy.add_to_html(os.path.join(ctx.out_dir, "report.html"), privacy.html_section(root))
    ctx.report(privacy.render(root, title="what publishing the whole root costs"))
    ctx.report(f"report: {os.path.join(ctx.final_dir or ctx.out_dir, 'report.html')}", echo=False)  # not the .work dir
    dp_on_real = [{"classifier": b["classifier"], "epsilon": b["epsilon"], "epsilon_spent": b["epsilon_spent"],
                   "delta": b["delta"], "sweep_accounting": b["sweep_accounting"],
                   "trials_accounted": b["trials_accounted"],
                   "side_channels": [ch["name"] for ch in b["side_channels"]],
                   "privacy_report": os.path.join(tables.baseline_dir(b), "privacy_report.json")}
                  for b in result["baselines"] if b["baseline"] == "dp_on_real"]
    return {"table": table, "dp_on_real": dp_on_real,
            "paths": {k: os.path.relpath(v, ctx.out_dir) for k, v in result["paths"].items() if isinstance(v, str)},
            "root_epsilon": root.to_json()["root"]}


REGISTRY = {
    "sensitive": sensitive_data,
    "public": public_corpus,
    "tokenizer": tokenizer,
    "dedup": dedup,
    "pretrain": pretrain,
    "base_model": base_model,
    "dp_tune": dp_tune,
    "labels": labels,
    "generate": generate,
    "select": select,
    "evaluate": evaluate,
}

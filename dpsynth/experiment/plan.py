"""The stage graph of an experiment, keyed by content hashes.

```
sensitive ─┬──────────────────────────────┬───────────────┬──────────────┐
           ▼                              ▼               ▼              ▼
public ─► dedup ─► tokenizer ─► pretrain ─► dp_tune[mode, eps, lr, C] ─┬──────────────► generate[sampling, x] ─► evaluate
                                                                       └► labels[...] ─┘ (only with a DP label histogram)
```

With `generate.label_distribution: dp_histogram`, the DP label histogram of D_train is its
own node per DP-tuned model (`labels[...]`): drawn once and reused by every sampling and
multiple of that model, so the root releases one histogram per model, not one per corpus.
The evaluate node also reads every `dp_tune` and `labels` node, to compose everything the
root releases about D_train (`dpsynth.experiment.privacy`).

With `base_model: DIR` (a model directory, e.g. from `dpsynth import-model`) one `base_model`
node replaces public, dedup, tokenizer and pretrain: the DP tuning starts from that model and its
tokenizer, and the evaluation reads it where it would read the pretrained model. The node is
keyed by the directory's content (`base_model_node_config`), not only its path.

The dedup stage tokenizes with a temporary tokenizer of its own (trained on the uncleaned
public corpus, so it may have seen sensitive overlaps: it stays in the dedup stage's private
state and is never released); the `tokenizer` stage then trains the released tokenizer on
the deduplicated corpus only and re-tokenizes that corpus with it for pretraining.

Each node's hash is the SHA-256 of (stage kind, stage version, the config subset the stage
sees, its inputs' hashes). A node's output lives in `ROOT/stages/<stage>/<hash[:16]>`, so:

* every trial of a grid shares the tokenizer, dedup and pretraining nodes (equal hashes);
* changing one config key changes the hashes of exactly the nodes whose subset contains it
  and of everything downstream of them; all other nodes stay cached.

The config subset is the whole contract: a stage function sees ONLY its subset and its
inputs' output directories (see `cache.StageContext`), so nothing it depends on can escape
the hash. Data files enter through a fingerprint of their contents (`fingerprint_paths`).
Settings added after caches existed are marked where they are declared
(`config.UNLESS_DEFAULT`) and enter a subset only when set (`config.stage_dict`).
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from dpsynth.experiment.config import ExperimentConfig, SamplingConfig, resolve_path, stage_dict, to_dict
from dpsynth.train.recipe import AUTO

# The stage kinds in dependency order. Bump a stage's version when its adapter or output
# layout changes incompatibly: that invalidates its cached outputs and everything downstream.
STAGES = ("sensitive", "public", "dedup", "tokenizer", "pretrain", "base_model", "dp_tune", "labels", "generate",
          "select", "evaluate")
# dedup/tokenizer 2: the released tokenizer follows dedup; evaluate 2: composes the root's releases.
STAGE_VERSIONS = {**{s: 1 for s in STAGES}, "dedup": 2, "tokenizer": 2, "evaluate": 2}
# Stages whose library resumes from a partial output directory: pretraining and DP tuning
# from their checkpoints (the DP ledger included), generation by regenerating missing shards,
# the DP label histogram by reusing a draw already made (never releasing a second one).
RESUMABLE = frozenset({"pretrain", "dp_tune", "labels", "generate"})
# Files larger than this are fingerprinted by (size, mtime) instead of their contents.
CONTENT_HASH_LIMIT = 256 << 20
HASH_PREFIX = 16  # hex digits of the hash used in directory names


@dataclasses.dataclass(frozen=True)
class StageNode:
    """One stage instance of the graph.

    Attributes:
        key: unique readable id, e.g. `dp_tune[lora,eps=3,lr=0.001,C=1]`.
        stage: the stage kind (one of `STAGES`).
        config: the JSON-able config subset the stage sees (and is hashed by).
        inputs: role -> key of an upstream node, or a tuple of keys (evaluate's synthetic sets).
        hash: content hash of (stage, version, config, input hashes).
    """

    key: str
    stage: str
    config: Mapping[str, Any]
    inputs: Mapping[str, str | tuple[str, ...]]
    hash: str

    @property
    def resumable(self) -> bool:
        return self.stage in RESUMABLE

    def input_keys(self) -> list[str]:
        keys: list[str] = []
        for value in self.inputs.values():
            keys.extend(value if isinstance(value, tuple) else (value,))
        return keys


@dataclasses.dataclass(frozen=True)
class Trial:
    """One grid point: a DP-tuned model and one synthetic dataset generated from it."""

    id: str
    mode: str
    epsilon: float
    learning_rate: float | None  # None: chosen by the automatic recipe
    clip_norm: float
    sampling: SamplingConfig
    multiple: float
    dp_tune: str  # node key
    generate: str  # node key
    labels: str | None = None  # node key of the model's DP label histogram, if any
    replicate: int = 0  # which independent repeat of its DP run (dp_tune.replicates)

    def params(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "mode": self.mode,
            "epsilon": self.epsilon,
            "learning_rate": self.learning_rate,
            "clip_norm": self.clip_norm,
            "sampling": self.sampling.identity(),
            "multiple": self.multiple,
            **({"replicate": self.replicate} if self.replicate else {}),
        }


@dataclasses.dataclass(frozen=True)
class Plan:
    """The whole graph in topological order, the trials and the output root.

    `data_dir` is the embedded default's directory the stages read (None: the reader's
    default, `$DPSYNTH_EMBEDDED_DIR` or `data/embedded`); only its files' fingerprints enter
    the hashes, not its path.
    """

    root: str
    nodes: tuple[StageNode, ...]
    trials: tuple[Trial, ...]
    data_dir: str | None = None

    def node(self, key: str) -> StageNode:
        for n in self.nodes:
            if n.key == key:
                return n
        raise KeyError(key)

    def stage_dir(self, node: StageNode | str) -> str:
        node = self.node(node) if isinstance(node, str) else node
        return stage_dir(self.root, node)


def stage_dir(root: str, node: StageNode) -> str:
    return os.path.join(root, "stages", node.stage, node.hash[:HASH_PREFIX])


PRIVATE_DIR = "private"  # ROOT/private: owner-only state that is never published


def private_dir(root: str, node: StageNode) -> str:
    """The owner-only state of a stage instance: `ROOT/private/<stage>/<hash16>`."""
    return os.path.join(root, PRIVATE_DIR, node.stage, node.hash[:HASH_PREFIX])


def canonical_json(value: Any) -> str:
    """Deterministic JSON for hashing (sorted keys, floats by repr, inf as `Infinity`)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True, default=str)


def node_hash(stage: str, config: Mapping[str, Any], input_hashes: Mapping[str, Any]) -> str:
    payload = {"stage": stage, "version": STAGE_VERSIONS[stage], "config": config, "inputs": input_hashes}
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def fmt_num(x: float) -> str:
    """Compact, filename-safe number: 3 -> `3`, 0.001 -> `0.001`, inf -> `inf`."""
    if math.isinf(x):
        return "inf"
    return f"{x:g}"


# ----------------------------------------------------------------------------- data fingerprints


def expand_paths(paths: Sequence[str]) -> list[str]:
    """Files named by `paths` (files, directories = all files below, globs), sorted."""
    out: list[str] = []
    for p in paths:
        if "://" in p:
            out.append(p)  # remote: fingerprinted through Beam's FileSystems metadata
        elif os.path.isdir(p):
            for dirpath, _, files in os.walk(p):
                out.extend(os.path.join(dirpath, f) for f in files if not f.startswith("."))
        elif any(c in p for c in "*?["):
            out.extend(x for x in glob.glob(p, recursive=True) if os.path.isfile(x))
        else:
            out.append(p)
    return sorted(set(out))


def fingerprint_paths(paths: Sequence[str]) -> str:
    """SHA-256 over the files' names and contents (or size + mtime for huge/remote files).

    A missing file gives a fingerprint that says so; the stage that reads it then fails with
    a clear error (a dry run still prints the plan).
    """
    h = hashlib.sha256()
    for path in expand_paths(paths):
        h.update(path.encode() + b"\0")
        if "://" in path:
            from apache_beam.io.filesystems import FileSystems

            meta = FileSystems.match([path])[0].metadata_list
            h.update(canonical_json([(m.path, m.size_in_bytes, m.last_updated_in_seconds) for m in meta]).encode())
        elif not os.path.exists(path):
            h.update(b"missing")
        elif os.path.getsize(path) > CONTENT_HASH_LIMIT:
            st = os.stat(path)
            h.update(f"size={st.st_size},mtime={st.st_mtime_ns}".encode())
        else:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


def embedded_package_files(package: str, data_dir: str | None = None) -> list[str]:
    """The R lazy-load files of an embedded Debian package (what `dpsynth.data.embedded` reads)."""
    from dpsynth.data import embedded

    base = os.path.join(embedded.embedded_dir(data_dir), "root", embedded._R_LIB, package, "data", "Rdata")
    return [base + ".rdb", base + ".rdx"]


# ----------------------------------------------------------------------------- the graph


def label_contrast_key(config: ExperimentConfig) -> dict[str, Any]:
    """The `dp_tune` node's `label_contrast` entry: absent when the runs train without the contrast
    (so that caches made before it existed keep their hashes; `stages.tune_config` reads absent as
    off), "auto" with the automatic recipe (whose runs take the contrast since it became the
    recipe's choice), the weight when given; nothing when `options` give it (hashed with them)."""
    d = config.dp_tune
    if "label_contrast" in d.options:
        return {}
    if d.label_contrast == AUTO:
        return {"label_contrast": AUTO} if d.recipe == "auto" else {}
    return {"label_contrast": d.label_contrast} if float(d.label_contrast) else {}


def build_plan(config: ExperimentConfig, root: str, *, data_dir: str | None = None) -> Plan:
    """The stage graph of `config` with output directories under `root`.

    Args:
        config: a validated experiment config.
        root: the experiment's output directory.
        data_dir: directory of the embedded default (default: `$DPSYNTH_EMBEDDED_DIR` or
            `data/embedded`); only its files' fingerprints enter the hashes, not its path.
    """
    nodes: dict[str, StageNode] = {}

    def add(key: str, stage: str, cfg: Mapping[str, Any], inputs: Mapping[str, str | tuple[str, ...]]) -> str:
        hashes = {
            role: ([nodes[k].hash for k in v] if isinstance(v, tuple) else nodes[v].hash) for role, v in inputs.items()
        }
        nodes[key] = StageNode(key=key, stage=stage, config=cfg, inputs=dict(inputs), hash=node_hash(stage, cfg, hashes))
        return key

    # -- data
    def sensitive_node_config(section) -> dict:
        sens = stage_dict(section)
        for split in ("train", "valid", "test"):
            if sens[split]:
                sens[split] = resolve_path(sens[split])
        if section.embedded:
            sens_files = embedded_package_files("modeldata", data_dir)
        else:
            sens_files = [p for p in (sens["train"], sens["valid"], sens["test"]) if p]
        sens["fingerprint"] = fingerprint_paths(sens_files)
        return sens

    sensitive = add("sensitive", "sensitive", sensitive_node_config(config.sensitive), {})
    if config.base_model is not None:  # the base model stands for public -> dedup -> tokenizer -> pretrain
        pretrain = add("base_model", "base_model", base_model_node_config(config.base_model), {})
    else:
        pretrain = _pretrain_nodes(config, data_dir, sensitive, sensitive_node_config, add, nodes)
    trials, selects, eval_cfg, eval_inputs = _grid(config, sensitive, pretrain, add)
    add("evaluate", "evaluate", eval_cfg, eval_inputs)
    return Plan(root=os.path.abspath(root), nodes=tuple(nodes.values()), trials=tuple(trials),
                data_dir=os.path.abspath(data_dir) if data_dir else None)


def base_model_node_config(path: str) -> dict[str, Any]:
    """The `base_model` node's config: the directory's absolute path, the SHA-256 of its manifest and a
    fingerprint of its files (`fingerprint_paths`: contents, or size and mtime past `CONTENT_HASH_LIMIT`),
    so that a re-import or changed weights at the same path is a new node (and a new DP tuning
    downstream), never the cached one by name."""
    path = resolve_path(path)
    manifest = os.path.join(path, "manifest.json")
    from dpsynth import fileio

    sha = fileio.sha256_file(manifest) if os.path.isfile(manifest) else "missing"
    return {"path": path, "manifest_sha256": sha, "fingerprint": fingerprint_paths([path])}


def _pretrain_nodes(config: ExperimentConfig, data_dir: str | None, sensitive: str, sensitive_node_config, add,
                    nodes: Mapping[str, StageNode]) -> str:
    """The public corpus, its dedup against the sensitive data, the released tokenizer and the
    pretraining; returns the pretrain node's key."""
    seed = config.seed
    pub = stage_dict(config.public)  # (`_added` keys, e.g. encoding, only when set)
    pub["paths"] = [resolve_path(p) for p in pub["paths"]]
    pub_files = list(pub["paths"])
    if config.public.embedded:
        pub_files += embedded_package_files("janeaustenr", data_dir)
    pub["fingerprint"] = fingerprint_paths(pub_files)
    if config.public.plant:
        pub["seed"] = seed  # which texts are planted
    public = add("public", "public", pub, {"sensitive": sensitive} if config.public.plant else {})

    # -- shared model stages
    tok_cfg = {**to_dict(config.tokenizer), "seed": seed}
    # The dedup's temporary tokenizer is trained like the released one, on the uncleaned corpus.
    dedup_cfg = {**to_dict(config.dedup), "tokenizer": tok_cfg}
    also = dedup_cfg.pop("also_against")
    if also:
        # Several sensitive sets: the dedup stage (and so pretraining) depends on the SET of them,
        # so experiments that list the same sets share one dedup and one pretraining run.
        sets = {name: add(f"sensitive[{name}]", "sensitive", sensitive_node_config(config.dedup.sensitive_config(name)), {})
                for name in sorted(also)}
        if nodes[sensitive].hash not in {nodes[k].hash for k in sets.values()}:
            sets["sensitive"] = sensitive  # the experiment's own set is always cut too
        dedup_cfg["sets"] = sorted(sets)
        dedup = add("dedup", "dedup", dedup_cfg, {"public": public, "sensitive_sets": tuple(sets[n] for n in sorted(sets))})
    else:
        dedup = add("dedup", "dedup", dedup_cfg, {"public": public, "sensitive": sensitive})
    tokenizer = add("tokenizer", "tokenizer", tok_cfg, {"dedup": dedup})
    return add("pretrain", "pretrain", {**to_dict(config.pretrain), "seed": seed}, {"dedup": dedup, "tokenizer": tokenizer})


def _grid(config: ExperimentConfig, sensitive: str, pretrain: str, add):
    """The grid's dp_tune / labels / generate nodes (each trial's), its select nodes and the evaluate
    node's config and inputs. `pretrain`: the key of the model the DP tuning starts from."""
    seed = config.seed
    dp = stage_dict(config.dp_tune)
    dp.pop("label_contrast", None)  # (its own rule, per node: `label_contrast_key`)
    shared_dp = {k: v for k, v in dp.items() if k not in ("modes", "epsilons", "learning_rates", "mode_learning_rates", "clip_norms", "lora_rank", "prompt_length", "replicates")}
    gen = to_dict(config.generate)
    shared_gen = {k: v for k, v in stage_dict(config.generate).items() if k not in ("samplings", "multiples")}
    reserve = reserved_selection_epsilon(config)
    hist_sigma = reserved_label_noise_multiplier(config)
    trials: list[Trial] = []
    for mode in config.dp_tune.modes:
        for eps in config.dp_tune.epsilons:
            for lr in config.dp_tune.learning_rates_for(mode):
                for clip in config.dp_tune.clip_norms:
                    for rep in range(config.dp_tune.replicates):
                        lr_id = "auto" if lr is None else f"lr{fmt_num(lr)}"  # the automatic recipe chooses it
                        tune_id = f"{mode}-eps{fmt_num(eps)}-{lr_id}-C{fmt_num(clip)}" + (f"-r{rep}" if rep else "")
                        tune_cfg = {**shared_dp, "mode": mode, "epsilon": eps, "clip_norm": clip, "seed": seed,
                                    **label_contrast_key(config)}
                        if lr is not None:
                            tune_cfg["learning_rate"] = lr
                        if reserve and not math.isinf(float(eps)):  # the target covers the later selection
                            tune_cfg["reserve_selection_epsilon"] = reserve
                        if hist_sigma and not math.isinf(float(eps)):  # ... and the model's label histogram
                            tune_cfg["reserve_label_noise_multiplier"] = hist_sigma
                        if rep:  # a repeat: its own node (the tuner draws a fresh secret noise seed)
                            tune_cfg["replicate"] = rep
                        if mode == "lora":
                            tune_cfg["lora_rank"] = config.dp_tune.lora_rank
                        if mode == "prompt":
                            tune_cfg["prompt_length"] = config.dp_tune.prompt_length
                        tune = add(f"dp_tune[{tune_id}]", "dp_tune", tune_cfg, {"pretrain": pretrain, "sensitive": sensitive})
                        gen_inputs = {"model": tune, "sensitive": sensitive}
                        labels = None
                        if gen["label_distribution"] == "dp_histogram":  # one draw per model, reused below
                            labels = add(f"labels[{tune_id}]", "labels", {"noise_multiplier": gen["label_noise_multiplier"]},
                                         {"model": tune, "sensitive": sensitive})
                            gen_inputs["labels"] = labels
                        for sampling in config.generate.samplings:
                            for multiple in config.generate.multiples:
                                trial_id = f"{tune_id}-{sampling.label}-x{fmt_num(multiple)}"
                                gen_cfg = {**shared_gen, "sampling": sampling.identity(), "multiple": multiple,
                                           "seed": seed + rep}  # a repeat also draws its own samples
                                g = add(f"generate[{trial_id}]", "generate", gen_cfg, gen_inputs)
                                trials.append(Trial(trial_id, mode, eps, lr, clip, sampling, multiple, tune, g, labels,
                                                    replicate=rep))

    selects = _select_nodes(config, trials, sensitive, add)
    eval_cfg = {
        **to_dict(config.evaluate),
        "seed": seed,
        "trials": [{**t.params(), "dp_tune": t.dp_tune, "labels": t.labels} for t in trials],  # what each corpus is made of
        "dp_tune": shared_dp,  # DP-on-real baselines use the same batch/epochs/delta/accountant
    }
    models = tuple(dict.fromkeys(t.dp_tune for t in trials))
    label_nodes = tuple(dict.fromkeys(t.labels for t in trials if t.labels))
    eval_inputs: dict[str, str | tuple[str, ...]] = {"synthetic": tuple(t.generate for t in trials),
                                                     "sensitive": sensitive, "pretrain": pretrain, "models": models}
    if label_nodes:
        eval_inputs["labels"] = label_nodes
    if selects:  # only then: an experiment without selection keeps its evaluate hash
        eval_cfg["selected"] = [group for group, _ in selects]
        eval_inputs["selected"] = tuple(key for _, key in selects)
    return trials, selects, eval_cfg, eval_inputs


def valid_split_kind(section) -> str:
    """How the sensitive config's D_valid is split from D (`dpsynth.dp.private_selection.SPLITS`): its own
    file ("files"), a per-record hash ("hash"), else the last 10% of train ("positional")."""
    split = dict(section.split)
    if section.max_valid and split.get("subsample", "first") != "hash":  # the first N rows: positional
        return "positional"
    if not section.embedded and section.valid:
        return "files"
    return "hash" if split.get("holdout") == "hash" else "positional"


def reserved_selection_epsilon(config: ExperimentConfig) -> float:
    """The selection epsilon each private `dp_tune` run reserves (`TuneConfig.reserve_selection_epsilon`):
    `select.epsilon` when the exponential-mechanism selection composes sequentially with the tuning (a
    positional D_valid), so that the selected release meets `dp_tune.epsilons`; else 0 (none, or a
    data-independent split, which composes in parallel)."""
    if config.select.epsilon is None or config.select.mechanism != "exponential":
        return 0.0
    return float(config.select.epsilon) if valid_split_kind(config.sensitive) == "positional" else 0.0


def reserved_label_noise_multiplier(config: ExperimentConfig) -> float:
    """The label histogram each private `dp_tune` run reserves (`TuneConfig.reserve_label_noise_multiplier`):
    `generate.label_noise_multiplier` with `label_distribution: dp_histogram` (one draw per model, the
    `labels` stage), so that each corpus (the model and its histogram) meets `dp_tune.epsilons`; else 0.
    (A user-level run refuses a histogram anyway: `TuneConfig` then names the conflict.)"""
    if config.generate.label_distribution != "dp_histogram":
        return 0.0
    return float(config.generate.label_noise_multiplier)


def _select_nodes(config: ExperimentConfig, trials: Sequence[Trial], sensitive: str, add) -> list[tuple[str, str]]:
    """One `select[<mode>-eps<e>[-r<k>]]` node per private DP run group, choosing among its trials' corpora
    (every learning rate, clipping norm, sampling setting and multiple); [] when `select.epsilon` is unset."""
    if config.select.epsilon is None:
        return []
    groups: dict[str, list[Trial]] = {}
    for t in trials:
        if not math.isinf(t.epsilon):  # a non-private model has nothing to protect by a DP choice
            groups.setdefault(f"{t.mode}-eps{fmt_num(t.epsilon)}" + (f"-r{t.replicate}" if t.replicate else ""),
                              []).append(t)
    out = []
    for group, members in groups.items():
        cfg = {**to_dict(config.select), "split": valid_split_kind(config.sensitive),
               "candidates": [t.id for t in members]}
        out.append((group, add(f"select[{group}]", "select", cfg,
                               {"synthetic": tuple(t.generate for t in members), "sensitive": sensitive})))
    return out

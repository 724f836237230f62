"""The model side of a `dp_tune` run: what is trained, with which loss, by which compiled steps.

The tuned model config of a mode (`tuned_model_config`) and its initial variables
(`init_variables`); the optimizer (`make_optimizer`); the automatic label contrast
(`auto_label_contrast`, `resolve_label_contrast`); the per-example loss (`make_loss_fn`, with the
sparse clipping of an untied input table: `embedding_spec`); the run's mechanism and gradient
strategy (`build_mechanism`); the training core's step functions (`make_step_functions`), which
`planned_step` and `compile_steps` build and compile on abstract arrays for the resource plan
(`dpsynth.train.tune_plan`); the sizing of the step to the machine (`--microbatch-size auto`:
`auto_microbatch`, `resolve_microbatch`; `--time-budget`: `resolve_time_budget`); and the non-DP
validation loss (`make_eval_fn`, `evaluate_loss`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpsynth.dp import sampling
from dpsynth.dp.mechanisms.run import build_run_mechanism
from dpsynth.dp.plan import PrivacyPlan
from dpsynth.dp.users import UserColumnError
from dpsynth.train import recipe as recipe_lib
from dpsynth.train.tune_config import TRAINABLE, TuneConfig, TuneError, Prepared, plan_for_records, resolve_recipe
from dpsynth.train.tune_data import TuneData, gather_train

logger = logging.getLogger("dpsynth.train.finetune")  # the tuner's one logger, whichever module logs


def tuned_model_config(base_config, config: TuneConfig):
    base = base_config.base()
    if config.mode == "lora":
        return base.replace(lora_rank=config.lora_rank, lora_alpha=config.lora_alpha, lora_targets=config.lora_targets)
    if config.mode == "prompt":
        return base.replace(prompt_length=config.prompt_length)
    return base


def init_variables(model_config, base_params: dict, config: TuneConfig) -> dict:
    """Base params from the checkpoint plus freshly initialised adapters of the mode."""
    from dpsynth.models import Transformer

    variables = {"params": base_params}
    if config.mode == "full":
        return variables
    # Adapter initialisation is data-independent and public: a fixed key, separate from the
    # (secret) sampling/noise seed, so runs that differ only in that seed start identically.
    key = jax.random.fold_in(jax.random.PRNGKey(0), 0xADA)
    coll = TRAINABLE[config.mode][0]
    # Only the adapter collection is returned, so XLA drops the base-parameter initialisers.
    init = jax.jit(lambda k: Transformer(model_config).init(k, jnp.zeros((1, 4), jnp.int32))[coll])(key)
    if config.mode == "prompt" and config.prompt_init == "vocab":
        ids = jax.random.randint(jax.random.fold_in(key, 1), (config.prompt_length,), 4, model_config.vocab_size)
        init = {"embedding": jnp.asarray(base_params["embedding"])[ids]}
    variables[coll] = init
    return variables


def make_step_functions(loss_fn, config: TuneConfig, strategy, *, mesh: tuple[int, int] | None = None,
                        fsdp: bool = False):
    """The training core's step functions of a run (`dpsynth.train.core.TrainFunctions`): what `train_run`
    steps with and what the resource plan (`dpsynth.train.resources`) compiles on abstract arrays.
    `fsdp`: parameters also split over the mesh's data axis (`dpsynth.models.sharding.FSDP_RULES`)."""
    from dpsynth.models.sharding import FSDP_RULES, LOGICAL_RULES
    from dpsynth.train import core, sharding

    return core.make_train_functions(loss_fn, make_optimizer(config), strategy,
                                     mesh=sharding.make_mesh(*mesh) if mesh is not None else None,
                                     rules=FSDP_RULES if fsdp else LOGICAL_RULES)


def planned_step(base_config, config: TuneConfig, plan: PrivacyPlan, *, mesh: tuple[int, int] | None = None,
                 fsdp: bool = False):
    """(tuned model config, step functions) of a run of `config` under the privacy `plan` on a base
    model of `base_config`, built as `dp_tune` builds them (`tuned_model_config`, `make_loss_fn`,
    `build_mechanism`, `make_step_functions`) but without data, weights or a secret seed (the
    example-level strategy does not depend on it): what the resource plan compiles."""
    model_config = tuned_model_config(base_config, config)
    prep = Prepared(config=config, recipe=None, length=None, plan=plan, labels=[], labels_from_data=False, train_users=None,
                     state_dir="", ckpt_dir="", resume_meta=None)
    _, strategy = build_mechanism(prep, model_config, run_seed=0, num_rows=plan.dataset_size, mesh=mesh)
    return model_config, make_step_functions(make_loss_fn(model_config, config), config, strategy, mesh=mesh, fsdp=fsdp)


@dataclasses.dataclass(frozen=True)
class CompiledSteps:
    """A run's step programs compiled on abstract arrays (`compile_steps`)."""

    model_config: Any
    fns: Any  # dpsynth.train.core.TrainFunctions
    state: Any  # the abstract TrainState
    accumulate: Any  # dpsynth.train.resources.ProgramCost of one microbatch
    apply: Any  # ... of the optimizer step (None when not asked for)


def compile_steps(base_config, config: TuneConfig, plan: PrivacyPlan, *, microbatch: int, row_length: int,
                  param_dtype: str = "float32", base_params=None, mesh: tuple[int, int] | None = None,
                  fsdp: bool = False, apply: bool = True, contrast: tuple[int, int] | None = None) -> CompiledSteps:
    """Compiles the accumulate (one microbatch of `microbatch` rows of `row_length` tokens; with
    `config.label_contrast`, also each example's `contrast` = (K labels, row length) rows) and apply
    programs of a run on abstract arrays: `planned_step`'s functions with the state `dp_tune` would
    hold (the base's "params" in `param_dtype`, or shaped like `base_params`, an abstract tree)."""
    from dpsynth.train import lm, resources
    from dpsynth.train import sharding as sharding_lib

    config = dataclasses.replace(config, microbatch_size=microbatch)
    model_config, fns = planned_step(base_config, config, plan, mesh=mesh, fsdp=fsdp)
    trainable, frozen = lm.split_variables(resources.abstract_variables(model_config, param_dtype, base_params),
                                           TRAINABLE[config.mode])
    state = fns.abstract_state(trainable, frozen)
    acc = fns.abstract_accumulator(state)
    if bool(config.contrast) != (contrast is not None):
        raise TuneError("compile_steps: the label contrast's rows (contrast=(labels, length)) go with label_contrast")
    batch = resources.abstract_batch(microbatch, row_length,
                                     sharding_lib.batch_sharding(fns.mesh) if fns.mesh is not None else None,
                                     contrast=contrast)
    accumulate = resources.program_cost("accumulate", fns.lower("accumulate", state, acc, batch))
    applied = resources.program_cost("apply", fns.lower("apply", state, acc)) if apply else None
    return CompiledSteps(model_config=model_config, fns=fns, state=state, accumulate=accumulate, apply=applied)


def auto_microbatch(base_config, config: TuneConfig, plan: PrivacyPlan, *, row_length: int,
                    mesh: tuple[int, int] | None, limit_bytes: int, headroom: float, fsdp: bool = False,
                    param_dtype: str = "float32", base_params=None, contrast: tuple[int, int] | None = None):
    """`resources.largest_microbatch` over the run's compiled steps (the larger of accumulate and
    apply; multiples of the mesh's data axis, at most the expected batch)."""
    from dpsynth.train import resources

    multiple = mesh[0] if mesh is not None else 1
    common = dict(row_length=row_length, mesh=mesh, fsdp=fsdp, param_dtype=param_dtype, base_params=base_params,
                  contrast=contrast)
    applied = compile_steps(base_config, config, plan, microbatch=multiple, **common).apply.total_bytes

    def peak(m: int) -> int:
        return max(applied, compile_steps(base_config, config, plan, microbatch=m, apply=False,
                                          **common).accumulate.total_bytes)

    maximum = int(math.ceil(plan.expected_batch_size / multiple)) * multiple
    return resources.largest_microbatch(peak, limit_bytes=limit_bytes, headroom=headroom, maximum=maximum,
                                        multiple=multiple)


def make_optimizer(config: TuneConfig) -> optax.GradientTransformation:
    if config.optimizer == "adafactor":
        return optax.adafactor(learning_rate=config.learning_rate)
    return optax.adam(config.learning_rate)


# Full tuning of a model with an untied input embedding (imported Llama, Mistral, large Qwen2)
# clips that table on the exact sparse path of `dpsynth.dp.sparse` (same clipped sum, no
# per-example [vocab, d_model] gradient); a tied table is also the output layer and stays dense.

def embedding_spec(model_config, config: TuneConfig):
    """The sparse-clipping declaration of the input embedding, or None (tied, not full, not private)."""
    from dpsynth.dp import sparse

    if config.mode != "full" or model_config.tie_embeddings or not config.private:
        return None
    return sparse.EmbeddingSpec(param_path=("params", "embedding"), ids_key="inputs")


def clipping_method(model_config, config: TuneConfig) -> str:
    """The per-example clipping a run uses (`dpsynth.dp.clipping.METHODS`): `config.clipping`, or for
    "auto" (the default) "ghost" where it applies (full and LoRA tuning at example level, but not full
    tuning of an untied input table, which has its exact sparse path: `embedding_spec`), else "vmap".
    Both form the same clipped sum of the same per-example gradients: the mechanism, its sensitivity
    and its accounting do not depend on the choice (tests/dp/test_ghost.py compares them norm by
    norm); ghost was the faster and no larger in memory in every setting measured (docs/measured.md).
    `make_loss_fn` and `build_mechanism` both ask here, so the loss and the strategy always agree."""
    from dpsynth.train.tune_config import AUTO_CLIPPING, GHOST_MODES

    if config.clipping != AUTO_CLIPPING:
        return config.clipping
    ghost = config.mode in GHOST_MODES and config.privacy_unit == "example" and embedding_spec(model_config, config) is None
    return "ghost" if ghost else "vmap"


def auto_label_contrast(config: TuneConfig, model_config, labels: int) -> tuple[float, str | None]:
    """What label_contrast "auto" means for this run: off with a manual recipe (and no sentence);
    with the automatic one, `dpsynth.train.recipe.auto_label_contrast` for its K = `labels`, off
    where the run cannot take it (`TuneConfig.contrast_conflict`, or full tuning of an untied input
    embedding, clipped on the sparse Prefix-LM path). `model_config`: the tuned model's."""
    if config.recipe != "auto":
        return 0.0, None
    conflict = config.contrast_conflict() or (
        "full tuning of a model with an untied input embedding clips that table on the sparse Prefix-LM path"
        if embedding_spec(model_config, config) is not None else None)
    return recipe_lib.auto_label_contrast(labels=labels, conflict=conflict, form=config.label_contrast_form)


def resumed_contrast(resume_meta: dict | None) -> tuple[float, str] | None:
    """(weight, form) of the label contrast a checkpoint was trained with; None without a checkpoint
    or one that records no settings. The settings leave out a weight of 0 and the "full" form
    (`TuneConfig.to_json`), so a checkpoint made before there were two forms reads as full."""
    settings = (resume_meta or {}).get("settings")
    if settings is None:
        return None
    return float(settings.get("label_contrast", 0.0)), str(settings.get("label_contrast_form", "full"))


def resolve_label_contrast(prep: Prepared, model_config) -> Prepared:
    """`prep` with label_contrast "auto" resolved (`auto_label_contrast` for its label set; the
    recipe's sentence logged and recorded in the recipe) and, with a contrast, label_contrast_form
    "auto" resolved (`TuneConfig.contrast_form` of its K). A resume keeps what its checkpoint's run
    chose for either "auto" (`resumed_contrast`): a run begun before the automatic recipe took the
    contrast above 4 labels, or before the sampled form, goes on as it began instead of refusing."""
    config, recipe = prep.config, prep.recipe
    k = len(prep.labels)
    saved = resumed_contrast(prep.resume_meta)
    if config.label_contrast_form == recipe_lib.AUTO and saved is not None:
        config = dataclasses.replace(config, label_contrast_form=saved[1])
    if config.label_contrast == recipe_lib.AUTO:
        weight, why = auto_label_contrast(config, model_config, k)
        if why is not None and saved is not None and weight and saved[0] != weight:  # (off by a conflict: stays off)
            weight, why = saved[0], (f"label contrast {saved[0]:g}: the checkpoint's run began with it (a resume keeps "
                                     "its choice)" if saved[0] else
                                     "no label contrast: the checkpoint's run began without it (a resume keeps its choice)")
        config = dataclasses.replace(config, label_contrast=weight)
        if why is not None:
            logger.info("recipe auto: %s", why)
            recipe = recipe.with_contrast(weight, why)
    if config.contrast and config.label_contrast_form == recipe_lib.AUTO:
        config = dataclasses.replace(config, label_contrast_form=config.contrast_form(k))
    return dataclasses.replace(prep, config=config, recipe=recipe)


def make_loss_fn(model_config, config: TuneConfig):
    """The per-example Prefix-LM loss over (trainable, frozen) collections (`dpsynth.train.lm`), with the
    label-contrast term when `config.contrast`; a `sparse.EmbeddedLoss` when `embedding_spec`
    declares the input table."""
    from dpsynth.models import Transformer
    from dpsynth.train import lm

    model = Transformer(model_config)
    spec = embedding_spec(model_config, config)
    # The output layer only at the weighted positions (`lm.row_sums`): LoRA freezes the table, and batched
    # (ghost) clipping keeps the per-batch choice of head width a real branch (under vmap it would run all).
    target_only = config.mode == "lora" and clipping_method(model_config, config) == "ghost"
    if config.contrast:
        if spec is not None:
            raise TuneError("label_contrast: full tuning of a model with an untied input embedding clips that table "
                            "on the sparse Prefix-LM path; use LoRA or prompt tuning")
        return lm.make_label_contrast_loss(model, config.contrast, z_loss=config.z_loss, target_only=target_only)
    loss_fn = lm.make_lm_loss(model, z_loss=config.z_loss, target_only=target_only)
    if spec is None:
        return loss_fn
    from dpsynth.dp import sparse

    def from_embedded(rest, frozen, batch, embedded, key):
        """`loss_fn` with the looked-up rows given: the table is not read, so a zero stand-in keeps
        the tree whole (XLA drops it)."""
        del key
        table = jnp.zeros((model_config.vocab_size, model_config.d_model), jnp.float32)
        params = sparse.merge_table(rest, spec.param_path, table)
        logits = model.apply(lm.merge_variables(params, frozen), batch["inputs"], segment_ids=batch.get("segment_ids"),
                             positions=batch.get("positions"), embedded=embedded)
        ce, z = lm.cross_entropy_with_z_loss(logits, batch["targets"], config.z_loss)
        w = batch["weights"].astype(jnp.float32)
        tokens = jnp.sum(w, axis=-1)
        per_example = jnp.sum((ce + z) * w, axis=-1) / jnp.maximum(tokens, 1.0)
        return per_example, {"ce_sum": jnp.sum(ce * w, axis=-1), "tokens": tokens}

    return sparse.EmbeddedLoss(spec, from_embedded)


def make_eval_fn(loss_fn):
    """Jitted masked sum of per-example losses of one batch."""
    return jax.jit(lambda p, f, b: jnp.sum(loss_fn(p, f, b, jax.random.PRNGKey(0))[0] * b["mask"]))


def evaluate_loss(eval_fn, params, frozen, arrays: dict[str, np.ndarray], batch_size: int, *,
                  desc: str = "valid loss", interval: float = 10.0) -> float:
    """Mean per-example loss over `arrays` (the quantity used for model selection), with progress
    lines (`desc`: examples, rate, ETA; every `interval` seconds) when it takes longer than that."""
    from dpsynth.progress import Progress

    n = next(iter(arrays.values())).shape[0]
    total = 0.0
    with Progress(total=n, desc=desc, unit="example", interval=interval, brief=True) as progress:
        for lo in range(0, n, batch_size):
            idx = np.arange(lo, lo + batch_size)
            idx = np.where(idx < n, idx, -1)
            total += float(eval_fn(params, frozen, sampling.gather(arrays, idx)))
            progress.update(min(batch_size, n - lo))
    return total / max(n, 1)


def contrast_shape(data: TuneData, config: TuneConfig) -> tuple[int, int] | None:
    """(rows per example, row length) of the label contrast's rows a step of `config` feeds from
    `data` (K with the full form, 2 with the sampled one: `gather_train`), or None without them."""
    rows = data.train_arrays.get("contrast_inputs")
    return None if rows is None else (config.contrast_rows(int(rows.shape[1])), int(rows.shape[2]))


def resolve_microbatch(prep: Prepared, base_config, base_params, data: TuneData, *, mesh, memory_limit: int | None,
                        headroom: float, fsdp: bool = False) -> Prepared:
    """`prep` with microbatch_size "auto" replaced by the largest microbatch whose compiled step (the
    run's own, on the abstract base and the data's row length) fits `memory_limit` less `headroom`;
    the choice and its figures are logged. Unchanged for a given microbatch."""
    config = prep.config
    if config.microbatch_size != "auto":
        return prep
    from dpsynth.train import resources

    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), base_params)

    def search() -> resources.MicrobatchChoice:
        return auto_microbatch(base_config, config, prep.plan, row_length=data.train_arrays["inputs"].shape[1],
                               mesh=mesh, limit_bytes=resources.memory_limit(memory_limit), headroom=headroom,
                               base_params=abstract, fsdp=fsdp, contrast=contrast_shape(data, config))

    m, choice = resources.agreed_size(search)  # several processes: process 0's choice, or all stop together
    logger.info("microbatch auto: %s", choice.describe())
    return dataclasses.replace(prep, config=dataclasses.replace(config, microbatch_size=m))


def resolve_time_budget(prep: Prepared, train_records: Sequence[dict], data: TuneData, model_config, base_params, *,
                         mesh, compositions: int, fsdp: bool = False) -> Prepared:
    """`prep` with a pending `--time-budget` turned into a token budget: the run's own accumulation
    step (its model, mode, clipping, microbatch and row length) is compiled and timed
    (`recipe.measure_speed`; process 0's figure on several processes), and the recipe and the plan
    are resolved again with that budget. Unchanged without a pending time budget."""
    from dpsynth.train import lm

    if prep.pending_seconds is None:
        return prep
    config = prep.config
    mb = config.microbatch_size
    _, strategy = build_mechanism(prep, model_config, run_seed=0, num_rows=len(train_records), mesh=mesh)
    fns = make_step_functions(make_loss_fn(model_config, config), config, strategy, mesh=mesh, fsdp=fsdp)
    params, frozen = lm.split_variables(init_variables(model_config, base_params, config), TRAINABLE[config.mode])
    state = fns.init_state(params, frozen, rng=jax.random.PRNGKey(0))
    rows = np.arange(mb) % len(data.train)
    batch = gather_train(data.train_arrays, rows[fns.process_rows(mb)], 0, seed=0, form=config.label_contrast_form)

    def step():
        acc, _ = fns.accumulate_step(state, fns.init_accumulator(state), fns.shard_batch(batch, global_rows=mb))
        jax.block_until_ready(acc)

    speed = recipe_lib.measure_speed(step, example_tokens=mb * config.max_tokens)
    if jax.process_count() > 1:  # one figure for every process: the plans must agree
        from jax.experimental import multihost_utils

        speed = float(multihost_utils.broadcast_one_to_all(np.float32(speed)))
    del state
    try:
        timing = recipe_lib.TimeBudget(
            seconds=prep.pending_seconds, example_tokens_per_second=speed, microbatch=int(mb),
            token_budget=recipe_lib.token_budget_for(seconds=prep.pending_seconds, example_tokens_per_second=speed))
        config, recipe = resolve_recipe(dataclasses.replace(config, token_budget=timing.token_budget),
                                        prep.plan.dataset_size)
    except (recipe_lib.RecipeError, TuneError) as e:
        raise TuneError(f"--time-budget {prep.pending_seconds:g} s at the measured {speed:,.0f} example-tokens/s: "
                        f"{e}") from e
    for line in (timing.why,) + recipe.why:
        logger.info("recipe auto: %s", line)
    recipe = recipe.with_time(timing)
    if prep.length is not None:
        recipe = recipe.with_length(prep.length)
    if prep.recipe is not None and prep.recipe.contrast is not None:  # (chosen before the step was timed)
        recipe = recipe.with_contrast(*prep.recipe.contrast)
    plan = plan_for_records(config, train_records, compositions=compositions, spent=prep.plan.spent)
    return dataclasses.replace(prep, config=config, recipe=recipe, plan=plan, time_budget=timing, pending_seconds=None)


def build_mechanism(prep: Prepared, model_config, *, run_seed: int, num_rows: int, mesh):
    """(the run's mechanism or None, the training core's gradient strategy), from the plan."""
    from dpsynth.train import core

    config, plan = prep.config, prep.plan
    if not config.private:
        return None, core.MeanGradient()
    try:
        mech = build_run_mechanism(plan, clip_norm=config.clip_norm, microbatch_size=config.microbatch_size,
                                   seed=run_seed, num_rows=num_rows, user_ids=prep.train_users,
                                   max_examples_per_user=config.max_examples_per_user,
                                   data_shards=mesh[0] if mesh is not None else 1)
    except (UserColumnError, ValueError) as e:
        raise TuneError(str(e)) from e
    spec = embedding_spec(model_config, config)
    method = clipping_method(model_config, config)
    if spec is None and method != "vmap":
        return mech, dataclasses.replace(mech.strategy, clipping=method)
    if spec is None:
        return mech, mech.strategy
    # exact sparse clipping of an untied input table (imported models, full mode)
    if not mech.mechanism.supports_sparse_embedding or plan.privacy_unit != "example":
        raise TuneError("full tuning of a model with an untied input embedding uses sparse per-example "
                        "clipping, which supports example-level DP-SGD only (use --mode lora or prompt)")
    if method != "vmap":
        raise TuneError("a model with an untied input embedding uses the sparse clipping path: drop --clipping "
                        f"{config.clipping}")
    return mech, mech.mechanism.sparse_embedding_strategy(plan, clip_norm=config.clip_norm, embedding=spec)

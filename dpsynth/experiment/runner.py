"""`dpsynth experiment CONFIG.yaml [--dry-run] [--jobs N]`: a cached grid of pipeline runs.

The runner builds the stage graph of the config (`plan.build_plan`), then runs each stage
instance whose output is not cached (`cache.run_stage`), in dependency order. One scheduler
starts every ready instance, in plan order, while fewer than `--jobs N` run: with N = 1 the
instance runs in this process, so the run is strictly sequential in plan order; with N > 1
independent instances (the trials' DP tuning and generation) run in N worker processes
(`concurrent.futures.ProcessPoolExecutor`, spawn start method: JAX does not survive fork). The end of an experiment is the evaluate stage's batch metric report,
linked at `ROOT/report`.

Interrupting a run (Ctrl-C, a kill, a crash) loses only the stage instances in flight;
rerunning the same command resumes with the first unfinished stage.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from dpsynth import errors, fileio, logs
from dpsynth.dp import mechanisms
from dpsynth.experiment import cache, stages
from dpsynth.experiment import privacy as root_privacy
from dpsynth.experiment.cache import StageFailed, StageOutput, StageUnavailable
from dpsynth.experiment.config import ConfigError, ExperimentConfig, load_config, to_dict
from dpsynth.experiment.plan import STAGES, Plan, StageNode, build_plan, fmt_num

EXIT_FAILED = 1
EXIT_CONFIG = errors.EXIT_USER_ERROR  # a config error (any `DpsynthError` raised before a stage runs)
EXIT_UNAVAILABLE = 3


@dataclasses.dataclass
class ExperimentResult:
    """What a run did: outputs per node key, which ran and which were cached, and why it stopped."""

    plan: Plan
    outputs: dict[str, StageOutput]
    ran: list[str]
    cached: list[str]
    missing: StageUnavailable | None = None
    failed: StageFailed | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.missing is None and self.failed is None

    @property
    def report_dir(self) -> str | None:
        out = self.outputs.get("evaluate")
        return out.dir if out else None


def default_registry() -> Mapping[str, Callable]:
    """The real stage functions (`dpsynth.experiment.stages.REGISTRY`)."""
    return stages.REGISTRY


def _log(message: str) -> None:
    print(f"[experiment] {message}", flush=True)


def _inputs_of(node: StageNode, outputs: Mapping[str, StageOutput]) -> dict[str, Any]:
    return {
        role: (tuple(outputs[k] for k in v) if isinstance(v, tuple) else outputs[v]) for role, v in node.inputs.items()
    }


def _selected(plan: Plan, until: str | None) -> list[StageNode]:
    if until is None:
        return list(plan.nodes)
    if until not in STAGES:
        raise ConfigError(f"--until: unknown stage {until!r}; stages are {', '.join(STAGES)}")
    last = STAGES.index(until)
    return [n for n in plan.nodes if STAGES.index(n.stage) <= last]


def write_experiment_files(plan: Plan, config: ExperimentConfig) -> None:
    os.makedirs(plan.root, exist_ok=True)
    record = {
        "format": "dpsynth.experiment",
        "format_version": 1,
        "config": to_dict(config),
        "stages": {n.key: {"stage": n.stage, "hash": n.hash, "dir": os.path.relpath(plan.stage_dir(n), plan.root)} for n in plan.nodes},
        "trials": [
            {**t.params(), "dp_tune": os.path.relpath(plan.stage_dir(t.dp_tune), plan.root),
             "generate": os.path.relpath(plan.stage_dir(t.generate), plan.root),
             **({"labels": os.path.relpath(plan.stage_dir(t.labels), plan.root)} if t.labels else {})}
            for t in plan.trials
        ],
    }
    fileio.write_json(os.path.join(plan.root, "experiment.json"), record, sort_keys=False, newline=False)


def _link(target: str, link: str) -> None:
    tmp = link + ".tmp"
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(os.path.relpath(target, os.path.dirname(link)), tmp)
    os.replace(tmp, link)


def run_plan(
    plan: Plan,
    *,
    registry: Mapping[str, Callable] | None = None,
    jobs: int = 1,
    until: str | None = None,
    show_cached_reports: bool = True,
    on_stage: Callable[[StageNode], None] | None = None,
) -> ExperimentResult:
    """Runs every uncached stage of `plan` (up to stage kind `until`) in dependency order.

    Args:
        plan: from `build_plan`.
        registry: stage kind -> stage function (default: the real stages). With `jobs > 1`
            the functions must be picklable (module-level).
        jobs: worker processes for independent stage instances (1 = in this process).
        until: stop after this stage kind (e.g. "dedup").
        show_cached_reports: print the stored report of stages that were cached.
        on_stage: called with each node just before it runs or is found cached (the demo
            prints a banner per stage).

    Returns:
        An `ExperimentResult`; `missing` / `failed` say why a run stopped early. Completed
        stages stay cached either way.
    """
    registry = default_registry() if registry is None else registry
    todo = _selected(plan, until)
    outputs: dict[str, StageOutput] = {}
    result = ExperimentResult(plan=plan, outputs=outputs, ran=[], cached=[])
    t0 = time.perf_counter()
    total = len(todo)

    def finish(node: StageNode, out: StageOutput) -> None:
        outputs[node.key] = out
        (result.cached if out.cached else result.ran).append(node.key)
        n = len(outputs)
        if out.cached:
            _log(f"({n}/{total}) {node.key}: cached ({out.hash[:12]}) {os.path.relpath(out.dir, plan.root)}")
            if show_cached_reports and out.report:
                print(out.report.rstrip("\n"), flush=True)
        else:
            _log(f"({n}/{total}) {node.key}: done in {out.seconds:.1f}s -> {os.path.relpath(out.dir, plan.root)}")

    def fn_of(node: StageNode) -> Callable:
        if node.stage not in registry:
            raise StageUnavailable(node.stage, "no stage function registered")
        return registry[node.stage]

    _schedule(plan, todo, fn_of, outputs, result, finish, jobs, on_stage)
    result.seconds = time.perf_counter() - t0
    if "evaluate" in outputs:
        _link(outputs["evaluate"].dir, os.path.join(plan.root, "report"))
    return result


class _InProcess:
    """The one-job executor: runs each submitted stage at once, in this process (so a registry
    need not be picklable); its future is already done when `submit` returns."""

    def submit(self, fn, *args, **kwargs) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as e:  # re-raised by `future.result()`, as a worker's would be
            future.set_exception(e)
        return future

    def __enter__(self) -> "_InProcess":
        return self

    def __exit__(self, *exc) -> None:
        return None


def _schedule(plan, todo, fn_of, outputs, result, finish, jobs, on_stage) -> None:
    """Runs `todo` (plan order, topological): resolves cached nodes and starts ready ones, in
    order, while fewer than `jobs` run, until done or a stage is missing or failed (the
    stages in flight then finish; nothing new starts)."""
    jobs = max(jobs, 1)
    pending = list(todo)
    running: dict[concurrent.futures.Future, StageNode] = {}
    executor = (_InProcess() if jobs == 1 else
                concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")))
    with executor as pool:
        while True:
            for node in list(pending) if result.ok else ():
                if len(running) >= jobs:
                    break
                if not all(k in outputs for k in node.input_keys()):
                    continue
                pending.remove(node)
                if on_stage is not None:
                    on_stage(node)
                out = cache.cached_output(plan.root, node)
                if out is not None:
                    finish(node, out)
                    continue
                try:
                    fn = fn_of(node)
                except StageUnavailable as e:
                    result.missing = e
                    break
                _log(f"({len(outputs) + len(running) + 1}/{len(todo)}) {node.key}: running ({node.hash[:12]})")
                running[pool.submit(cache.run_stage, plan.root, node, fn, _inputs_of(node, outputs),
                                    data_dir=plan.data_dir)] = node
            if not running:
                break  # done, or stopped with nothing in flight
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in done:
                node = running.pop(fut)
                try:
                    finish(node, fut.result())
                except StageUnavailable as e:
                    result.missing = result.missing or e
                except StageFailed as e:
                    result.failed = result.failed or e
                except concurrent.futures.process.BrokenProcessPool as e:
                    result.failed = result.failed or StageFailed(f"stage {node.key}: worker died ({e})")


def run_experiment(
    config: ExperimentConfig,
    *,
    root: str | None = None,
    registry: Mapping[str, Callable] | None = None,
    jobs: int = 1,
    until: str | None = None,
    data_dir: str | None = None,
) -> ExperimentResult:
    """Plans and runs an experiment; see `run_plan`. `root` defaults to `config.out`."""
    root = root or config.out
    if not root:
        raise ConfigError("out: no output directory (set `out:` in the config or pass --out)")
    plan = build_plan(config, root, data_dir=data_dir)
    write_experiment_files(plan, config)
    _log(f"'{config.name}': {len(plan.trials)} trial(s), {len(plan.nodes)} stage instance(s), root {plan.root}")
    return run_plan(plan, registry=registry, jobs=jobs, until=until)


# ----------------------------------------------------------------------------- dry run


def train_size(plan: Plan, config: ExperimentConfig) -> tuple[int | None, str]:
    """|D_train| for the privacy budget: from the cached data stage, else by reading the data."""
    node = plan.node("sensitive")
    out = cache.cached_output(plan.root, node)
    if out is not None and "num_train" in out.summary:
        return int(out.summary["num_train"]), "cached data stage"
    try:
        return stages.count_train(node.config, data_dir=plan.data_dir), "counted"
    except Exception as e:  # the data may be absent at planning time; the plan still prints
        return None, f"unknown ({type(e).__name__}: {e})"


def train_users(plan: Plan) -> int | None:
    """The distinct users of D_train (user-level runs): from the cached data stage, else counted."""
    node = plan.node("sensitive")
    out = cache.cached_output(plan.root, node)
    if out is not None and "num_train_users" in out.summary:
        return int(out.summary["num_train_users"])
    try:
        return stages.count_train_users(node.config, data_dir=plan.data_dir)
    except Exception:  # the data may be absent at planning time
        return None


def privacy_budgets(plan: Plan, config: ExperimentConfig, num_train: int | None) -> list[dict[str, Any]]:
    """Per DP-tuning node: epsilon, delta, q, steps, the calibrated noise multiplier and `plan`.

    `plan` is the node's `dpsynth.dp.plan.PrivacyPlan` (mechanism, bands, privacy unit), from
    which the dry run's composition takes each release's ledger entry.

    Computed exactly as the tuner will (`dpsynth.train.tune_config.plan_run`, i.e.
    `dpsynth.dp.plan.plan_privacy` on the node's `TuneConfig`); entries say why when nothing
    can be computed (data size unknown, tuner not installed, unreachable target).
    """
    rows = []
    memo: dict[str, dict[str, Any]] = {}  # trials differing only in mode/lr/C share one calibration
    for node in plan.nodes:
        if node.stage != "dp_tune":
            continue
        c = node.config
        key = json.dumps({k: v for k, v in c.items() if k not in ("mode", "learning_rate", "clip_norm", "lora_rank", "prompt_length")},
                         sort_keys=True, default=str)
        row: dict[str, Any] = {"dp_tune": node.key, "mode": c["mode"], "epsilon": float(c["epsilon"])}
        rows.append(row)
        if num_train is None:
            row["note"] = "|train| unknown"
            continue
        if key in memo:
            row.update(memo[key])
            continue
        try:
            from dpsynth.train.tune_config import plan_run  # only when a dry run plans DP tuning

            tc = stages.tune_config(c)
            chosen_at_run = [what for what, on in (("the example length (max_tokens auto: a DP quantile of D_train's "
                                                    "lengths)", tc.max_tokens == "auto"),
                                                   ("the token budget (time_budget: measured on the run's machine)",
                                                    tc.time_budget is not None)) if on]
            if chosen_at_run:
                raise ValueError(f"steps and noise are planned when the run starts, after it chooses "
                                 f"{' and '.join(chosen_at_run)}; the run meets epsilon {tc.epsilon:g} either way")
            num_users = None
            if tc.private and tc.privacy_unit == "user":
                num_users = train_users(plan)
                if num_users is None:
                    raise ValueError("the number of users of D_train is unknown")
            p = plan_run(tc, num_train, num_users=num_users)
            row.update(delta=p.delta, q=p.sampling_probability, steps=p.steps, noise_multiplier=p.noise_multiplier,
                       accountant=p.accountant, max_batch_size=p.max_batch_size, plan=p)
        except ImportError as e:
            row["note"] = f"tuner not available ({e})"
        except ValueError as e:
            row["note"] = str(e)
        memo[key] = {k: v for k, v in row.items() if k not in ("dp_tune", "mode")}
    return rows


def describe_plan(plan: Plan, config: ExperimentConfig, *, budgets: bool = True) -> str:
    """The dry-run text: every stage instance with its hash, directory and cache status, the
    trials, and the privacy budget of every DP-tuning run."""
    lines = [f"experiment '{config.name}': {len(plan.trials)} trial(s), root {plan.root}", ""]
    width = max(len(n.key) for n in plan.nodes)
    n_cached = 0
    lines.append(f"  {'stage'.ljust(width)}  {'hash':12}  status    inputs")
    for node in plan.nodes:
        done = cache.cached_output(plan.root, node) is not None
        n_cached += done
        inputs = (", ".join(node.input_keys()) if node.stage != "evaluate" else
                  f"{len(node.inputs['synthetic'])} synthetic sets, sensitive, {node.inputs['pretrain']}, their models")
        lines.append(f"  {node.key.ljust(width)}  {node.hash[:12]}  {'cached ' if done else 'to run '}  {inputs}")
    lines.append(f"  {n_cached} cached, {len(plan.nodes) - n_cached} to run")
    if budgets:
        num_train, how = train_size(plan, config)
        user = config.dp_tune.privacy_unit == "user"
        lines += ["", f"privacy budget per DP-tuning run (|train| = {num_train if num_train is not None else '?'}, {how}; "
                      f"delta = {('1/|users|' if user else '1/|train|') if config.dp_tune.delta is None else config.dp_tune.delta}; "
                      f"add-or-remove one {'user' if user else 'example'}"
                      + mechanisms.get(config.dp_tune.mechanism).summary(config.dp_tune.bands) + "):"]
        lines.append(f"  {'dp_tune'.ljust(width)}  {'epsilon':>7}  {'delta':>9}  {'q':>8}  {'steps':>6}  noise multiplier")
        rows = privacy_budgets(plan, config, num_train)
        for row in rows:
            eps = fmt_num(row["epsilon"])
            delta = f"{row['delta']:.3g}" if "delta" in row else "?"
            q = f"{row['q']:.4g}" if "q" in row else "?"
            steps = str(row.get("steps", "?"))
            if "noise_multiplier" in row:
                sigma = "0 (non-private)" if row["noise_multiplier"] == 0 else f"{row['noise_multiplier']:.4f} ({row['accountant']})"
            else:
                sigma = row.get("note", "?")
            lines.append(f"  {row['dp_tune'].ljust(width)}  {eps:>7}  {delta:>9}  {q:>8}  {steps:>6}  {sigma}")
        if config.generate.label_distribution == "dp_histogram":
            lines.append(f"  plus, per DP-tuned model, one DP label histogram of D_train (Gaussian, sigma "
                         f"{config.generate.label_noise_multiplier:g}, sensitivity 1) shared by all its corpora and "
                         "composed into their privacy reports; each private run's target covers it "
                         "(`reserve_label_noise_multiplier`): the noise multiplier above is calibrated on both")
        from dpsynth.dp.private_selection import reserved_entry
        from dpsynth.experiment.plan import reserved_selection_epsilon

        reserve = reserved_selection_epsilon(config)
        if reserve:
            lines.append(f"  each private run's target also covers its DP selection on D_valid (epsilon {reserve:g}, "
                         f"accounted at {reserved_entry(reserve)['epsilon']:g}: D_valid is split by position, so it composes sequentially; "
                         "`reserve_selection_epsilon`): the noise multiplier above is calibrated on both")
        root = root_privacy.planned_releases(plan, config, num_train, rows)
        if root is not None:
            lines += ["", root_privacy.render(root, title="what publishing the whole root costs")]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dpsynth experiment",
        description="Run a cached grid of dpsynth pipeline runs (tokenizer -> dedup -> pretrain -> "
        "dp_tune -> generate -> evaluate; or base_model -> dp_tune -> ... from an imported model) described by one YAML file.",
    )
    p.add_argument("config", help="experiment YAML (see docs/experiment.md)")
    p.add_argument("--out", help="output root (default: the config's `out`)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, the cache status and the privacy budgets; run nothing")
    p.add_argument("--jobs", type=int, default=1, help="worker processes for independent trials (default 1)")
    p.add_argument("--until", choices=STAGES, help="stop after this stage kind")
    p.add_argument("--data-dir", help="embedded default data directory (default $DPSYNTH_EMBEDDED_DIR or data/embedded)")
    logs.add_flags(p)
    return p


@errors.command("experiment")
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    config = load_config(args.config)
    root = args.out or config.out
    if not root:
        raise ConfigError("out: no output directory (set `out:` in the config or pass --out)")
    if args.jobs < 1:
        raise ConfigError(f"--jobs: must be >= 1, got {args.jobs}")
    if args.dry_run:
        plan = build_plan(config, root, data_dir=args.data_dir)
        print(describe_plan(plan, config))
        return 0
    result = run_experiment(config, root=root, jobs=args.jobs, until=args.until, data_dir=args.data_dir)
    return report_result(result, verbose=args.verbose)


def report_result(result: ExperimentResult, *, verbose: bool = False) -> int:
    """Prints how a run ended and returns its exit code.

    A stage that failed on its input or configuration (a `ValueError`: unreadable data, too many
    dead letters, a refused resume) is one line; anything else, or `verbose`, adds the traceback.
    """
    _log(f"{len(result.ran)} stage(s) ran, {len(result.cached)} cached, {result.seconds:.1f}s")
    if result.missing is not None:
        print(f"dpsynth experiment: stopped: {result.missing}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if result.failed is not None:
        print(f"dpsynth experiment: FAILED: {result.failed}", file=sys.stderr)
        cause = result.failed.__cause__
        if cause is not None and (verbose or not isinstance(cause, ValueError)):
            import traceback

            traceback.print_exception(cause, file=sys.stderr)
        return EXIT_FAILED
    if result.report_dir:
        _log(f"report: {os.path.join(result.plan.root, 'report')} -> {result.report_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The resource plan of a `dp_tune` run: per-device memory, FLOPs and time, compiled without weights.

`plan_tuning` compiles the EXACT step functions a run executes (`dpsynth.train.tune_model.compile_steps`:
`planned_step`'s tuned model config, loss, gradient strategy, optimizer and `dpsynth.train.core`
entry points, donation and shardings) on abstract arrays, so it needs neither the weights nor the
device: a Llama-3-8B `config.json` and 8 virtual CPU devices are enough (`dpsynth plan`). It
reports per device the parameters, trainable parameters, optimizer state, the step's
temporaries and total (`dpsynth.train.resources.ProgramCost`); FLOPs per example-token; and per
named accelerator whether the step fits (less a headroom), a microbatch that would (linear in
the microbatch from two compilations) and the roofline time per step (expected batch /
microbatch accumulate calls + one apply), per epoch and per run. docs/scaling.md shows it on
the paper's 8B LoRA run and says how close the CPU figures are to measured ones.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from dpsynth.train.tune_config import plan_run
from dpsynth.train.recipe import AUTO
from dpsynth.train.tune_model import auto_label_contrast, compile_steps
from dpsynth.train.resources import (ACCELERATORS, DEFAULT_HEADROOM, GIB, Accelerator, ModelSource, PlanError,
                                     ProgramCost, bytes_per_device, count)


def _roofline(cost: ProgramCost, acc: Accelerator) -> float:
    return max(cost.flops / acc.peak_flops, cost.bytes_accessed / acc.bandwidth)


def plan_tuning(source: ModelSource, config, *, dataset_size: int, mesh: tuple[int, int] = (1, 1), fsdp: bool = False,
                headroom: float = DEFAULT_HEADROOM, suggest: bool = True, labels: int | None = None,
                accelerators: tuple[Accelerator, ...] = ACCELERATORS) -> dict[str, Any]:
    """The resource plan of a `dp_tune` run (see the module docstring); a JSON-able dict.

    Args:
        source: the base model (`resolve_model`).
        config: the run's `TuneConfig` (mode, adapters, expected batch, microbatch, max_tokens, epochs/steps).
        dataset_size: N, the training examples (the privacy plan's steps and the epoch length).
        mesh: (data, model) devices; `fsdp` also shards the parameters over `data`.
        headroom: the fraction of device memory a fit must leave free.
        suggest: also compile the step at twice the microbatch, for the growth of the peak per
            example and a suggested microbatch per accelerator (linear extrapolation).
        labels: K, the size of the label set: with a label contrast (given, or "auto" with the
            automatic recipe) each example is also fed under label prompts, rows of the same length
            that the step compiles: K of them with the full form, 2 with the sampled one
            (`TuneConfig.contrast_rows`; "auto": full for at most 4 labels).
    """
    if config.microbatch_size == "auto":
        raise PlanError("the plan takes a microbatch (it suggests one per accelerator)")
    data_axis = mesh[0]
    if config.microbatch_size % data_axis:
        raise PlanError(f"microbatch {config.microbatch_size} must be divisible by the mesh data axis {data_axis}")
    if config.label_contrast == AUTO:  # the automatic recipe's: it needs K
        if config.recipe == "auto" and (labels is None or labels < 2):
            raise PlanError("the automatic recipe adds the label contrast (K or 2 passes per example, by its form): "
                            f"give the label set's size K >= 2 (--labels), or --label-contrast 0; got {labels}")
        config = dataclasses.replace(config, label_contrast=auto_label_contrast(config, source.config, labels or 0)[0])
    plan = plan_run(config, dataset_size)
    length = config.max_tokens - 1  # the longest row dp_tune pads to (`tune_data.row_length`)
    mesh_arg = mesh if mesh[0] * mesh[1] > 1 or fsdp else None
    contrast = None
    if config.contrast:
        if labels is None or labels < 2:
            raise PlanError("the label contrast feeds every example under label prompts (K, or 2 sampled): give "
                            f"K >= 2 (--labels), got {labels}")
        contrast = (config.contrast_rows(labels), length)  # K rows per example (full form) or 2 (sampled)
    common = dict(row_length=length, mesh=mesh_arg, fsdp=fsdp, param_dtype=source.param_dtype, contrast=contrast)
    steps = compile_steps(source.config, config, plan, microbatch=config.microbatch_size, **common)
    # A second compilation at twice the microbatch: the peak's growth per example, for the suggestions.
    double = (compile_steps(source.config, config, plan, microbatch=2 * config.microbatch_size, apply=False,
                                     **common).accumulate if suggest else None)
    acc_c, app_c = steps.accumulate, steps.apply
    state = steps.state
    devices = mesh[0] * mesh[1]
    peak = max(acc_c.total_bytes, app_c.total_bytes)
    per_example = (double.total_bytes - acc_c.total_bytes) / config.microbatch_size if suggest else None
    micro_per_step = math.ceil(plan.expected_batch_size / config.microbatch_size)
    example_tokens = config.microbatch_size * length
    out: dict[str, Any] = {
        "model": {"source": source.name, "param_dtype": source.param_dtype, "compute_dtype": steps.model_config.dtype,
                  "parameters": count(state.params) + count(state.frozen), "trainable_parameters": count(state.params)},
        "run": {"mode": config.mode, "lora_rank": config.lora_rank if config.mode == "lora" else None,
                "lora_targets": config.lora_targets if config.mode == "lora" else None,
                "prompt_length": config.prompt_length if config.mode == "prompt" else None,
                "optimizer": config.optimizer, "dataset_size": dataset_size,
                "expected_batch": plan.expected_batch_size, "microbatch": config.microbatch_size,
                "row_tokens": length, "steps": plan.steps, "epochs": plan.steps * plan.expected_batch_size / dataset_size,
                "steps_per_epoch": dataset_size / plan.expected_batch_size, "microbatches_per_step": micro_per_step,
                "noise_multiplier": plan.noise_multiplier, "epsilon": config.epsilon,
                **({"label_contrast": config.contrast, "labels": labels,
                    "label_contrast_form": config.contrast_form(labels), "contrast_rows": contrast[0]}
                   if contrast else {})},
        "mesh": {"data": mesh[0], "model": mesh[1], "fsdp": fsdp, "devices": devices,
                 "backend": jax.default_backend()},
        "per_device": {
            "parameters_bytes": bytes_per_device(state.params) + bytes_per_device(state.frozen),
            "trainable_bytes": bytes_per_device(state.params),
            "optimizer_bytes": bytes_per_device(state.opt_state) + bytes_per_device(state.noise_state),
            "step_temporary_bytes": acc_c.temp_bytes,
            "total_bytes": peak,
            "bytes_per_extra_example": per_example,
        },
        "programs": {"accumulate": acc_c.to_json(), "apply": app_c.to_json()},
        "flops": {"per_example_token": acc_c.flops * devices / example_tokens,
                  "per_step": (micro_per_step * acc_c.flops + app_c.flops) * devices,
                  "per_run": (micro_per_step * acc_c.flops + app_c.flops) * devices * plan.steps},
        "fingerprint": acc_c.fingerprint,
        "headroom": headroom,
    }
    rows = []
    for a in accelerators:
        budget = a.memory_bytes * (1 - headroom)
        step_s = micro_per_step * _roofline(acc_c, a) + _roofline(app_c, a)
        suggest = None
        if per_example is not None and per_example > 0:
            m = int((budget - (acc_c.total_bytes - per_example * config.microbatch_size)) // per_example)
            m = min(m, int(math.ceil(plan.expected_batch_size)))
            suggest = (m // data_axis) * data_axis if m >= data_axis else 0
        row = {"name": a.name, "memory_bytes": a.memory_bytes, "peak_flops": a.peak_flops, "bandwidth": a.bandwidth,
               "fits": peak <= budget, "memory_fraction": peak / a.memory_bytes, "suggested_microbatch": suggest,
               "step_seconds": step_s, "epoch_hours": step_s * dataset_size / plan.expected_batch_size / 3600,
               "run_hours": step_s * plan.steps / 3600, "source": a.source}
        rows.append(row)
    out["accelerators"] = rows
    return out


def add_program(plan: dict[str, Any], cost: ProgramCost, accelerators: tuple[Accelerator, ...] = ACCELERATORS) -> None:
    """Adds another compiled program (e.g. the sampler's call, `dpsynth.generate.sampler.Sampler.lower`)
    to `plan`: its figures, whether the plan's devices still fit, and its roofline time per call."""
    plan["programs"][cost.name] = cost.to_json()
    by_name = {a.name: a for a in accelerators}
    for row in plan["accelerators"]:
        a = by_name[row["name"]]
        row[f"{cost.name}_fits"] = cost.total_bytes <= a.memory_bytes * (1 - plan["headroom"])
        row[f"{cost.name}_seconds_per_call"] = _roofline(cost, a)


def format_plan(plan: dict[str, Any]) -> str:
    """The plan as a short human-readable report."""
    g = lambda b: f"{b / GIB:.3f} GiB"  # noqa: E731
    m, r, d, pd = plan["model"], plan["run"], plan["mesh"], plan["per_device"]
    lines = [f"model {m['source']}: {m['parameters']:,} parameters ({m['param_dtype']}, compute {m['compute_dtype']}), "
             f"{m['trainable_parameters']:,} trainable ({r['mode']})",
             f"run: N {r['dataset_size']:,}, expected batch {r['expected_batch']:g}, microbatch {r['microbatch']} x "
             f"{r['row_tokens']} tokens, {r['microbatches_per_step']} microbatches/step, {r['steps']:,} steps "
             f"({r['epochs']:.3g} epochs, sigma {r['noise_multiplier']:.4g})",
             f"mesh: {d['data']} data x {d['model']} model{' (FSDP)' if d['fsdp'] else ''} = {d['devices']} devices, "
             f"compiled on {d['backend']}",
             "per device:",
             f"  parameters        {g(pd['parameters_bytes'])}",
             f"  trainable         {g(pd['trainable_bytes'])}",
             f"  optimizer state   {g(pd['optimizer_bytes'])}",
             f"  step temporaries  {g(pd['step_temporary_bytes'])}",
             f"  total (peak)      {g(pd['total_bytes'])}" + (
                 f"   (+{pd['bytes_per_extra_example'] / 2**20:.1f} MiB per extra microbatch example)"
                 if pd["bytes_per_extra_example"] is not None else "")]
    for name, p in plan["programs"].items():
        lines.append(f"  program {name:10s} args {g(p['argument_bytes'])} temp {g(p['temp_bytes'])} total "
                     f"{g(p['total_bytes'])} FLOPs {p['flops']:.4g}")
    f = plan["flops"]
    lines.append(f"FLOPs: {f['per_example_token']:.4g} per example-token, {f['per_step']:.4g} per step, "
                 f"{f['per_run']:.4g} per run")
    lines.append(f"per accelerator ({d['devices']} chips; fit = peak <= memory less {plan['headroom']:.0%}; "
                 "roofline = max(FLOPs/peak, bytes/bandwidth), a lower bound):")
    for a in plan["accelerators"]:
        lines.append(f"  {a['name']:8s} {'fits' if a['fits'] else 'DOES NOT FIT':12s} {a['memory_fraction']:6.1%} of "
                     f"{a['memory_bytes'] / 1e9:.0f} GB; "
                     + (f"microbatch up to ~{a['suggested_microbatch']}; " if a["suggested_microbatch"] is not None else "")
                     + f"step {a['step_seconds']:.3g} s, epoch {a['epoch_hours']:.3g} h, run {a['run_hours']:.3g} h")
    lines.append(f"step fingerprint {plan['fingerprint'][:16]}")
    return "\n".join(lines)

"""Peer of `bench/dp_step.py --model`: DP-LoRA with Opacus + PEFT on CPU torch, the same GGUF model and batch.

Runs in the peers' venv (bench/peers/common.py). The GGUF is loaded with transformers' `gguf_file=`
(float32); PEFT puts LoRA adapters (rank `--rank`, alpha `--alpha`, no dropout) on the projections dpsynth's
`lora_targets="all"` adapts (q, k, v, o, gate, up, down); everything else is frozen. The loss is dpsynth's
Prefix-LM loss: per example, the cross-entropy over its target tokens (weights from the .npz) divided by
their number. One logical step = the `--examples` rows in microbatches of `--microbatch`, then one
optimizer step (Adam), in four variants:

  nonprivate: PEFT alone (the mean loss, backward per microbatch, gradients accumulate, Adam);
  hooks:      Opacus' GradSampleModule (per-sample gradients from hooks) + DPOptimizer (per-sample
              clipping at `--clip`, noise `--noise` x clip, divided by the expected batch), microbatches
              accumulated as Opacus' BatchMemoryManager does (signal_skip_step);
  ghost:      Opacus' ghost clipping (GradSampleModuleFastGradientClipping + DPOptimizerFastGradientClipping:
              per-sample norms from the hooks, then a second backward of the rescaled loss).

Each variant: one untimed microbatch and optimizer step (warm-up), then the best of `--reps` timed ones (wall and
process CPU seconds), and the peak RSS of the timed steps. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def prefix_lm_loss(model, torch, inputs, targets, weights):
    """[B] per-example mean cross-entropy over the weighted (target) tokens."""
    logits = model(input_ids=inputs).logits.float()
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                           reduction="none").reshape(targets.shape)
    return (ce * weights).sum(-1) / weights.sum(-1).clamp(min=1.0)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", required=True)
    p.add_argument("--batch", required=True, help=".npz with inputs, targets (int) and weights (float) [examples, T]")
    p.add_argument("--microbatch", type=int, default=8)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--noise", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--variants", nargs="+", default=["nonprivate", "hooks", "ghost"])
    args = p.parse_args(argv)
    try:
        import numpy as np
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        common.emit({"unavailable": f"torch/transformers/peft not importable in the peers venv: {e}"})
        return
    try:
        import opacus
        from opacus import GradSampleModule
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping
    except ImportError as e:
        opacus = None
        missing = f"opacus not importable in the peers venv: {e}"
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = np.load(args.batch)
    inputs, targets = torch.from_numpy(data["inputs"].astype(np.int64)), torch.from_numpy(data["targets"].astype(np.int64))
    weights = torch.from_numpy(data["weights"].astype(np.float32))
    n, mb = inputs.shape[0], args.microbatch
    chunks = [slice(i, min(i + mb, n)) for i in range(0, n, mb)]
    directory, name = os.path.split(os.path.abspath(args.gguf))
    t0 = time.perf_counter()
    base = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    load_s = time.perf_counter() - t0
    base.config.use_cache = False
    result = {"versions": common.versions(["torch", "transformers", "peft", "opacus", "gguf"]), "load_s": load_s,
              "examples": n, "microbatch": mb, "seq": int(inputs.shape[1]), "threads": args.threads}
    lora = LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0, target_modules=TARGETS, bias="none")
    model = get_peft_model(base, lora)
    model.train()
    result["trainable_params"] = sum(q.numel() for q in model.parameters() if q.requires_grad)
    initial = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}

    def fresh_optimizer():
        with torch.no_grad():  # every variant starts from the same adapters
            for k, v in model.named_parameters():
                if v.requires_grad:
                    v.copy_(initial[k])
        return torch.optim.Adam([q for q in model.parameters() if q.requires_grad], lr=args.lr)

    def nonprivate():
        opt = fresh_optimizer()

        def step(chunks=chunks):
            for c in chunks:
                loss = prefix_lm_loss(model, torch, inputs[c], targets[c], weights[c]).sum() / n
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step, lambda: None

    def hooks():
        opt = fresh_optimizer()
        gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum", strict=False)
        dp = DPOptimizer(opt, noise_multiplier=args.noise, max_grad_norm=args.clip, expected_batch_size=n,
                         loss_reduction="sum")

        def step(chunks=chunks):
            for i, c in enumerate(chunks):
                prefix_lm_loss(gsm, torch, inputs[c], targets[c], weights[c]).sum().backward()
                dp.signal_skip_step(do_skip=i < len(chunks) - 1)
                dp.step()
                dp.zero_grad()
        return step, gsm._close

    def ghost():
        opt = fresh_optimizer()
        gsm = GradSampleModuleFastGradientClipping(model, batch_first=True, loss_reduction="sum", strict=False,
                                                   max_grad_norm=args.clip, use_ghost_clipping=True)
        dp = DPOptimizerFastGradientClipping(opt, noise_multiplier=args.noise, max_grad_norm=args.clip,
                                             expected_batch_size=n, loss_reduction="sum")

        def step(chunks=chunks):
            for i, c in enumerate(chunks):
                per = prefix_lm_loss(gsm, torch, inputs[c], targets[c], weights[c])
                DPTensorFastGradientClipping(gsm, dp, per, "sum").backward()
                dp.signal_skip_step(do_skip=i < len(chunks) - 1)
                dp.step()
                dp.zero_grad()
        return step, gsm._close

    for variant in args.variants:
        make = {"nonprivate": nonprivate, "hooks": hooks, "ghost": ghost}[variant]
        if variant != "nonprivate" and opacus is None:
            result[variant] = {"unavailable": missing}
            continue
        try:
            step, close = make()
            step(chunks[:1])  # warm-up: one microbatch and an optimizer step
            common.reset_peak_rss()
            times, cpu = [], []
            for _ in range(args.reps):
                t0, c0 = time.perf_counter(), time.process_time()
                step()
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            result[variant] = {"step_s": min(times), "step_cpu_s": min(cpu), "peak_rss": common.peak_rss()}
            close()
        except Exception as e:  # a variant Opacus refuses for this model is named, not dropped
            result[variant] = {"unavailable": f"{type(e).__name__}: {str(e)[:300]}"}
    common.emit(result)


if __name__ == "__main__":
    main()

"""Peer of `bench/generate.py --gguf`: transformers' `generate` on CPU torch, the same GGUF file, prompts, length.

Runs in the peers' venv (bench/peers/common.py). The GGUF is loaded with `gguf_file=` (dequantized to
float32, as dpsynth's import does), the prompts (token ids from a JSON file, the label prompts dpsynth
built) are left-padded into one batch, and `generate` samples `--new-tokens` tokens per row from the
full distribution (temperature 1, no top-k/top-p; `min_new_tokens` keeps EOS from ending a row early).
One untimed call of 2 tokens first (warm-up); the timed call is the best of `--repeats`. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main(argv=None) -> None:
    p = common.generate_parser(__doc__)
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args(argv)
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        common.emit({"unavailable": f"transformers/torch not importable in the peers venv: {e}"})
        return
    torch.set_num_threads(args.threads)
    with open(args.prompts) as f:
        prompts = json.load(f)
    directory, name = os.path.split(os.path.abspath(args.gguf))
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    width = max(len(x) for x in prompts)
    pad = 0
    ids = torch.tensor([[pad] * (width - len(x)) + x for x in prompts])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in prompts])
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=pad)
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, min_new_tokens=2, **kw)
        common.reset_peak_rss()  # the generation's peak, with the model loaded
        times, cpu = [], []
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.new_tokens,
                                 min_new_tokens=args.new_tokens, **kw)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    generated = int(out.shape[1] - width) * len(prompts)
    common.emit({"peer": "transformers generate (CPU torch, float32, batched)", "seconds": min(times), "cpu_s": min(cpu),
                 "generated_tokens": generated, "rows": len(prompts), "load_s": load_s, "threads": args.threads,
                 "peak_rss": common.peak_rss(), "versions": common.versions(["torch", "transformers", "gguf"])})


if __name__ == "__main__":
    main()

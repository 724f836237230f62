"""Peer of `bench/generate.py --gguf`: llama.cpp (llama-cpp-python's bindings of its C API) on the GGUF file.

Runs in the peers' venv (bench/peers/common.py). The same prompts (token ids from a JSON file) sample
`--new-tokens` tokens each from the full distribution (llama.cpp's sampler chain: temperature 1, then
`dist`, no top-k/top-p/min-p; EOS never ends a row), `--threads` threads, two ways:

  single:  one sequence at a time (a context of one sequence; the KV cache cleared between rows), as a
           chat/completion loop does;
  batched: every row a parallel sequence of one context (n_seq_max = rows): the prompts in one
           llama_batch, then one llama_batch per step holding each row's last token (seq_id = row),
           as llama.cpp's `batched` example and its server's parallel slots do.

One untimed pass of 2 tokens first (warm-up). Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class Runner:
    """A llama.cpp context for `n_seq` parallel sequences of up to `n_ctx_seq` tokens each."""

    def __init__(self, llama_cpp, model, n_seq: int, n_ctx_seq: int, n_batch: int, threads: int):
        self.l = llama_cpp
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_seq * n_ctx_seq
        params.n_batch = params.n_ubatch = max(n_batch, n_seq)
        params.n_seq_max = n_seq
        params.n_threads = params.n_threads_batch = threads
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        if not self.ctx:
            raise RuntimeError("llama_init_from_model failed")
        self.batch = llama_cpp.llama_batch_init(max(n_batch, n_seq), 0, n_seq)
        self.samplers = []

    def clear(self, seeds):
        mem = self.l.llama_get_memory(self.ctx)
        self.l.llama_memory_clear(mem, True)
        for s in self.samplers:
            self.l.llama_sampler_free(s)
        self.samplers = []
        for seed in seeds:
            chain = self.l.llama_sampler_chain_init(self.l.llama_sampler_chain_default_params())
            self.l.llama_sampler_chain_add(chain, self.l.llama_sampler_init_temp(1.0))
            self.l.llama_sampler_chain_add(chain, self.l.llama_sampler_init_dist(seed))
            self.samplers.append(chain)

    def decode(self, entries):
        """One llama_decode of entries (token, pos, seq, wants_logits)."""
        b = self.batch
        for i, (tok, pos, seq, want) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos, 1
            b.seq_id[i][0] = seq
            b.logits[i] = want
        b.n_tokens = len(entries)
        rc = self.l.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def generate(self, prompts, new_tokens, seed0=0):
        """Samples `new_tokens` per prompt, all prompts as parallel sequences; returns the token lists."""
        self.clear([seed0 + i for i in range(len(prompts))])
        entries = [(t, pos, s, pos == len(p) - 1) for s, p in enumerate(prompts) for pos, t in enumerate(p)]
        if len(entries) > self.l.llama_n_batch(self.ctx):
            raise ValueError("the prompts must fit one llama_batch")
        logits_at = {e[2]: i for i, e in enumerate(entries) if e[3]}  # seq -> its last prompt token's batch index
        self.decode(entries)
        out = [[] for _ in prompts]
        pos = [len(p) for p in prompts]
        for step in range(new_tokens):
            toks = [self.l.llama_sampler_sample(self.samplers[s], self.ctx, logits_at[s]) for s in range(len(prompts))]
            for s, t in enumerate(toks):
                out[s].append(int(t))
            if step == new_tokens - 1:
                break
            self.decode([(t, pos[s], s, True) for s, t in enumerate(toks)])
            logits_at = {s: s for s in range(len(prompts))}
            pos = [p + 1 for p in pos]
        return out


def main(argv=None) -> None:
    p = common.generate_parser(__doc__)
    p.add_argument("--single-rows", type=int, default=None,
                   help="time one sequence at a time on only the first K rows (a row's rate does not depend on the others)")
    args = p.parse_args(argv)
    try:
        import llama_cpp
    except ImportError as e:
        common.emit({"unavailable": f"llama-cpp-python not importable in the peers venv: {e}"})
        return
    with open(args.prompts) as f:
        prompts = json.load(f)
    llama_cpp.llama_backend_init()
    t0 = time.perf_counter()
    model = llama_cpp.llama_model_load_from_file(args.gguf.encode(), llama_cpp.llama_model_default_params())
    if not model:
        common.emit({"unavailable": f"llama.cpp could not load {args.gguf}"})
        return
    load_s = time.perf_counter() - t0
    n_ctx_seq = -(-(max(map(len, prompts)) + args.new_tokens + 8) // 256) * 256
    width = max(map(len, prompts))
    result = {"versions": common.versions(["llama_cpp_python"]), "load_s": load_s, "threads": args.threads}
    single = prompts[:args.single_rows or len(prompts)]
    for name, n_seq, groups in (("batched", len(prompts), [prompts]), ("single", 1, [[x] for x in single])):
        runner = Runner(llama_cpp, model, n_seq, n_ctx_seq, max(width * n_seq, 64), args.threads)
        runner.generate(groups[0], 2)  # warm-up
        common.reset_peak_rss()
        t0, c0 = time.perf_counter(), time.process_time()
        tokens = [t for i, g in enumerate(groups) for t in runner.generate(g, args.new_tokens, seed0=1000 * i)]
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        result[name] = {"peer": ("one sequence at a time" if n_seq == 1 else f"{n_seq} parallel sequences per llama_batch"),
                        "seconds": seconds, "cpu_s": cpu, "generated_tokens": sum(map(len, tokens)), "rows": sum(map(len, groups)),
                        "peak_rss": common.peak_rss()}
        llama_cpp.llama_batch_free(runner.batch)
        llama_cpp.llama_free(runner.ctx)
    common.emit(result)


if __name__ == "__main__":
    main()

"""Does `dpsynth probe` tell a model that has seen D from one that has not? A planted set.

    DPSYNTH_EMBEDDED_DIR=data/embedded .venv/bin/python bench/contamination_probe.py [--work /tmp/probe_bench]

Two `tiny` models are pretrained on the same public-like corpus (Austen paragraphs and
`--background` Fine Food reviews, the embedded data, `make data`), and the "seen" model's corpus
also holds `--planted` other reviews repeated `--repeats` times each (the issue's "plant a set
into a small model's pretraining"). `--planted` more reviews, never in either corpus and chosen
by the same length filter, are the control: in-domain and length-matched, as the probe requires.
Both models are then probed (`dpsynth.evaluate.contamination.run_probe`) with the planted set as
D; the script prints each model's verbatim counts, Fisher p, AUROC, Mann-Whitney p and verdicts.
Expected: the seen model is "evidence the model has seen D" by both tests, the clean one "no
evidence" except by chance: `--null-splits` more pairs of unseen review sets probe the clean
model, whose "evidence" verdicts should be about `significance` of them (each test's false
positive rate; docs/measured.md has a run). CPU: a few minutes per model; a rerun with the same
`--work` reuses the models and probes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])


def build_corpus(directory: str, tok, docs: list[tuple[str, str]]) -> str:
    """A one-shard token corpus (`dpsynth.data.token_shards`) of `(id, text)` documents."""
    from dpsynth.data import token_shards

    tokens = tok.encode_batch([t for _, t in docs])
    entry = token_shards.write_shard(directory, token_shards.shard_name(0), tokens, [{"id": i} for i, _ in docs],
                                     tok.vocab_size)
    token_shards.write_manifest(directory, name=os.path.basename(directory), shards=[entry],
                                vocab_size=tok.vocab_size, tokenizer_sha256=tok.sha256)
    return directory


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default=None, help="working directory (created; corpora, models, probes; a rerun "
                                                 "reuses its models; default: a new temporary directory)")
    p.add_argument("--planted", type=int, default=32, help="records planted (and as many control records)")
    p.add_argument("--repeats", type=int, default=16, help="copies of each planted record in the seen corpus")
    p.add_argument("--background", type=int, default=300, help="other reviews in both corpora")
    p.add_argument("--austen", type=int, default=300, help="Austen paragraphs in both corpora")
    p.add_argument("--steps", type=int, default=600, help="pretraining steps per model")
    p.add_argument("--prefix-tokens", type=int, default=16)
    p.add_argument("--match-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--null-splits", type=int, default=20,
                   help="the tests' false positives: probe the clean model with this many pairs of random sets of "
                        "unseen reviews (neither planted nor control) and count the 'evidence' verdicts (0 = off)")
    args = p.parse_args(argv)

    from dpsynth.data.embedded import austen_documents, fine_food_splits
    from dpsynth.data.tokenizer_training import train_tokenizer
    from dpsynth.evaluate import contamination
    from dpsynth.train import pretrain

    if args.work is None:
        import tempfile

        args.work = tempfile.mkdtemp(prefix="dpsynth-probe-bench-")
    os.makedirs(args.work, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    paragraphs = [q.strip() for d in austen_documents() for q in d["text"].split("\n\n") if len(q.strip()) >= 200]
    austen = [paragraphs[i] for i in rng.choice(len(paragraphs), args.austen, replace=False)]
    reviews = [r["text"] for r in fine_food_splits()["train"]]
    order = rng.permutation(len(reviews))
    background = [reviews[i] for i in order[: args.background]]
    tok = train_tokenizer(austen + background, vocab_size=2000)
    tok_path = os.path.join(args.work, "tok.model")
    tok.save(tok_path)
    need = args.prefix_tokens + args.match_tokens
    long_enough = [reviews[i] for i in order[args.background:] if need + 8 <= len(tok.encode(reviews[i])) <= 120]
    planted, control = long_enough[: args.planted], long_enough[args.planted : 2 * args.planted]
    public = [(f"austen/{i}", t) for i, t in enumerate(austen)] + [(f"reviews/{i}", t) for i, t in enumerate(background)]
    seen_docs = public + [(f"planted/{i}/{k}", t) for i, t in enumerate(planted) for k in range(args.repeats)]
    cfg = pretrain.PretrainConfig(preset="tiny", seq_len=128, batch_size=16, steps=args.steps,
                                  eval_every=args.steps, checkpoint_every=args.steps, log_every=100, eval_batches=2,
                                  tensorboard=False, progress_interval=60.0, seed=args.seed)
    probe_cfg = contamination.ProbeConfig(records=args.planted, prefix_tokens=args.prefix_tokens,
                                          match_tokens=args.match_tokens, seed=args.seed)
    rows = {}
    for name, docs in (("seen", seen_docs), ("clean", public)):
        corpus = build_corpus(os.path.join(args.work, f"corpus_{name}"), tok, docs)
        model = os.path.join(args.work, f"model_{name}")
        t0 = time.time()
        if not os.path.exists(os.path.join(model, "manifest.json")):
            pretrain.run_pretrain(corpus, tok_path, model, cfg)
        trained = time.time() - t0
        probe_dir = os.path.join(args.work, f"probe_{name}")
        if os.path.exists(os.path.join(probe_dir, contamination.REPORT_JSON)):
            rep = contamination.read_probe(probe_dir)
        else:
            rep = contamination.run_probe(model, [{"text": t} for t in planted], [{"text": t} for t in control],
                                          probe_dir, probe_cfg)
        v, lk = rep["verbatim"], rep["likelihood"]
        rows[name] = {"tokens_in_corpus": int(sum(len(t) for t in tok.encode_batch([t for _, t in docs]))),
                      "pretrain_seconds": round(trained, 1),
                      "exact": f"{v['data']['exact']}/{v['data']['tested']} vs {v['control']['exact']}/"
                               f"{v['control']['tested']}",
                      "fisher_p": v["p_value"], "verbatim_verdict": v["verdict"], "auroc": lk["auroc"],
                      "mann_whitney_p": lk["p_value"], "likelihood_verdict": lk["verdict"],
                      "mean_loglik": [lk["data"]["mean"], lk["control"]["mean"]]}
        print(json.dumps({"model": name, **rows[name]}), flush=True)
    if args.null_splits:  # two sets the clean model has not seen: each test should say "evidence" ~ significance of the time
        from dpsynth.models.directory import load_model

        clean = os.path.join(args.work, "model_clean")
        loaded, pool = load_model(clean), long_enough[2 * args.planted :]
        found = {"verbatim": 0, "likelihood": 0}
        for k in range(args.null_splits):
            pick = np.random.default_rng([args.seed, 1000 + k]).choice(len(pool), 2 * args.planted, replace=False)
            sets = [[{"text": pool[i]} for i in pick[j * args.planted : (j + 1) * args.planted]] for j in (0, 1)]
            figures = contamination.probe_model(clean, sets[0], sets[1], probe_cfg, loaded=loaded)
            for test in found:
                found[test] += figures[test]["verdict"] == contamination.SEEN
        print(json.dumps({"model": "clean", "null_splits": args.null_splits, "pool": len(pool),
                          "evidence_verbatim": found["verbatim"], "evidence_likelihood": found["likelihood"],
                          "significance": probe_cfg.significance}), flush=True)
    for name in ("seen", "clean"):
        print(f"{name} model: verbatim {rows[name]['verbatim_verdict']!r} (Fisher p {rows[name]['fisher_p']:.3g}), "
              f"likelihood {rows[name]['likelihood_verdict']!r} (Mann-Whitney p {rows[name]['mann_whitney_p']:.3g}, "
              f"AUROC {rows[name]['auroc']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

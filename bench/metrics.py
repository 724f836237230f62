"""Benchmark: our MAUVE and n-gram frontier metrics against the reference `mauve-text`.

Same features / same histograms in the same run; prints examples/s of each, the speed ratio
(ours / reference) and the agreement (absolute differences of MAUVE, MAUVE*, frontier
integral).

- MAUVE: `dpsynth.evaluate.mauve.compute_mauve` (faiss k-means, as the reference, and the
  scikit-learn fallback) vs `mauve.compute_mauve(p_features=..., q_features=...)`.
- n-grams: `dpsynth.evaluate.divergence.compare_counts` (vectorised curve, area, frontier
  integral, with and without Krichevsky-Trofimov smoothing) vs the reference's
  `get_divergence_curve_for_multinomials` + sklearn `auc` + `get_fronter_integral` on the same
  unigram/bigram histograms.

Text: the Yelp polarity test set from ../shared/data when present (`--texts N` reviews split in
two halves), else toy reviews. Features: hashing embeddings of those texts (`--dim`).

    .venv/bin/python bench/metrics.py [--n 2000] [--dim 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import csv
import importlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dpsynth.evaluate import divergence, embed, mauve, ngrams  # noqa: E402

SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data", "yelp",
                      "test_polarity.csv")


def load_texts(n: int) -> tuple[list[str], str]:
    if os.path.exists(SHARED):
        with open(SHARED, newline="", encoding="utf-8") as f:
            rows = [r["text"] for r in csv.DictReader(f) if r.get("text", "").strip()]
        if len(rows) >= n:
            return rows[:n], f"yelp test_polarity ({n} reviews)"
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(3000)]
    zipf = 1 / np.arange(1, 3001)
    zipf /= zipf.sum()
    return [" ".join(rng.choice(vocab, size=int(rng.integers(5, 80)), p=zipf)) for _ in range(n)], f"toy zipf text ({n})"


def timed(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def ref_frontier(p_counts, q_counts):
    ref = importlib.import_module("mauve.compute_mauve")
    from sklearn.metrics import auc

    out = {}
    for name, (p, q) in {"": (p_counts / p_counts.sum(), q_counts / q_counts.sum()),
                         "_star": ((p_counts + 0.5) / (p_counts + 0.5).sum(), (q_counts + 0.5) / (q_counts + 0.5).sum())}.items():
        c = ref.get_divergence_curve_for_multinomials(p, q, np.linspace(1e-6, 1 - 1e-6, 25), 5)
        x, y = c.T
        i, j = np.argsort(x), np.argsort(y)
        out["mauve" + name] = 0.5 * (auc(x[i], y[i]) + auc(y[j], x[j]))
        out["frontier_integral" + name] = ref.get_fronter_integral(p, q)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="texts in total (half P, half Q)")
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    import mauve as mauve_text

    texts, source = load_texts(args.n)
    half = len(texts) // 2
    p_texts, q_texts = texts[:half], texts[half:]
    t_embed, feats = timed(lambda: embed.HashingEmbedder(args.dim).embed(texts), 1)
    p, q = feats[:half], feats[half:]
    print(f"data: {source}; hashing features dim {args.dim} ({len(texts) / t_embed:.0f} texts/s to embed)")

    print("\n== MAUVE on the same features (P = first half, Q = second half)")
    t_ref, ref = timed(lambda: mauve_text.compute_mauve(p_features=p, q_features=q), args.repeats)
    print(f"mauve-text            : {len(texts) / t_ref:9.0f} examples/s  mauve={ref.mauve:.6f} mauve*={ref.mauve_star:.6f}")
    for backend in ("faiss", "sklearn"):
        cfg = mauve.MauveConfig(backend=backend)
        t_ours, ours = timed(lambda: mauve.compute_mauve(p, q, cfg), args.repeats)
        print(f"dpsynth ({backend:7s})     : {len(texts) / t_ours:9.0f} examples/s  mauve={ours.mauve:.6f} "
              f"mauve*={ours.mauve_star:.6f}  speed ratio ours/ref = {t_ref / t_ours:.2f}x  "
              f"|d mauve| = {abs(ours.mauve - ref.mauve):.2e}  |d mauve*| = {abs(ours.mauve_star - ref.mauve_star):.2e}")

    print("\n== n-gram frontiers on the same histograms")
    for kind, n in (("unigram", 1), ("bigram", 2)):
        pc, qc, keys = ngrams.aligned(ngrams.ngram_counts(p_texts, n), ngrams.ngram_counts(q_texts, n))
        t_ref, r = timed(lambda: ref_frontier(pc, qc), args.repeats)
        t_ours, o = timed(lambda: divergence.compare_counts(pc, qc), args.repeats)
        diff = max(abs(o.scores()[k] - r[k]) for k in r)
        print(f"{kind:8s} ({len(keys):7d} buckets): ours {len(texts) / t_ours:10.0f} examples/s, mauve-text "
              f"{len(texts) / t_ref:10.0f} examples/s, ratio {t_ref / t_ours:6.1f}x, max |diff| {diff:.1e} "
              f"(mauve={o.mauve:.4f} mauve*={o.mauve_star:.4f})")
    t_all, cmp = timed(lambda: ngrams.compare_texts(p_texts, q_texts), 1)
    print(f"end to end (count + unigram/bigram/length frontiers): {len(texts) / t_all:.0f} examples/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""End-to-end dedup throughput (MB/s of public text, tokenization included) vs a naive peer.

Ours: the `dpsynth dedup` Beam job (`dpsynth.beam.jobs.dedup`: tokenize public + sensitive,
build the suffix-array index, cut every >= k-token overlap per public shard, write the clean
corpus and the report) on the local runner.
Peer ("naive n-gram hash"): the same tokenization in-process, then a Python set of the hashes
of every k-gram of every sensitive document, a scan of every public k-gram, the same cut and
the same clean text (kept pieces decoded, joined by newlines), kept in memory (no files).
Both must remove exactly the same tokens (checked). The peer is single-process; ours runs on
any Beam runner (add e.g. `--direct_running_mode=multi_processing --direct_num_workers=2`).

Data: `../shared/data/public` (Austen + KJV) as the public corpus, the labeled sets under
`../shared/data` (AG News test, Yelp polarity dev/test) as sensitive datasets, with
`--num-planted` sensitive texts planted into a copy of the public corpus. Falls back to the
embedded default (`make data`) when `../shared/data` is absent.

    .venv/bin/python bench/dedup.py                      # ~8 MB public, a few minutes on 2 cores
    .venv/bin/python bench/dedup.py --scale 4 --shard-mb 8 --direct_running_mode=multi_processing \
        --direct_num_workers=2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
import warnings

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
SHARED = os.path.join(os.path.dirname(REPO), "shared", "data")

from dpsynth import tokens as tok  # noqa: E402
from dpsynth.beam import jobs  # noqa: E402
from dpsynth.data import readers  # noqa: E402
from dpsynth.data.text import complement_ranges, encode_document  # noqa: E402


def naive_dedup(public_docs, sensitive_docs, tokenizer, k):
    """The peer: (tokens removed, documents touched, seconds per stage)."""
    times = {}
    t = time.monotonic()
    pub = [encode_document(tokenizer, d["text"]) for d in public_docs]
    sens = [encode_document(tokenizer, d["text"]) for d in sensitive_docs]
    times["tokenize"] = time.monotonic() - t
    t = time.monotonic()
    grams = set()
    for s in sens:
        s = s.tolist()
        for i in range(len(s) - k + 1):
            grams.add(hash(tuple(s[i:i + k])))
    times["index"] = time.monotonic() - t
    t = time.monotonic()
    removed = touched = 0
    for d in pub:
        lst = d.tolist()
        covered = np.zeros(len(lst), bool)
        for i in range(len(lst) - k + 1):
            if hash(tuple(lst[i:i + k])) in grams:
                covered[i:i + k] = True
        runs = np.flatnonzero(np.diff(np.concatenate([[0], covered.astype(np.int8), [0]])))
        if covered.any():
            touched += 1
            removed += int(covered.sum())
        pieces = complement_ranges(len(lst), list(zip(runs[::2], runs[1::2])))
        _ = "\n".join(tokenizer.decode(d[a:b]) for a, b in pieces)  # the clean text, as ours writes it
    times["dedup"] = time.monotonic() - t
    return removed, touched, times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--public", nargs="+", default=None, help="default: ../shared/data/public")
    p.add_argument("--sensitive", nargs="+", default=None, help="[NAME=]PATH; default: AG News + Yelp polarity")
    p.add_argument("--min-tokens", type=int, default=50)
    p.add_argument("--num-planted", type=int, default=20)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--scale", type=int, default=1, help="replicate the public corpus N times")
    p.add_argument("--shard-mb", type=float, default=4.0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--workdir", default=None)
    args, beam_args = p.parse_known_args(argv)
    warnings.simplefilter("ignore", UserWarning)

    work = args.workdir or tempfile.mkdtemp(prefix="dpsynth-bench-dedup-")
    if os.path.exists(work):
        shutil.rmtree(work)
    os.makedirs(work)
    if args.public is None and os.path.isdir(SHARED):
        args.public = [os.path.join(SHARED, "public")]
        args.sensitive = args.sensitive or [f"ag_news={SHARED}/ag_news/test.csv",
                                            f"yelp={SHARED}/yelp/dev_polarity.csv"]
    if args.public is None:  # fresh clone: the embedded default
        from dpsynth.data import embedded

        os.makedirs(os.path.join(work, "embedded_public"))
        for d in embedded.austen_documents():
            with open(os.path.join(work, "embedded_public", d["id"] + ".txt"), "w") as f:
                f.write(d["text"])
        splits = embedded.fine_food_splits()
        readers.write_jsonl(os.path.join(work, "embedded_sensitive", "all.jsonl"), [r for s in splits.values() for r in s])
        args.public = [os.path.join(work, "embedded_public")]
        args.sensitive = [f"fine_food={os.path.join(work, 'embedded_sensitive')}"]
        print("bench: ../shared/data absent; using the embedded default")

    public = readers.read_public(args.public).records
    sensitive = {}
    for spec in args.sensitive:
        name, path = jobs.parse_named(spec)
        sensitive[name or os.path.basename(path).split(".")[0]] = readers.read_sensitive(path).records

    # The public copy: the corpus (x scale), plus planted sensitive texts at paragraph boundaries.
    t = time.monotonic()
    tokenizer_path = os.path.join(work, "tok.model")
    tok.train_tokenizer((d["text"] for d in public), vocab_size=args.vocab_size).save(tokenizer_path)
    tokenizer = tok.Tokenizer.load(tokenizer_path)
    t_tokenizer = time.monotonic() - t
    rng = random.Random(0)
    pool = [r for rows in sensitive.values() for r in rows if len(tokenizer.encode(r["text"])) >= args.min_tokens + 10]
    planted = rng.sample(pool, min(args.num_planted, len(pool)))
    docs = []
    for copy in range(args.scale):
        for d in public:
            docs.append({"id": f"c{copy}/{d['id']}", "text": d["text"]})
    for r in planted:
        d = docs[rng.randrange(len(docs))]
        paras = d["text"].split("\n\n")
        paras.insert(rng.randrange(len(paras) + 1), r["text"])
        d["text"] = "\n\n".join(paras)
    pub_dir = os.path.join(work, "public")
    readers.write_jsonl(os.path.join(pub_dir, "public.jsonl"), docs)
    sens_specs = []
    for name, rows in sensitive.items():
        path = os.path.join(work, "sensitive", name + ".jsonl")
        readers.write_jsonl(path, rows)
        sens_specs.append(f"{name}={path}")
    mb = sum(len(d["text"].encode("utf-8")) for d in docs) / 1e6
    n_sens = sum(len(v) for v in sensitive.values())
    print(f"bench: public {mb:.2f} MB ({len(docs)} docs, {args.num_planted} planted), sensitive {n_sens} examples "
          f"in {len(sensitive)} datasets, k={args.min_tokens}; tokenizer trained in {t_tokenizer:.1f}s (not timed)")

    t, c = time.monotonic(), time.process_time()
    report = jobs.dedup([pub_dir], sens_specs, tokenizer_path=tokenizer_path, out_dir=os.path.join(work, "out"),
                        min_tokens=args.min_tokens, shard_bytes=int(args.shard_mb * (1 << 20)),
                        threads=args.threads, beam_args=beam_args)
    ours, ours_cpu = time.monotonic() - t, time.process_time() - c

    all_sens = [r for rows in sensitive.values() for r in rows]
    t, c = time.monotonic(), time.process_time()
    removed, touched, peer_times = naive_dedup(docs, all_sens, tokenizer, args.min_tokens)
    peer, peer_cpu = time.monotonic() - t, time.process_time() - c

    found = sum(r["num_examples_shared"] for r in report["sensitive"])
    ids = {i for r in report["sensitive"] for i in r["shared_example_ids"]}
    planted_found = sum(1 for r in planted if r["id"] in ids)
    agree = removed == report["public"]["tokens_removed"] and touched == report["public"]["documents_touched"]
    print(json.dumps({"public_mb": round(mb, 3), "ours_s": round(ours, 2), "peer_s": round(peer, 2),
                      "ours_cpu_s (this process)": round(ours_cpu, 2), "peer_cpu_s": round(peer_cpu, 2),
                      "peer_stages_s": {k: round(v, 2) for k, v in peer_times.items()},
                      "tokens_removed": report["public"]["tokens_removed"], "peer_tokens_removed": removed,
                      "sensitive_examples_shared": found, "planted_found": f"{planted_found}/{len(planted)}"}))
    print(f"dedup end to end: ours {mb / ours:.2f} MB/s, naive n-gram hash {mb / peer:.2f} MB/s; "
          f"ratio ours/naive = {peer / ours:.2f}x; results agree: {agree}")
    print(f"dedup per CPU second (in-process runner; robust on a loaded machine): ours {mb / ours_cpu:.2f} MB/cpu-s, "
          f"naive {mb / peer_cpu:.2f} MB/cpu-s; ratio ours/naive = {peer_cpu / ours_cpu:.2f}x")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())

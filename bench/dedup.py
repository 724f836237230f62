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

`--scale large`: the realistic size. Public: `../shared/data/public/opinrank` + `enwiki`
(~315 MB of text) plus a small file of public documents with `--num-planted` sensitive texts
planted; sensitive: Yelp polarity dev and test, Yelp sentences, SST-2 (train/dev/test) and
AG News. Each configuration runs in a fresh subprocess (wall time, CPU time of the process
and its worker processes, peak RSS of the process and of its largest worker):

* ours, in-process runner (`--threads` native threads);
* ours, multi-process runner with `--workers` workers (1 native thread each);
* the naive n-gram hash peer (single process, as above);
* tokenization alone, read + encode of the same public files with SentencePiece's own
  batched encoder (`encode(list)`, 4,096 documents per call): in one process with its
  default threads, and in `--workers` processes (the files dealt by size, 1 thread each).
  The faster of the two is the tokenizer-only limit that the job's end-to-end wall time
  and its tokenize stage (until the last token manifest is written) are compared with.

    .venv/bin/python bench/dedup.py --scale large [--tokenizer tok.model]   # ~20 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
SHARED = os.environ.get("DPSYNTH_SHARED_DATA", os.path.join(os.path.dirname(REPO), "shared", "data"))

from dpsynth.beam import jobs  # noqa: E402
from dpsynth.data import dead_letters, readers  # noqa: E402
from dpsynth.data.text import complement_ranges, encode_document  # noqa: E402
from dpsynth.data.tokenizer_training import train_tokenizer  # noqa: E402
from dpsynth.data.tokenizers import Tokenizer  # noqa: E402


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
    p.add_argument("--scale", default="1", help="replicate the public corpus N times, or 'large' (see above)")
    p.add_argument("--tokenizer", default=None, help="--scale large: an existing model (else trained, not timed)")
    p.add_argument("--workers", type=int, default=2, help="--scale large: multi-process runner workers")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--shard-mb", type=float, default=4.0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--workdir", default=None)
    args, beam_args = p.parse_known_args(argv)
    warnings.simplefilter("ignore", UserWarning)
    if args.child:
        return child(args, beam_args)
    if args.scale == "large":
        return large(args)
    args.scale = int(args.scale)

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
    train_tokenizer((d["text"] for d in public), vocab_size=args.vocab_size).save(tokenizer_path)
    tokenizer = Tokenizer.load(tokenizer_path)
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


# ----------------------------------------------------------------------------- --scale large

def _stages(out_dir: str, started: float) -> dict:
    """Seconds per stage of the one-pipeline job, from when its files were written: tokenize
    (until the last token manifest), index (until the sensitive index), dedup (until the report)."""
    private = dead_letters.private_dir(out_dir)  # the sensitive tokens and the index (owner-only state)
    manifests = [os.path.join(root, "manifest.json") for top in (out_dir, private)
                 for root, _, files in os.walk(os.path.join(top, "tokens")) if "manifest.json" in files]
    ends = [max(os.path.getmtime(m) for m in manifests), os.path.getmtime(os.path.join(private, "index")),
            os.path.getmtime(os.path.join(out_dir, "contamination.json"))]
    return {"tokenize": ends[0] - started, "index": ends[1] - ends[0], "dedup": ends[2] - ends[1]}


def _usage(worker_peaks: dict[int, int]) -> dict:
    """CPU seconds of this process and its (waited-for) child processes; peak RSS of this
    process and of its largest Beam worker process (VmHWM, polled: a forked child's ru_maxrss
    starts at its parent's RSS, so RUSAGE_CHILDREN cannot tell a worker's own peak)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
            "peak_rss_mb": me.ru_maxrss / 1024, "peak_child_rss_mb": max(worker_peaks.values(), default=0) / 1024,
            "workers_seen": len(worker_peaks)}


def _watch_descendants(stop: threading.Event, peaks: dict[int, int]) -> None:
    """Records the VmHWM (KiB) of every descendant process of this one until `stop` is set."""
    me = os.getpid()
    while not stop.wait(0.25):
        parent = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as f:
                        parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    pass
        mine, grew = {me}, True
        while grew:
            new = {pid for pid, pp in parent.items() if pp in mine and pid not in mine}
            mine |= new
            grew = bool(new)
        for pid in mine - {me}:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"sdk_worker" not in f.read():  # Beam's worker processes only
                        continue
                with open(f"/proc/{pid}/status") as f:
                    hwm = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))
                peaks[pid] = max(peaks.get(pid, 0), hwm)
            except (OSError, StopIteration, ValueError):
                pass


def child(args, beam_args) -> int:
    """One measured configuration of --scale large, in its own process; prints one JSON line."""
    with open(os.path.join(args.workdir, "inputs.json")) as f:
        inputs = json.load(f)
    t = time.monotonic()
    out: dict = {}
    peaks: dict[int, int] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_descendants, args=(stop, peaks), daemon=True)
    watcher.start()
    if args.child == "ours":
        started = time.time()
        report = jobs.dedup(inputs["public"], inputs["sensitive"], tokenizer_path=inputs["tokenizer"],
                            out_dir=os.path.join(args.workdir, f"out-{os.getpid()}"), min_tokens=args.min_tokens,
                            shard_bytes=int(args.shard_mb * (1 << 20)), threads=args.threads, beam_args=beam_args)
        out.update(tokens_removed=report["public"]["tokens_removed"], tokens=report["public"]["tokens"],
                   documents_touched=report["public"]["documents_touched"],
                   shared_ids=sorted(f"{r['name']}/{i}" for r in report["sensitive"] for i in r["shared_example_ids"]),
                   stages_s=_stages(os.path.join(args.workdir, f"out-{os.getpid()}"), started))
        shutil.rmtree(os.path.join(args.workdir, f"out-{os.getpid()}"), ignore_errors=True)
    elif args.child == "naive":
        tokenizer = Tokenizer.load(inputs["tokenizer"])
        t0 = time.monotonic()
        public = readers.read_public(inputs["public"]).records
        sens = [r for spec in inputs["sensitive"] for r in readers.read_sensitive(jobs.parse_named(spec)[1]).records]
        read_s = time.monotonic() - t0
        removed, touched, times = naive_dedup(public, sens, tokenizer, args.min_tokens)
        out.update(tokens_removed=removed, documents_touched=touched, stages_s={"read": read_s, **times})
    elif args.child == "spm":
        out.update(_spm_encode(inputs["tokenizer"], inputs["public"], -1))
    elif args.child == "spm-procs":  # the files dealt to args.workers processes by size, 1 thread each
        import multiprocessing

        files = sorted(readers.resolve_inputs(inputs["public"]), key=lambda f: -f.size)
        groups: list[list[str]] = [[] for _ in range(args.workers)]
        loads = [0] * args.workers
        for f in files:
            j = loads.index(min(loads))
            groups[j].append(f.path)
            loads[j] += f.size
        with multiprocessing.get_context("fork").Pool(args.workers) as pool:
            parts = pool.starmap(_spm_encode, [(inputs["tokenizer"], g, 1) for g in groups])
        out.update(text_mb=sum(r["text_mb"] for r in parts), tokens=sum(r["tokens"] for r in parts),
                   read_s=max(r["read_s"] for r in parts), encode_s=max(r["encode_s"] for r in parts))
    out.update(wall_s=time.monotonic() - t)
    stop.set()
    watcher.join()
    out.update(_usage(peaks))
    print("RESULT " + json.dumps(out))
    return 0


def _spm_encode(tokenizer: str, paths, num_threads: int) -> dict:
    """SentencePiece's batched encoder (4,096 texts per call) over the public texts of `paths`."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=tokenizer, num_threads=num_threads)
    t0 = time.monotonic()
    texts = [r["text"] for r in readers.read_public(paths).records]
    read_s = time.monotonic() - t0
    t0 = time.monotonic()
    tokens = 0
    for i in range(0, len(texts), 4096):  # batches: the ids of all 70M tokens as Python ints would need GBs
        tokens += sum(len(x) for x in sp.encode(texts[i:i + 4096]))
    return {"text_mb": sum(len(x.encode("utf-8")) for x in texts) / 1e6, "read_s": read_s,
            "encode_s": time.monotonic() - t0, "tokens": tokens}


def _run_child(args, kind: str, extra: list[str]) -> tuple[dict, str]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--workdir", args.workdir,
           "--min-tokens", str(args.min_tokens), "--shard-mb", str(args.shard_mb), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise RuntimeError(f"{kind} failed ({proc.returncode})")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):]), proc.stdout


def _sst_records(path: str, split: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            label, _, text = line.rstrip("\n").partition(" ")
            if text.strip():
                rows.append({"id": f"sst-{split}-{n}", "text": text, "label": label})
    return rows


def large(args) -> int:
    """--scale large: the 315 MB public corpus against five sensitive datasets."""
    if not os.path.isdir(os.path.join(SHARED, "public", "opinrank")):
        print(f"bench: {SHARED}/public/opinrank is absent; --scale large needs ../shared/data (skipped)")
        return 0
    own_workdir = args.workdir is None
    work = args.workdir = args.workdir or tempfile.mkdtemp(prefix="dpsynth-bench-dedup-large-")
    os.makedirs(work, exist_ok=True)
    # --public overrides the corpus (a quick check of this script on less text).
    public_dirs = args.public or [os.path.join(SHARED, "public", "opinrank"), os.path.join(SHARED, "public", "enwiki")]
    # Sensitive datasets, as JSONL (SST-2's "<label> <sentence>" lines have no reader of their own).
    sensitive = {
        "yelp_dev": readers.read_sensitive(f"{SHARED}/yelp/dev_polarity.csv").records,
        "yelp_test": readers.read_sensitive(f"{SHARED}/yelp/test_polarity.csv").records,
        "yelp_sentences": readers.read_sensitive(f"{SHARED}/yelp_sentences/yelp_sentences_dev_test.csv").records,
        "sst2": [r for split in ("train", "dev", "test") for r in _sst_records(f"{SHARED}/sst/stsa.binary.{split}", split)],
        "ag_news": readers.read_sensitive(f"{SHARED}/ag_news/test.csv").records,
    }
    specs = []
    for name, rows in sensitive.items():
        path = os.path.join(work, "sensitive", name + ".jsonl")
        readers.write_jsonl(path, rows)
        specs.append(f"{name}={path}")
    tokenizer_path = args.tokenizer
    if tokenizer_path is None:
        t = time.monotonic()
        tokenizer_path = os.path.join(work, "tok.model")
        train_tokenizer(readers.iter_public_texts(public_dirs), vocab_size=args.vocab_size).save(tokenizer_path)
        print(f"bench: tokenizer ({args.vocab_size} pieces, default byte-bounded sample) trained in "
              f"{time.monotonic() - t:.0f}s (not timed)")
    tokenizer = Tokenizer.load(tokenizer_path)
    # Planted: public documents (from the first enwiki file) with sensitive texts inserted.
    rng = random.Random(0)
    pool = [(name, r) for name, rows in sensitive.items() for r in rows if len(r["text"]) > 400]
    pool = [(name, r) for name, r in rng.sample(pool, min(len(pool), 20 * args.num_planted))
            if len(tokenizer.encode(r["text"])) >= args.min_tokens + 10][: args.num_planted]
    first_wiki = sorted(f.path for f in readers.resolve_inputs(public_dirs[-1]))[0]
    hosts = readers.read_public(first_wiki).records
    planted = []
    for i, (_, r) in enumerate(pool):
        paras = rng.choice(hosts)["text"].split("\n\n")
        paras.insert(rng.randrange(len(paras) + 1), r["text"])
        planted.append({"id": f"planted-{i}", "text": "\n\n".join(paras)})
    planted_path = os.path.join(work, "planted", "planted.jsonl")
    readers.write_jsonl(planted_path, planted)
    inputs = {"public": public_dirs + [planted_path], "sensitive": specs, "tokenizer": tokenizer_path}
    with open(os.path.join(work, "inputs.json"), "w") as f:
        json.dump(inputs, f)
    n_sens = sum(len(v) for v in sensitive.values())
    print(f"bench --scale large: public {', '.join(public_dirs)} + {len(planted)} planted documents; "
          f"sensitive {n_sens} examples in {len(sensitive)} datasets; k={args.min_tokens}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)

    runs = {}
    for label, kind, extra in [
        ("ours, in-process runner", "ours", ["--threads", str(args.threads)]),
        (f"ours, multi-process runner ({args.workers} workers)", "ours",
         ["--threads", "1", "--direct_running_mode=multi_processing", f"--direct_num_workers={args.workers}"]),
        ("naive n-gram hash (1 process)", "naive", []),
        ("SentencePiece batched encode (1 process)", "spm", []),
        (f"SentencePiece batched encode ({args.workers} processes)", "spm-procs", ["--workers", str(args.workers)]),
    ]:
        result, _ = _run_child(args, kind, extra)
        runs[label] = result
        print(f"  {label}: " + json.dumps({k: v for k, v in result.items() if k != "shared_ids"}), flush=True)

    ours1, ours2 = runs["ours, in-process runner"], runs[f"ours, multi-process runner ({args.workers} workers)"]
    naive, sp = runs["naive n-gram hash (1 process)"], runs["SentencePiece batched encode (1 process)"]
    text_mb = sp["text_mb"]  # the public text, decompressed, as read
    tokens = ours1["tokens"]
    agree = (ours1["tokens_removed"] == ours2["tokens_removed"] == naive["tokens_removed"]
             and ours1["documents_touched"] == ours2["documents_touched"] == naive["documents_touched"])
    found = sum(1 for name, r in pool if f"{name}/{r['id']}" in set(ours1["shared_ids"]))
    print(f"public text {text_mb:.1f} MB ({tokens / 1e6:.1f}M tokens); planted found {found}/{len(planted)}; "
          f"tokens removed {ours1['tokens_removed']}; results agree (ours x2, naive): {agree}")
    print(f"{'configuration':44s} {'wall s':>8s} {'CPU s':>8s} {'MB/s':>7s} {'MB/CPU-s':>9s} {'peak RSS MB':>12s} {'largest worker MB':>18s}")
    for label, r in runs.items():
        print(f"{label:44s} {r['wall_s']:8.1f} {r['cpu_s']:8.1f} {text_mb / r['wall_s']:7.2f} {text_mb / r['cpu_s']:9.2f} "
              f"{r['peak_rss_mb']:12.0f} {r['peak_child_rss_mb']:18.0f}")
    print(f"ratio naive wall / ours in-process wall : {naive['wall_s'] / ours1['wall_s']:.2f}x")
    print(f"ratio naive wall / ours {args.workers} workers wall   : {naive['wall_s'] / ours2['wall_s']:.2f}x  (target >= 2x)")
    print(f"ratio naive CPU / ours {args.workers} workers CPU     : {naive['cpu_s'] / ours2['cpu_s']:.2f}x")
    print(f"ours {args.workers} workers end to end: {text_mb / ours2['wall_s']:.2f} MB/s (target >= 5 MB/s on 2 cores)")
    worker_mb = max(ours2["peak_child_rss_mb"], 1e-9)
    print(f"peak memory per worker: {worker_mb:.0f} MB = {worker_mb * 2**20 / tokens:.1f} B per public token of the "
          f"corpus; in-process: {ours1['peak_rss_mb'] * 2**20 / tokens:.1f} B/token")
    sp_n = runs[f"SentencePiece batched encode ({args.workers} processes)"]
    limit = min(sp["wall_s"], sp_n["wall_s"])  # the tokenizer-only limit: the faster SentencePiece peer
    print(f"tokenizer-only limit: {text_mb / limit:.2f} MB/s (SentencePiece read + encode: 1 process "
          f"{text_mb / sp['wall_s']:.2f} MB/s, {args.workers} processes {text_mb / sp_n['wall_s']:.2f} MB/s); "
          f"ours {args.workers} workers end to end / limit = {limit / ours2['wall_s']:.2f}x  (target >= 0.6x)")
    t1 = ours1.get("stages_s", {}).get("tokenize")
    t2 = ours2.get("stages_s", {}).get("tokenize")
    if t1 and t2:
        print(f"tokenize stage (public + sensitive; until the last token manifest): in-process {text_mb / t1:.2f} "
              f"MB/s, {args.workers} workers {text_mb / t2:.2f} MB/s; ratio {args.workers} workers / limit = "
              f"{limit / t2:.2f}x; stages (s) in-process {ours1['stages_s']}, {args.workers} workers {ours2['stages_s']}")
    if own_workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())

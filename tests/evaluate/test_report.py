import dataclasses
import json
import math
import os
import shutil
import subprocess
import tempfile

import pytest

from dpsynth.evaluate import classifiers, mauve, report, scoring, tables, verdict
from dpsynth.evaluate import train_classifier as tc
from dpsynth.evaluate import trainer as tr
from tests.evaluate.conftest import make_records

SMALL_CNN = classifiers.WordCNNConfig(vocab_words=300, embed_dim=16, filters=16, hidden=16, max_len=16)


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def _corpus(root, name, train, valid, privacy=None):
    d = os.path.join(root, name)
    os.makedirs(d)
    _write_jsonl(os.path.join(d, "train.jsonl"), train)
    _write_jsonl(os.path.join(d, "valid.jsonl"), valid)
    if privacy is not None:
        with open(os.path.join(d, "privacy_report.json"), "w") as f:
            json.dump(privacy, f)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"sampler": {"temperature": 1.0, "top_k": None}}, f)
    return d


def _privacy(eps, mode, target=None):
    return {"private": True, "epsilon": {"rdp": eps, "pld": eps * 0.9}, "accountant": "rdp", "delta": 1e-4,
            **({"target_epsilon": target} if target is not None else {}),
            "training": {"mode": mode, "noise_multiplier": 1.1, "steps": 100, "clip_norm": 1.0},
            "contamination_sha256": "ab" * 32, "side_channels": [{"name": "label distribution"}]}


@pytest.fixture(scope="module")
def evaluated():
    root = tempfile.mkdtemp()
    real = {s: make_records(n, seed, prefix=f"{s}-") for s, n, seed in (("train", 200, 1), ("valid", 60, 2), ("test", 200, 3))}
    for s, rows in real.items():
        _write_jsonl(os.path.join(root, f"real_{s}.jsonl"), rows)
    bad = make_records(80, 9)
    for r in bad[:40]:
        r["label"] = "neutral"
    dirs = [
        _corpus(root, "lora_eps3", make_records(200, 4), make_records(60, 5), _privacy(2.9995, "lora", target=3.0)),
        _corpus(root, "lora_eps1", make_records(200, 6, signal=1) + [{"text": "", "label": "great"}], make_records(60, 7), _privacy(1.0, "lora")),
        _corpus(root, "nonprivate", make_records(200, 8), make_records(60, 10)),
        _corpus(root, "badlabels", bad, make_records(30, 11), _privacy(8.0, "prompt")),
    ]
    cfg = scoring.EvaluateConfig(
        wordcnn=SMALL_CNN, mauve=mauve.MauveConfig(kmeans_num_redo=1, max_buckets=10), mauve_seeds=(0, 1),
        sweep=tc.SweepConfig(learning_rates=(3e-3, 1e-2), weight_decays=(1e-4,), clip_norms=(1.0,), repeats=1,
                             train=tr.TrainConfig(max_epochs=3, patience=1)),
        dp_epsilons=(3.0,), dp_expected_batch_size=50, dp_epochs=2, embedder="hashing:128", length_bins=10)
    data = scoring.load_real(*(os.path.join(root, f"real_{s}.jsonl") for s in ("train", "test", "valid")))
    out = report.evaluate(dirs, data, os.path.join(root, "out"), cfg)
    yield root, out
    shutil.rmtree(root, ignore_errors=True)


def test_table_rows_metrics_and_marks(evaluated):
    root, out = evaluated
    rows = {r["corpus"]: r for r in out["rows"]}
    assert rows["badlabels"]["status"] == "error" and "label sets differ" in rows["badlabels"]["error"]
    assert "mauve" not in rows["badlabels"]  # never a silent metric
    assert rows["nonprivate"]["private"] is False and math.isinf(rows["nonprivate"]["epsilon"])
    assert rows["lora_eps3"]["private"] is True and rows["lora_eps3"]["epsilon"] == 2.9995
    assert rows["lora_eps3"]["target_epsilon"] == 3.0
    assert rows["lora_eps1"]["invalid_rows"] == 1
    for name in ("lora_eps3", "lora_eps1", "nonprivate"):
        r = rows[name]
        assert r["status"] == "ok", r.get("error")
        assert 0 < r["mauve"] <= 1 and r["mauve_runs"] == 2 and r["mauve_std"] >= 0
        assert 0 < r["bigram_mauve"] <= 1 and 0 <= r["wordcnn_accuracy"] <= 1
        assert 0 < r["distinct_2"] <= 1 and 0 <= r["duplicate_rate"] < 1
        assert r["wordcnn_trials"] == 2 and "wordcnn_rank_spearman" in r and "wordcnn_rank_upper_rbo" in r
        assert r["perplexity"] is None and r["perplexity_note"] == "generator not available"
    kinds = {(b["baseline"], b["epsilon"]) for b in out["baselines"]}
    assert kinds == {("real", float("inf")), ("dp_on_real", 3.0)}
    assert out["baselines"][0]["accuracy"] > 0.7  # the toy task is learnable from real data
    with open(out["paths"]["metrics_json"]) as f:
        saved = json.load(f)
    assert len(saved["corpora"]) == 4 and saved["corpora"][3]["epsilon"] == "inf"
    # The DP-on-real row carries its accounting and side channels; its privacy report sits beside metrics.json.
    (dp_row,) = [b for b in saved["baselines"] if b["baseline"] == "dp_on_real"]
    assert dp_row["sweep_accounting"] == "composed" and dp_row["trials_accounted"] == 2  # 2 lr x 1 clip x 1 repeat
    assert 0 < dp_row["epsilon_spent"]["rdp"] <= 3.0 * (1 + 1e-6) and dp_row["delta"] == 1 / 200
    assert dp_row["vocabulary"] == "hashing"  # no model_dir: hashed words, nothing read from real train
    assert {"validation-based selection", "label set", "dataset sizes"} <= {c["name"] for c in dp_row["side_channels"]}
    report_path = os.path.join(root, "out", dp_row["privacy_report"])
    assert dp_row["privacy_report"] == "baselines/dp_on_real-wordcnn-eps3/privacy_report.json"
    with open(report_path) as f:
        rep = json.load(f)
    assert rep["epsilon"] == dp_row["epsilon_spent"] and rep["side_channels"] == dp_row["side_channels"]
    assert os.path.exists(report_path.replace(".json", ".md"))
    with open(out["paths"]["metrics_csv"]) as f:
        assert len(f.read().strip().splitlines()) == 5


def test_balanced_accuracy_and_macro_f1_beside_accuracy_everywhere(evaluated):
    import csv

    root, out = evaluated
    with open(out["paths"]["metrics_json"]) as f:
        saved = json.load(f)
    scored = [r for r in saved["corpora"] if r["status"] == "ok"]
    assert len(scored) == 3
    for r in scored:
        for m in ("balanced_accuracy", "macro_f1"):
            assert 0 <= r[f"wordcnn_{m}"] <= 1 and r[f"wordcnn_{m}_std"] >= 0
            assert 0 <= r[f"wordcnn_rank_top_{m}_mean"] <= 1 and f"wordcnn_rank_upper_top_{m}_mean" in r
    for b in saved["baselines"]:
        assert 0 <= b["balanced_accuracy"] <= 1 and 0 <= b["macro_f1"] <= 1
        assert b["balanced_accuracy_std"] == 0 and b["macro_f1_std"] == 0  # 1 repeat
    real = next(b for b in saved["baselines"] if b["baseline"] == "real")
    assert real["balanced_accuracy"] > 0.7 and real["macro_f1"] > 0.7  # learnable, and not by one class
    # The majority-class predictor of the real test set: balanced accuracy 1/2 on two classes.
    labels = [json.loads(l)["label"] for l in open(os.path.join(root, "real_test.jsonl"))]
    top = max(sorted(set(labels)), key=labels.count)
    assert saved["majority"] == pytest.approx({"label": top, "num_classes": 2, "n_test": 200,
                                               "accuracy": labels.count(top) / 200, "balanced_accuracy": 0.5,
                                               "macro_f1": labels.count(top) / 200 / (1 + labels.count(top) / 200)})
    assert out["majority"] == saved["majority"]
    # One verdict per corpus (one classifier): lora_eps3 meets DP-on-real at 3, the others have no baseline.
    verdicts = {v["corpus"]: v for v in saved["verdicts"]}
    assert set(verdicts) == {"badlabels", "lora_eps1", "lora_eps3", "nonprivate"}
    assert verdicts["badlabels"]["status"] == "not_scored"
    assert verdicts["lora_eps1"]["status"] == "no_dp_on_real" and verdicts["nonprivate"]["status"] == "no_dp_on_real"
    v3 = verdicts["lora_eps3"]
    (dp,) = [b for b in saved["baselines"] if b["baseline"] == "dp_on_real"]
    assert v3["dp_on_real_accuracy"] == dp["accuracy"] and v3["dp_on_real_balanced_accuracy"] == dp["balanced_accuracy"]
    rows = {r["corpus"]: r for r in saved["corpora"]}
    beats = (rows["lora_eps3"]["wordcnn_accuracy"] > dp["accuracy"]
             and rows["lora_eps3"]["wordcnn_balanced_accuracy"] > dp["balanced_accuracy"])
    assert v3["beats_dp_on_real"] is beats and v3["line"].startswith("lora_eps3: eps 3, lora, wordcnn: synthetic ")
    # metrics.csv carries the same columns and values.
    with open(out["paths"]["metrics_csv"]) as f:
        csv_rows = {r["corpus"]: r for r in csv.DictReader(f)}
    for name, r in rows.items():
        for m in ("wordcnn_balanced_accuracy", "wordcnn_macro_f1", "wordcnn_macro_f1_std"):
            assert (float(csv_rows[name][m]) == r[m]) if m in r else csv_rows[name][m] == ""
    # The HTML report: the verdict section first, then the metrics table with the new columns.
    html = open(out["paths"]["report_html"]).read()
    assert html.index("id='verdict'") < html.index("<h2>Metrics</h2>")
    for v in saved["verdicts"]:
        assert v["line"].replace("'", "&#x27;") in html
    assert "<th>wordcnn_balanced_accuracy</th>" in html and "<th>wordcnn_macro_f1</th>" in html
    assert "<th>balanced accuracy</th><th>macro-F1</th>" in html and f"majority class &#x27;{top}&#x27;" in html
    # The plain summary that `dpsynth evaluate` and `make demo` print ends with the verdicts.
    text = tables.report_summary(os.path.join(root, "out"), labels)
    assert text.splitlines()[-4:] == [f"  {v['line']}" for v in saved["verdicts"]]
    assert f"majority class '{top}': {labels.count(top) / 200:.3f} (balanced accuracy 0.500 = 1/2 classes" in text
    table = tables.summary_table(out, ["wordcnn"])
    assert "bal.acc" in table and "mac.F1" in table and f"majority class '{top}'" in table


def test_every_plot_is_a_valid_png(evaluated):
    import matplotlib.image as mpimg

    _, out = evaluated
    plots = out["paths"]["plots"]
    assert len(plots) == 1 + 3 + 1 + 1  # accuracy, 3 length histograms, bigram frontiers, ranking scatter
    for p in plots:
        img = mpimg.imread(p, format="png")
        assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50
    html = open(out["paths"]["report_html"]).read()
    assert html.count("<img class='plot'") == len(plots) and "NON-PRIVATE" in html and "label sets differ" in html
    assert "validation-based selection" in html and "baselines/dp_on_real-wordcnn-eps3/privacy_report.json" in html


def test_nominal_epsilon_and_synthetic_examples_only(evaluated):
    root, out = evaluated
    rows = {r["corpus"]: r for r in out["rows"]}
    assert rows["lora_eps3"]["epsilon"] == pytest.approx(2.9995) and verdict.nominal_epsilon(rows["lora_eps3"]) == 3.0
    assert verdict.nominal_epsilon(rows["lora_eps1"]) == 1.0 and verdict.nominal_epsilon(rows["nonprivate"]) == math.inf
    html = open(out["paths"]["report_html"]).read()
    assert "Synthetic examples" in html
    synth = [json.loads(l)["text"] for l in open(os.path.join(root, "lora_eps3", "train.jsonl"))]
    assert synth[0] in html
    real = [json.loads(l)["text"] for s in ("train", "valid", "test") for l in open(os.path.join(root, f"real_{s}.jsonl"))]
    every_synthetic = {json.loads(l)["text"] for d in ("lora_eps3", "lora_eps1", "nonprivate", "badlabels")
                       for l in open(os.path.join(root, d, "train.jsonl"))}
    assert not [t for t in real if t not in every_synthetic and t in html]  # never real text


def _chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.mark.skipif(_chromium() is None, reason="Debian chromium not installed (make chromium)")
def test_report_plots_load_in_headless_chromium(evaluated):
    _, out = evaluated
    with tempfile.TemporaryDirectory() as profile:
        cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", "--allow-file-access-from-files", "--virtual-time-budget=5000",
               "--dump-dom", "file://" + os.path.abspath(out["paths"]["report_html"])]
        dom = subprocess.run(cmd, capture_output=True, text=True, timeout=90).stdout
    n = len(out["paths"]["plots"])
    assert f'data-plots-total="{n}"' in dom and f'data-plots-loaded="{n}"' in dom
    assert dom.count('data-loaded="1"') == n
    # The rendered page shows a verdict per corpus before the metrics table, and the new columns.
    with open(out["paths"]["metrics_json"]) as f:
        saved = json.load(f)
    assert dom.index('id="verdict"') < dom.index("<h2>Metrics</h2>")
    assert dom.count('class="verdict ') == len(saved["verdicts"]) == 4
    lora3 = next(v for v in saved["verdicts"] if v["corpus"] == "lora_eps3")
    assert f'data-verdict="{lora3["status"]}">{lora3["line"]}</li>' in dom
    assert "DP-on-real" in lora3["line"] and "no DP-on-real baseline at eps 1" in dom
    assert "<th>wordcnn_balanced_accuracy</th>" in dom and "<th>wordcnn_macro_f1</th>" in dom
    assert "<th>balanced accuracy</th><th>macro-F1</th>" in dom and 'class="majority"' in dom


def test_a_copy_of_a_scored_corpus_takes_its_scores_and_keeps_its_own_card(tmp_path, monkeypatch):
    """A DP selection's output is a copy of its winner with another privacy report: the scorer
    reuses the winner's scores (a function of the records and the generator) and trains nothing
    again; the copy's card (epsilon) is its own. Other records are scored anew."""
    root = str(tmp_path)
    real = scoring.RealData(train=make_records(100, 1), test=make_records(100, 3), valid=make_records(40, 2))
    train, valid = make_records(120, 4), make_records(40, 5)
    first = _corpus(root, "winner", train, valid, _privacy(2.9995, "lora", target=3.0))
    copy = _corpus(root, "selected", train, valid, _privacy(3.002, "lora", target=3.0))
    other = _corpus(root, "other", make_records(120, 6), valid, _privacy(2.9995, "lora", target=3.0))
    cfg = scoring.EvaluateConfig(
        wordcnn=SMALL_CNN, mauve=mauve.MauveConfig(kmeans_num_redo=1, max_buckets=10), mauve_seeds=(0,),
        sweep=tc.SweepConfig(learning_rates=(1e-2,), weight_decays=(1e-4,), clip_norms=(1.0,), repeats=1,
                             train=tr.TrainConfig(max_epochs=1, patience=1)),
        embedder="hashing:64", length_bins=5)
    calls = []
    classify = tc.classify
    monkeypatch.setattr(tc, "classify", lambda *a, **k: calls.append(1) or classify(*a, **k))
    scorer = scoring.Scorer(real, cfg, reuse_identical=True)  # as `report.evaluate` makes it
    (a, pa), (b, pb), (c, _) = (scorer.score_corpus(d) for d in (first, copy, other))
    assert len(calls) == 2  # the winner and the other corpus; not the copy
    assert a["status"] == b["status"] == "ok" and b["scores_of"] == "winner" and "scores_of" not in a
    assert (a["epsilon"], b["epsilon"]) == (2.9995, 3.002)
    scored = [k for k in a if k.startswith(("wordcnn_", "mauve", "bigram", "distinct_"))]
    assert scored and all(b[k] == a[k] for k in scored) and pb["trials"] == pa["trials"]
    assert pb["card"]["epsilon"] == 3.002 and c.get("scores_of") is None
    fresh = scoring.Scorer(real, cfg)  # the default (the Beam job's workers): every corpus scored
    assert "scores_of" not in fresh.score_corpus(copy)[0] and len(calls) == 3
    # the whole report (tables, plots, HTML) with the copy in it
    out = report.evaluate([first, copy], real, str(tmp_path / "out"), dataclasses.replace(cfg, real_baseline=False))
    assert [r.get("scores_of") for r in out["rows"]] == [None, "winner"] and len(calls) == 4
    with open(out["paths"]["metrics_csv"]) as f:
        header, *lines = f.read().strip().splitlines()
    assert "scores_of" in header.split(",") and len(lines) == 2
    assert os.path.getsize(out["paths"]["report_html"]) > 0

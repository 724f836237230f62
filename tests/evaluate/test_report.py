import json
import math
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

from dpsynth.evaluate import classifiers, mauve, report
from dpsynth.evaluate import train_classifier as tc
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
    cfg = report.EvaluateConfig(
        wordcnn=SMALL_CNN, mauve=mauve.MauveConfig(kmeans_num_redo=1, max_buckets=10), mauve_seeds=(0, 1),
        sweep=tc.SweepConfig(learning_rates=(3e-3, 1e-2), weight_decays=(1e-4,), clip_norms=(1.0,), repeats=1,
                             train=tc.TrainConfig(max_epochs=3, patience=1)),
        dp_epsilons=(3.0,), dp_expected_batch_size=50, dp_epochs=2, embedder="hashing:128", length_bins=10)
    data = report.load_real(*(os.path.join(root, f"real_{s}.jsonl") for s in ("train", "test", "valid")))
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


def test_nominal_epsilon_axis_clipped_lengths_and_synthetic_examples_only(evaluated):
    root, out = evaluated
    rows = {r["corpus"]: r for r in out["rows"]}
    assert rows["lora_eps3"]["epsilon"] == pytest.approx(2.9995) and report.nominal_epsilon(rows["lora_eps3"]) == 3.0
    assert report.nominal_epsilon(rows["lora_eps1"]) == 1.0 and report.nominal_epsilon(rows["nonprivate"]) == math.inf
    pos, ticks = report.epsilon_axis([3.0, 1.0, math.inf, 3.0, 10.0])
    assert pos == {1.0: 0, 3.0: 1, 10.0: 2, math.inf: 3} and ticks[:3] == ["1", "3", "10"] and ticks[3].startswith("inf")
    edges, hi = report.clipped_edges(list(range(100)) + [100000], [5, 6], bins=10)
    assert hi < 1000 and len(edges) == 11 and edges[-1] == hi  # one very long text does not set the range
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


def test_plain_summary_says_how_good_the_data_is_in_numbers():
    metrics = {"corpora": [
        {"corpus": "lora-eps3", "status": "ok", "epsilon": 2.9995, "target_epsilon": 3.0, "wordcnn_accuracy": 0.80, "mauve": 0.5},
        {"corpus": "prompt-eps3", "status": "ok", "epsilon": 2.9995, "target_epsilon": 3.0, "wordcnn_accuracy": 0.70},
        {"corpus": "broken", "status": "error", "error": "label sets differ"}],
        "baselines": [{"baseline": "real", "classifier": "wordcnn", "epsilon": "inf", "accuracy": 0.90},
                      {"baseline": "dp_on_real", "classifier": "wordcnn", "epsilon": 3.0, "accuracy": 0.75}]}
    text = report.plain_summary(metrics, ["great"] * 70 + ["other"] * 30)
    assert "majority class 'great': 0.700" in text and "(no privacy): 0.900" in text
    assert "lora-eps3 (epsilon 3): 0.800, +10.0 points vs majority, +5.0 vs DP-on-real (0.750)" in text
    assert "recovers 50% of the real data's gain" in text and "MAUVE 0.500" in text
    assert "carries label signal" in text  # lora
    assert "prompt-eps3 (epsilon 3): 0.700, +0.0 points" in text and "does NOT beat" in text
    assert "broken: not scored (label sets differ)" in text

"""`dpsynth select`: scoring candidate corpora on the real D_valid, the DP choice, its privacy
report (tuning + selection, parallel or sequential), what is written where, the candidate grid."""

import json
import math
import os
import stat

import numpy as np
import pytest

from dpsynth.dp import private_selection as ps
from dpsynth.dp import report as report_lib
from dpsynth.dp.ledger import PrivacyLedger
from dpsynth.evaluate import corpora, dp_select
from tests.evaluate.conftest import make_records

FAST = dp_select.SelectConfig(epsilon=1.0, max_epochs=2, seed=0)


def tuning_report(sigma=1.0, side_channels=()):
    ledger = PrivacyLedger(delta=1e-4, target_epsilon=3.0)
    ledger.record_gaussian(noise_multiplier=sigma, name="stand-in for the tuning")
    return report_lib.build_report(ledger, training={"mode": "lora", "dataset_size": 200}, contamination_sha256=None,
                                   side_channels=[report_lib.LABEL_SET_CHANNEL, *side_channels])


def write_corpus(root, name, train, valid, report):
    d = os.path.join(root, name)
    os.makedirs(d)
    for split, rows in (("train", train), ("valid", valid)):
        with open(os.path.join(d, f"{split}.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    if report is not None:
        report_lib.write_report(d, report)
    return d


@pytest.fixture(scope="module")
def candidates(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cands"))
    rep = tuning_report()
    paths = {
        "signal": write_corpus(root, "signal", make_records(200, 1, signal=3), make_records(40, 2, signal=3), rep),
        "nosignal": write_corpus(root, "nosignal", make_records(200, 3, signal=0), make_records(40, 4, signal=0), rep),
    }
    valid = make_records(120, 5, signal=2, prefix="v")
    return root, paths, valid


def test_scores_are_counts_and_the_informative_corpus_wins_at_large_epsilon(candidates):
    root, paths, valid = candidates
    sel = dp_select.select_corpora(paths, valid, dp_select.SelectConfig(epsilon=50.0, max_epochs=2, seed=0))
    scores = dict(zip(sel.names, sel.scores))
    assert all(0 <= s <= len(valid) and float(s).is_integer() for s in scores.values())  # 1 repeat: an exact count
    assert scores["signal"] > scores["nosignal"]
    assert sel.winner_name == "signal"


def test_report_composes_tuning_and_selection():
    rep = tuning_report()
    reports = [rep, rep]  # the same model: its ledger counted once
    par = dp_select.select(["a", "b"], [10, 12], reports, FAST)
    entries = par.report["ledger"]["entries"]
    assert [e["mechanism"] for e in entries] == ["gaussian", "exponential"]
    assert entries[1]["dataset"] == ps.VALID and entries[1]["candidates"] == 2
    s = par.report["selection"]
    assert s["composition"] == ps.PARALLEL and s["split"] == ps.FILES
    tuning = PrivacyLedger(delta=1e-4, target_epsilon=math.inf, entries=entries[:1]).epsilon("rdp")
    assert s["epsilon_tuning"]["rdp"] == pytest.approx(tuning)
    assert par.report["epsilon"]["rdp"] == pytest.approx(max(tuning, 1.0))  # the parallel guarantee
    assert s["within_tuning_epsilon"] == (1.0 <= tuning)
    # positional split, or a tuning that read D_valid without DP: sequential
    seq = dp_select.select(["a", "b"], [10, 12], reports, dp_select.SelectConfig(epsilon=1.0, split="positional", seed=0))
    assert seq.report["selection"]["composition"] == ps.SEQUENTIAL
    assert seq.report["ledger"]["entries"][-1]["epsilon"] == 2.0  # positional: accounted for two records
    assert seq.report["epsilon"]["rdp"] == pytest.approx(
        PrivacyLedger(delta=1e-4, target_epsilon=math.inf, entries=seq.report["ledger"]["entries"]).epsilon("rdp"))
    assert seq.report["epsilon"]["rdp"] > par.report["epsilon"]["rdp"]
    swept = [tuning_report(side_channels=[{"name": "validation-based selection", "detail": "x"}])] * 2
    assert dp_select.select(["a", "b"], [1, 2], swept, FAST).report["selection"]["composition"] == ps.SEQUENTIAL
    report_lib.check_report(par.report)


def test_distinct_models_all_count_and_nonprivate_is_refused():
    a = tuning_report(1.0)
    entries, delta = dp_select.tuning_entries([a, tuning_report(2.0), a, tuning_report(1.0)])
    assert [e["noise_multiplier"] for e in entries] == [1.0, 2.0, 1.0] and delta == 1e-4  # same settings, two runs
    with pytest.raises(ValueError, match="no privacy report"):
        dp_select.tuning_entries([tuning_report(), None])


def test_the_choice_is_the_mechanisms():
    """`select` draws with `DpSelection.choose` (whose frequencies tests/dp/test_private_selection.py checks)."""
    reports = [tuning_report()] * 3
    for seed in range(5):
        got = dp_select.select(["a", "b", "c"], [10, 11, 12], reports, FAST, rng=np.random.default_rng(seed)).winner
        assert got == ps.DpSelection(epsilon=1.0).choose([10, 11, 12], np.random.default_rng(seed))


def test_write_selection_publishes_the_winner_and_keeps_scores_private(tmp_path):
    rep = tuning_report()
    paths = {n: write_corpus(str(tmp_path), n, make_records(5, i), make_records(2, i + 10), rep)
             for i, n in enumerate(("a", "b"))}
    sel = dp_select.select(["a", "b"], [3.0, 1000.0], [rep, rep], dp_select.SelectConfig(epsilon=30.0, seed=0))
    out = str(tmp_path / "out")
    dp_select.write_selection(out, sel, paths)
    assert sel.winner_name == "b"
    assert open(os.path.join(out, "train.jsonl")).read() == open(os.path.join(paths["b"], "train.jsonl")).read()
    published = json.load(open(os.path.join(out, dp_select.SELECTION_FILE)))
    assert published["selected"] == "b" and published["candidates"] == ["a", "b"]
    text = "".join(open(os.path.join(out, f)).read() for f in os.listdir(out))
    assert "1000" not in text  # the non-DP scores are nowhere in the release
    private = os.path.join(str(tmp_path), "out.private", dp_select.SCORES_FILE)
    assert json.load(open(private))["correct_on_valid"] == [3.0, 1000.0]
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert corpora.read_corpus(out).privacy_report["selection"]["selected"] == "b"


def test_candidate_grid_and_prefixes(tmp_path):
    grid = dp_select.candidate_grid()
    assert len(grid) == 16 and {c.multiple for c in grid} == {1.0, 3.0}
    assert len({c.name for c in grid}) == 16 and len({c.source_name for c in grid}) == 8
    with pytest.raises(ValueError):
        dp_select.candidate_grid(guidances=())
    with pytest.raises(ValueError):
        dp_select.candidate_grid(multiples=(0,))
    assert dp_select.sizes(3, 200, 0.1) == (600, 60) and dp_select.sizes(1, 200, 0.1) == (200, 20)
    src = write_corpus(str(tmp_path), "big", make_records(30, 1), make_records(6, 2), tuning_report())
    dst = dp_select.write_prefix(src, str(tmp_path / "small"), 10, 2)
    small = corpora.read_corpus(dst)
    assert small.train == corpora.read_corpus(src).train[:10] and len(small.valid) == 2
    assert small.privacy_report == corpora.read_corpus(src).privacy_report


def test_cli_on_existing_candidates(candidates, tmp_path, capsys):
    from trainers import select as cli

    root, paths, valid = candidates
    valid_path = str(tmp_path / "valid.jsonl")
    with open(valid_path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in valid)
    out = str(tmp_path / "picked")
    assert cli.main(["--candidates", *paths.values(), "--valid", valid_path, "--out", out, "--epsilon", "2",
                     "--max-epochs", "1", "--seed", "1"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["selected"] in paths and summary["composition"] == ps.PARALLEL
    assert os.path.exists(os.path.join(out, "privacy_report.json"))
    assert cli.main(["--candidates", paths["signal"], paths["signal"], "--valid", valid_path, "--out", out]) == 2
    capsys.readouterr()
    # A positional split composes sequentially: above the tuning's target, said, with the reservation to use.
    assert cli.main(["--candidates", *paths.values(), "--valid", valid_path, "--out", str(tmp_path / "seq"),
                     "--epsilon", "2", "--split", "positional", "--max-epochs", "1", "--seed", "1"]) == 0
    got = capsys.readouterr()
    summary = json.loads(got.out.strip().splitlines()[-1])
    assert summary["composition"] == ps.SEQUENTIAL and summary["within_target"] is False
    assert "exceeds the tuning's target" in got.err and "--reserve-selection-epsilon 2)" in got.err


def test_cli_chains_a_selection_counting_the_tuning_once(candidates, tmp_path, capsys):
    """A selection's output is a candidate of the next: its report holds the model's tuning once and
    both selections on D_valid (their epsilons add up there), not the tuning twice."""
    from trainers import select as cli

    root, paths, valid = candidates
    valid_path = str(tmp_path / "valid.jsonl")
    with open(valid_path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in valid)
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    common = ["--valid", valid_path, "--max-epochs", "1", "--seed", "1"]
    assert cli.main(["--candidates", *paths.values(), "--out", first, "--epsilon", "0.5", *common]) == 0
    assert cli.main(["--candidates", first, paths["nosignal"], "--out", second, "--epsilon", "1", *common]) == 0
    capsys.readouterr()
    rep = report_lib.load_report(second)
    entries = rep["ledger"]["entries"]
    assert [e["mechanism"] for e in entries] == ["gaussian", "exponential", "exponential"]
    assert [e["epsilon"] for e in entries[1:]] == [0.5, 1.0]
    assert rep["selection"]["epsilon_by_dataset"][ps.VALID]["rdp"] == pytest.approx(1.5)
    tuning = PrivacyLedger(delta=1e-4, target_epsilon=math.inf, entries=entries[:1]).epsilon("rdp")
    assert rep["selection"]["epsilon_tuning"]["rdp"] == pytest.approx(tuning)
    assert rep["epsilon"]["rdp"] == pytest.approx(max(tuning, 1.5))


def test_cli_hands_the_generation_settings_to_the_generation_job(tmp_path, monkeypatch, capsys):
    """`dpsynth select --model`: --max-len, --gen-batch-size, --gen-seed and the memory flags are the
    generation job's `GenerateConfig` settings, handed over as such (declared once, there), to the
    jobs and to the plan's probe."""
    from dpsynth.generate.plan import GenerateConfig
    from trainers import select as cli

    valid_path = tmp_path / "valid.jsonl"
    valid_path.write_text("".join(json.dumps(r) + "\n" for r in make_records(20, 1)))
    seen = {}

    class Stop(Exception):
        pass

    def fake_generate_candidates(model_dir, root, grid, **kwargs):
        seen.update(kwargs)
        raise Stop

    from dpsynth.evaluate import screening

    monkeypatch.setattr(report_lib, "load_report", lambda d: {"training": {"dataset_size": 50}})
    monkeypatch.setattr(dp_select, "generate_candidates", fake_generate_candidates)
    probed = {}
    monkeypatch.setattr(screening, "probe", lambda model, settings, config, **kw: (probed.update(kw), (
        screening.Speed(examples_per_second={False: 1.0, True: 1.0}, job_overhead_seconds=0.0, mean_tokens=1.0,
                        classifier_seconds_per_example=0.0), 8))[1])
    argv = ["--model", str(tmp_path / "m"), "--valid", str(valid_path), "--out", str(tmp_path / "o"), "--screen-size", "0"]
    with pytest.raises(Stop):
        cli.main(argv + ["--max-len", "40", "--gen-batch-size", "auto", "--gen-seed", "3", "--memory-limit", "1GiB",
                         "--memory-headroom", "0.3"])
    assert {k: seen[k] for k in cli._GENERATE_BOUND} == {"max_len": 40, "batch_size": "auto", "seed": 3,
                                                         "memory_limit": 1 << 30, "memory_headroom": 0.3}
    assert probed == {k: seen[k] for k in cli._GENERATE_BOUND}  # the probe times the job the run will run
    with pytest.raises(Stop):
        cli.main(argv)
    defaults = GenerateConfig(model_dir="m", out_dir="o", num_examples=1)
    assert {k: seen[k] for k in cli._GENERATE_BOUND} == {k: getattr(defaults, k) for k in cli._GENERATE_BOUND}
    capsys.readouterr()


def test_generate_candidates_generates_each_setting_once(tmp_path):
    from tests.generate.fakes import load_fake_bundle, write_fake_model_dir

    model = write_fake_model_dir(str(tmp_path / "model"), max_len=12)
    grid = dp_select.candidate_grid(guidances=(0.0,), temperatures=(1.0, 1.5), multiples=(1, 2))
    paths = dp_select.generate_candidates(model, str(tmp_path / "cands"), grid, dataset_size=10, valid_fraction=0.2,
                                          job_kwargs={"loader": load_fake_bundle}, max_len=12, batch_size=4)
    assert sorted(paths) == ["w0-t1-x1", "w0-t1-x2", "w0-t1.5-x1", "w0-t1.5-x2"]
    assert sorted(os.listdir(tmp_path / "cands" / "generated")) == ["w0-t1", "w0-t1.5"]  # two generation jobs
    def lines(path, split):
        return open(os.path.join(path, f"{split}.jsonl")).read().splitlines()

    for t in ("1", "1.5"):
        big, small = paths[f"w0-t{t}-x2"], paths[f"w0-t{t}-x1"]
        assert [len(lines(big, "train")), len(lines(big, "valid"))] == [20, 4]
        assert lines(small, "train") == lines(big, "train")[:10] and lines(small, "valid") == lines(big, "valid")[:2]
        assert corpora.read_corpus(small).privacy_report == corpora.read_corpus(big).privacy_report

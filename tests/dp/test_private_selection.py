"""The DP selection: probabilities against the exponential mechanism's formula, its privacy
ratio on neighbouring D_valid, the accounting, and the composition rule."""

import itertools
import math

import numpy as np
import pytest

from dpsynth.dp import private_selection as ps
from dpsynth.dp.accounting import PrivacyConfigError
from dpsynth.dp.ledger import PrivacyLedger


def brute_force(scores, scale):
    w = [math.exp(scale * s) for s in scores]
    return [x / sum(w) for x in w]


@pytest.mark.parametrize("monotone", [True, False])
@pytest.mark.parametrize("scores", [[0, 0], [10, 12, 11], [400, 397, 401, 380], [5]])
def test_probabilities_match_formula(scores, monotone):
    sel = ps.DpSelection(epsilon=0.7, monotone=monotone)
    expected = brute_force(scores, 0.7 if monotone else 0.35)
    np.testing.assert_allclose(sel.probabilities(scores), expected, rtol=1e-12)


def test_sampling_matches_probabilities():
    sel = ps.DpSelection(epsilon=1.0)
    scores = [10, 11, 12, 9]
    rng = np.random.default_rng(0)
    n = 40_000
    counts = np.bincount([sel.choose(scores, rng) for _ in range(n)], minlength=4) / n
    p = sel.probabilities(scores)
    # 5 standard errors of a binomial proportion
    assert np.all(np.abs(counts - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-9), (counts, p)


def correct_counts(predictions, labels):
    return [sum(int(p == y) for p, y in zip(pred, labels)) for pred in predictions]


def test_count_is_monotone_with_sensitivity_one_and_ratio_bounded():
    """Every neighbour of a small D_valid (one record added or removed): each count moves by 0 or +1
    (add) / 0 or -1 (remove), and each selection probability changes by at most e^epsilon."""
    rng = np.random.default_rng(1)
    eps = 0.9
    for monotone in (True, False):
        sel = ps.DpSelection(epsilon=eps, monotone=monotone)
        for _ in range(30):
            labels = list(rng.integers(0, 2, size=6))
            preds = [list(rng.integers(0, 2, size=7)) for _ in range(3)]  # 7: room for one added record
            base = correct_counts([p[:6] for p in preds], labels)
            neighbours = [correct_counts([p[:6] + [p[6]] for p in preds], labels + [y]) for y in (0, 1)]
            neighbours += [correct_counts([p[:i] + p[i + 1:6] for p in preds], labels[:i] + labels[i + 1:])
                           for i in range(6)]
            for nb in neighbours:
                diff = np.subtract(nb, base)
                assert np.all(np.abs(diff) <= ps.SENSITIVITY)
                assert np.all(diff >= 0) or np.all(diff <= 0)  # monotone
                ratio = sel.probabilities(nb) / sel.probabilities(base)
                assert np.all(ratio <= math.exp(eps) * (1 + 1e-12)) and np.all(ratio >= math.exp(-eps) * (1 - 1e-12))


def test_non_monotone_needs_half_scale():
    """With scores that move in opposite directions, the monotone scale breaks epsilon: the general one does not."""
    base, nb = [0.0, 1.0], [1.0, 0.0]  # each moved by 1, in opposite directions
    eps = 1.0
    worst = lambda sel: max(np.max(sel.probabilities(nb) / sel.probabilities(base)),
                            np.max(sel.probabilities(base) / sel.probabilities(nb)))
    assert worst(ps.DpSelection(epsilon=eps, monotone=True)) > math.exp(eps)
    assert worst(ps.DpSelection(epsilon=eps, monotone=False)) <= math.exp(eps) * (1 + 1e-12)


@pytest.mark.parametrize("eps", [0.1, 1.0, 3.0])
def test_exponential_entry_accounts_its_epsilon(eps):
    sel = ps.DpSelection(epsilon=eps)
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=math.inf)
    ledger.record_selection(sel.ledger_entry(5))
    got = ledger.epsilons()
    assert got["pld"] is None  # no pure-DP event under add-or-remove in dp-accounting's PLD
    # eps^2/8-zCDP (bounded range) -> RDP: at most the zCDP conversion rho + 2 sqrt(rho log(1/delta))
    rho = eps ** 2 / 8
    assert 0 < got["rdp"] <= rho + 2 * math.sqrt(rho * math.log(1e5)) + 1e-9
    # a part holding only pure-DP selections is bounded by their summed epsilons, for every accountant
    g = ps.guarantee(ledger.entries * 2, 1e-5, ps.PARALLEL)
    for acc, v in g["epsilon_by_dataset"][ps.VALID].items():
        assert v <= 2 * eps + 1e-12, (acc, v)
    assert g["epsilon_by_dataset"][ps.VALID]["pld"] == 2 * eps
    assert PrivacyLedger.from_json(ledger.to_json()).entries == ledger.entries


def test_gaussian_variant_calibrated_for_k_counts():
    sel = ps.DpSelection(epsilon=1.0, mechanism=ps.GAUSSIAN, delta=1e-5)
    entry = sel.ledger_entry(4)
    assert entry["mechanism"] == "gaussian" and entry["count"] == 4 and entry["dataset"] == ps.VALID
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=math.inf)
    ledger.record_selection(entry)
    assert ledger.epsilon("rdp") == pytest.approx(1.0, abs=2e-3)
    # the same as one Gaussian of L2 sensitivity sqrt(k): sigma grows as sqrt(k)
    assert sel.noise_multiplier(16) == pytest.approx(2 * sel.noise_multiplier(4), rel=2e-3)
    assert sel.choose([0, 0, 1e6, 0], np.random.default_rng(0)) == 2


def test_config_errors():
    with pytest.raises(PrivacyConfigError):
        ps.DpSelection(epsilon=0)
    with pytest.raises(PrivacyConfigError):
        ps.DpSelection(epsilon=math.inf)
    with pytest.raises(PrivacyConfigError):
        ps.DpSelection(epsilon=1, mechanism=ps.GAUSSIAN)
    with pytest.raises(ValueError):
        ps.DpSelection(epsilon=1).choose([], np.random.default_rng(0))
    with pytest.raises(ValueError):
        ps.DpSelection(epsilon=1).choose([1, float("nan")], np.random.default_rng(0))


@pytest.mark.parametrize("split,read,expected", [
    (ps.FILES, False, ps.PARALLEL), (ps.HASH, False, ps.PARALLEL), (ps.POSITIONAL, False, ps.SEQUENTIAL),
    (ps.FILES, True, ps.SEQUENTIAL), (ps.HASH, True, ps.SEQUENTIAL)])
def test_composition_rule(split, read, expected):
    assert ps.composition(split, valid_read_by_tuning=read) == expected


def test_guarantee_parallel_is_the_max_and_sequential_the_composition():
    tuning = {"mechanism": "gaussian", "name": "tune", "noise_multiplier": 2.0, "count": 3}
    for eps_s in (0.5, 1.0, 20.0):
        sel = ps.DpSelection(epsilon=eps_s).ledger_entry(8)
        par = ps.guarantee([tuning, sel], 1e-5, ps.PARALLEL)
        seq = ps.guarantee([tuning, sel], 1e-5, ps.SEQUENTIAL)
        t = par["epsilon_by_dataset"][ps.TRAIN]
        s = par["epsilon_by_dataset"][ps.VALID]
        for acc in ("rdp", "pld"):
            assert par["epsilon"][acc] == max(t[acc], s[acc])
            if seq["epsilon"][acc] is None:  # PLD cannot compose the exponential mechanism with the tuning
                continue
            assert seq["epsilon"][acc] == par["epsilon_sequential"][acc] >= par["epsilon"][acc]
            # the release stays at the tuning's epsilon exactly when eps_s <= eps_t
            stays = par["epsilon"][acc] == t[acc]
            assert stays == (s[acc] <= t[acc])
    assert ps.within_tuning(3.0, 1.0) and not ps.within_tuning(1.0, 3.0)


def test_choice_is_exact_gumbel_max_over_all_orders():
    """Gumbel-max picks the argmax of the perturbed scores: ties in scores give uniform choices."""
    sel = ps.DpSelection(epsilon=2.0)
    for perm in itertools.permutations([3, 3, 3]):
        np.testing.assert_allclose(sel.probabilities(perm), [1 / 3] * 3)


def test_positional_split_accounts_the_selection_for_two_records():
    assert ps.group_size(ps.FILES) == ps.group_size(ps.HASH) == 1 and ps.group_size(ps.POSITIONAL) == 2
    e = ps.DpSelection(epsilon=0.5).ledger_entry(3, group=ps.group_size(ps.POSITIONAL))
    assert e["epsilon"] == 1.0 and e["group"] == 2  # group privacy: 2 x epsilon
    g = ps.DpSelection(epsilon=1.0, mechanism=ps.GAUSSIAN, delta=1e-5)
    assert g.ledger_entry(3, group=2)["noise_multiplier"] == pytest.approx(g.noise_multiplier(3) / 2)
    with pytest.raises(ValueError):
        ps.group_size("last10")


# ---------------------------------------------------------------------- a selection reserved by the tuning


def _tuned_report(reserve: float, epsilon: float = 3.0):
    """The privacy report of a tuning planned with `reserve_selection_epsilon = reserve` (its ledger
    holds what the run spends, the reservation only in `training`)."""
    from dpsynth.dp import report as report_lib
    from dpsynth.train.tune_config import TuneConfig, plan_run

    config = TuneConfig(epsilon=epsilon, batch_size=64, steps=200, reserve_selection_epsilon=reserve)
    plan = plan_run(config, 4000)
    ledger = PrivacyLedger(delta=plan.delta, target_epsilon=plan.target_epsilon,
                           entries=[plan.ledger_entry(steps=plan.steps, clip_norm=1.0)])
    training = {"dataset_size": 4000, **({"reserve_selection_epsilon": reserve} if reserve else {})}
    return plan, report_lib.build_report(ledger, training=training, contamination_sha256=None)


@pytest.mark.parametrize("reserve", [0.1, 0.3, 0.5])
def test_reserved_selection_keeps_a_sequential_release_within_the_target(reserve):
    """The property: tune with a reservation r, select at r on a positional split (sequential, at 2r):
    the composed release is (target, delta)-DP; a selection above the reservation is not."""
    plan, rep = _tuned_report(reserve)
    assert plan.reserved == (ps.reserved_entry(reserve),) and ps.reserved_entry(reserve)["epsilon"] == 2 * reserve
    # the run alone spends less than the target; the run and the reserved selection meet it
    assert plan.epsilons()["rdp"] < 3.0
    both = PrivacyLedger(delta=plan.delta, target_epsilon=3.0, entries=[
        plan.ledger_entry(steps=plan.steps, clip_norm=1.0), ps.reserved_entry(reserve)]).epsilons()["rdp"]
    assert 3.0 * (1 - 1e-3) <= both <= 3.0
    rng = np.random.default_rng(0)
    for eps_s, within in ((reserve, True), (reserve / 2, True), (2 * reserve, False)):
        _, entry, out = ps.select_release(["a", "b"], [10, 12], [rep, rep], ps.DpSelection(epsilon=eps_s),
                                          split=ps.POSITIONAL, rng=rng, entry_name="sel", selected_by="x", covers="y")
        assert out["selection"]["composition"] == ps.SEQUENTIAL and entry["epsilon"] == 2 * eps_s
        assert out["selection"]["reserved_by_tuning"] == reserve
        assert out["selection"]["within_target"] is within
        assert (float(out["epsilon"]["rdp"]) <= 3.0) is within


def test_a_reservation_costs_noise_and_nothing_without_one():
    plain, rep0 = _tuned_report(0.0)
    reserved, _ = _tuned_report(0.3)
    assert reserved.noise_multiplier > plain.noise_multiplier and not plain.reserved
    assert "reserved" not in plain.to_json() and reserved.to_json()["reserved"] == [ps.reserved_entry(0.3)]
    assert type(reserved).from_json(reserved.to_json()) == reserved
    assert [d[0] for d in plain.differences(reserved)] == ["noise_multiplier", "reserved"]
    _, _, out = ps.select_release(["a"], [1], [rep0], ps.DpSelection(epsilon=0.3), split=ps.POSITIONAL,
                                  rng=np.random.default_rng(0), entry_name="sel", selected_by="x", covers="y")
    assert out["selection"]["reserved_by_tuning"] == 0.0 and out["selection"]["within_target"] is False


def test_reservation_settings_are_checked():
    from dpsynth.dp.plan import plan_privacy
    from dpsynth.train.tune_config import TuneConfig, TuneError

    for bad in (-0.1, math.inf, math.nan, "0.3", True):
        with pytest.raises(TuneError, match="reserve_selection_epsilon"):
            TuneConfig(reserve_selection_epsilon=bad)
    with pytest.raises(TuneError, match="non-private"):
        TuneConfig(epsilon=math.inf, reserve_selection_epsilon=0.3)
    with pytest.raises(TuneError, match="RDP"):
        TuneConfig(accountant="pld", reserve_selection_epsilon=0.3)
    assert "reserve_selection_epsilon" not in TuneConfig().to_json()  # fingerprints of earlier runs hold
    assert TuneConfig(reserve_selection_epsilon=1).to_json()["reserve_selection_epsilon"] == 1.0
    with pytest.raises(PrivacyConfigError, match="RDP"):
        plan_privacy(dataset_size=1000, expected_batch_size=10, steps=10, epsilon=3.0, accountant="pld",
                     reserved=(ps.reserved_entry(0.3),))


# ---------------------------------------------------------------------- counting each release once


def report_of(ledger):
    from dpsynth.dp import report as report_lib

    return report_lib.build_report(ledger, training={"mode": "lora", "dataset_size": 200}, contamination_sha256=None,
                                   side_channels=[report_lib.LABEL_SET_CHANNEL])


def tuned(sigma=1.0, steps=10):
    ledger = PrivacyLedger(delta=1e-4, target_epsilon=3.0)
    ledger.record_dpsgd(sampling_probability=0.1, noise_multiplier=sigma, steps=steps, clip_norm=1.0, dataset_size=200)
    return ledger


def composed(entries):
    return PrivacyLedger(delta=1e-4, target_epsilon=math.inf, entries=[dict(e) for e in entries]).epsilon("rdp")


def test_one_model_counts_once_and_two_identical_tunings_twice():
    a = report_of(tuned())
    entries, _ = ps.tuning_entries([a, a, a])  # three corpora of one model
    assert len(entries) == 1 and entries[0]["steps"] == 10
    b = report_of(tuned())  # the same settings, another run: another release of D_train
    assert a["ledger"]["entries"][0]["run"] != b["ledger"]["entries"][0]["run"]
    entries, _ = ps.tuning_entries([a, b, a, b])
    assert len(entries) == 2
    assert composed(entries) == pytest.approx(composed(tuned(steps=20).entries))  # 2 x 10 steps


def test_a_label_histogram_draw_counts_once_per_draw():
    from dpsynth.dp import report as report_lib
    from dpsynth.generate import labels as labels_lib

    base = report_of(tuned())
    one = labels_lib.dp_label_histogram(["x", "y", "y"], ["x", "y"], noise_multiplier=5.0, seed=0)
    two = labels_lib.dp_label_histogram(["x", "y", "y"], ["x", "y"], noise_multiplier=5.0, seed=0)
    assert one.run and one.run != two.run
    assert labels_lib.LabelDistribution.from_json(one.to_json()) == one

    def corpus(dist):  # what `generate` composes into each corpus's report
        return report_lib.compose_gaussian(base, noise_multiplier=dist.noise_multiplier, name="label_histogram",
                                           run=dist.run)

    entries, _ = ps.tuning_entries([corpus(one), corpus(one), corpus(one)])
    assert [e["mechanism"] for e in entries] == ["dpsgd", "gaussian"]
    entries, _ = ps.tuning_entries([corpus(one), corpus(two)])  # two draws: two releases of the counts
    assert [e["mechanism"] for e in entries] == ["dpsgd", "gaussian", "gaussian"]
    # a draw without a run id (saved before run ids): each composition is taken as a new draw
    entries, _ = ps.tuning_entries([report_lib.compose_gaussian(base, noise_multiplier=5.0, name="h"),
                                    report_lib.compose_gaussian(base, noise_multiplier=5.0, name="h")])
    assert [e["mechanism"] for e in entries] == ["dpsgd", "gaussian", "gaussian"]


def test_a_resumed_run_records_under_a_new_id_so_two_continuations_both_count():
    start = tuned(steps=5)
    saved = start.to_json()
    forks = []
    for _ in range(2):  # two processes resume the same checkpoint and take 5 more steps each
        ledger = PrivacyLedger.from_json(saved)
        ledger.record_dpsgd(sampling_probability=0.1, noise_multiplier=1.0, steps=5, clip_norm=1.0, dataset_size=200)
        assert ledger.steps_recorded == 10 and len(ledger.entries) == 2
        forks.append(report_of(ledger))
    entries, _ = ps.tuning_entries(forks)
    assert sum(e["steps"] for e in entries) == 15  # the shared 5, and 5 of each continuation
    # the merged-steps epsilon of one uninterrupted run equals the split entries' (composition of steps)
    assert composed(forks[0]["ledger"]["entries"]) == pytest.approx(composed(tuned(steps=10).entries))


def test_identical_entries_of_one_report_all_count():
    ledger = tuned()
    ledger.record_gaussian(noise_multiplier=3.0, name="h")
    ledger.record_dpsgd(sampling_probability=0.1, noise_multiplier=1.0, steps=10, clip_norm=1.0, dataset_size=200)
    assert ledger.entries[0] == ledger.entries[2]  # same run, same content: two mechanisms of one run
    rep = report_of(ledger)
    entries, _ = ps.tuning_entries([rep, rep])
    assert len(entries) == 3


def test_legacy_ledgers_without_run_ids_merge_whole():
    def legacy(sigma):
        rep = report_of(tuned(sigma))
        rep["ledger"]["entries"] = [{k: v for k, v in e.items() if k != "run"} for e in rep["ledger"]["entries"]]
        return rep

    entries, _ = ps.tuning_entries([legacy(1.0), legacy(2.0), legacy(1.0)])
    assert [e["noise_multiplier"] for e in entries] == [1.0, 2.0]


def test_a_chained_selection_counts_the_tuning_once_and_both_selections():
    """Select among one model's corpora, then again among that output and more of the model's
    corpora: the second release holds the tuning once and both selections on D_valid."""
    rng = np.random.default_rng(0)
    model = report_of(tuned())
    common = dict(split=ps.HASH, rng=rng, entry_name="sel", selected_by="test", covers="test")
    _, first_entry, first = ps.select_release(["a", "b"], [3, 5], [model, model], ps.DpSelection(epsilon=0.5),
                                              **common)
    _, second_entry, second = ps.select_release(["first", "c"], [7, 6], [first, model],
                                                ps.DpSelection(epsilon=1.0), **common)
    entries = second["ledger"]["entries"]
    assert [e["mechanism"] for e in entries] == ["dpsgd", "exponential", "exponential"]
    assert first_entry["run"] != second_entry["run"]
    s = second["selection"]
    assert s["epsilon_by_dataset"][ps.VALID]["rdp"] == pytest.approx(1.5)  # pure: 0.5 + 1.0
    tuning = composed(model["ledger"]["entries"])
    assert s["epsilon_tuning"]["rdp"] == pytest.approx(tuning)  # the D_train part only
    assert second["epsilon"]["rdp"] == pytest.approx(max(tuning, 1.5))  # parallel on a hash split

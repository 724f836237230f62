"""The automatic DP-tuning recipe: its rule's properties, and that a run and its plan use what it chose."""

import math

import pytest

from dpsynth.train import recipe, tune_config


@pytest.mark.parametrize("n", [50, 400, 4036, 5000, 120_000])
@pytest.mark.parametrize("mode", ["lora", "prompt", "full"])
@pytest.mark.parametrize("max_tokens,budget", [(64, None), (96, 2e6), (32, 4e5)])
def test_rule_properties(n, mode, max_tokens, budget):
    total = recipe.DEFAULT_TOKEN_BUDGET if budget is None else budget
    if total / (n * max_tokens) < recipe.MIN_EPOCHS:
        with pytest.raises(recipe.RecipeError, match="budget"):
            recipe.auto_recipe(dataset_size=n, mode=mode, max_tokens=max_tokens, token_budget=budget)
        return
    r = recipe.auto_recipe(dataset_size=n, mode=mode, max_tokens=max_tokens, token_budget=budget)
    assert recipe.MIN_STEPS <= r.steps <= recipe.TARGET_STEPS
    assert 0 < r.batch_size <= n
    assert r.epochs == pytest.approx(r.steps * r.batch_size / n, rel=1e-3)
    assert r.epochs <= recipe.TARGET_EPOCHS + 1e-9
    assert r.epochs * n * max_tokens <= total * (1 + 1e-6)  # never more compute than the budget
    # Steps are cut only to keep MIN_BATCH examples per step, and only as far as MIN_STEPS.
    if r.steps < recipe.TARGET_STEPS:
        assert r.batch_size >= recipe.MIN_BATCH - 1e-9 or r.steps == recipe.MIN_STEPS
    assert r.learning_rate == pytest.approx(recipe.LEARNING_RATES[mode] * math.sqrt(recipe.TARGET_STEPS / r.steps),
                                            rel=1e-4)
    assert len(r.why) == 4 and all(isinstance(w, str) and w for w in r.why)
    again = recipe.auto_recipe(dataset_size=n, mode=mode, max_tokens=max_tokens, token_budget=budget)
    assert again == r


def test_more_budget_never_fewer_passes():
    passes = [recipe.auto_recipe(dataset_size=4000, mode="lora", max_tokens=64, token_budget=b).epochs
              for b in (3e5, 1e6, 3e6, 1e7, 1e8)]
    assert passes == sorted(passes) and passes[-1] == recipe.TARGET_EPOCHS


def test_errors():
    with pytest.raises(recipe.RecipeError, match="non-empty"):
        recipe.auto_recipe(dataset_size=0, mode="lora", max_tokens=64)
    with pytest.raises(recipe.RecipeError, match="mode"):
        recipe.auto_recipe(dataset_size=10, mode="bogus", max_tokens=64)
    with pytest.raises(tune_config.TuneError, match="recipe"):
        tune_config.TuneConfig(recipe="bogus")
    with pytest.raises(tune_config.TuneError, match="token_budget"):
        tune_config.TuneConfig(token_budget=1e6)  # a setting of the automatic recipe only


@pytest.mark.parametrize("epsilon", [1.0, 3.0, math.inf])
def test_resolved_config_is_what_the_plan_uses(epsilon):
    config = tune_config.TuneConfig(mode="lora", epsilon=epsilon, recipe="auto", max_tokens=64, token_budget=5e6)
    resolved, chosen = tune_config.resolve_recipe(config, 4036)
    assert (resolved.batch_size, resolved.steps, resolved.learning_rate) == (chosen.batch_size, chosen.steps,
                                                                             chosen.learning_rate)
    plan = tune_config.plan_run(config, 4036)  # the dry run resolves the same way
    assert plan.steps == chosen.steps and plan.expected_batch_size == pytest.approx(chosen.batch_size)
    assert plan == tune_config.plan_run(resolved, 4036)
    manual, none = tune_config.resolve_recipe(tune_config.TuneConfig(), 4036)
    assert none is None and manual == tune_config.TuneConfig()


def test_length_scores_have_sensitivity_one():
    """u(L) moves by at most 1 when one example is added or removed, for every candidate."""
    import numpy as np

    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = list(rng.integers(1, 600, size=int(rng.integers(1, 40))))
        base = recipe.length_scores(lengths)
        for extra in (1, 50, 100, 600):
            assert max(abs(a - b) for a, b in zip(recipe.length_scores(lengths + [extra]), base)) <= 1.0 + 1e-12
        for i in range(len(lengths)):
            if len(lengths) > 1:
                nb = recipe.length_scores(lengths[:i] + lengths[i + 1:])
                assert max(abs(a - b) for a, b in zip(nb, base)) <= 1.0 + 1e-12


def test_length_scores_prefer_the_shortest_length_that_keeps_the_quantile():
    """The exact choice (the argmax) is the shortest candidate keeping >= 90% of the rows whole, on brute
    force over random sets; a longer candidate that keeps no more rows scores lower (short data, short length)."""
    import numpy as np

    rng = np.random.default_rng(1)
    cands = recipe.LENGTH_CANDIDATES
    for _ in range(200):
        lengths = rng.integers(1, 700, size=int(rng.integers(1, 60)))
        kept = [np.count_nonzero(lengths <= c) for c in cands]
        # the shortest candidate keeping 90%; where none does, the shortest keeping as many as the longest
        want = next((c for c, n in zip(cands, kept) if n >= recipe.LENGTH_QUANTILE * len(lengths)),
                    next(c for c, n in zip(cands, kept) if n == kept[-1]))
        scores = recipe.length_scores(lengths)
        assert cands[int(np.argmax(scores))] == want, (sorted(lengths), scores)
    short = recipe.length_scores([10] * 1000)  # every candidate keeps every row
    assert short[0] == 0 and max(short[1:]) == -101, short  # 100 rows past the 900 to keep, plus one
    chosen = [recipe.dp_example_length([10] * 4000, epsilon=0.06, rng=np.random.default_rng(s))[0] for s in range(20)]
    assert chosen == [32] * 20  # at epsilon 3 x 2%: the next candidate is e^12 less likely


def test_dp_example_length_finds_the_quantile_and_spends_its_epsilon():
    import numpy as np

    from dpsynth.dp.ledger import PrivacyLedger

    lengths = [60] * 920 + [90] * 40 + [400] * 40  # 92% of the examples within 64 tokens, 88% within 48
    chosen, entry = recipe.dp_example_length(lengths, epsilon=1.0, rng=np.random.default_rng(0))
    assert chosen == 64
    assert entry == {"mechanism": "exponential", "name": "recipe example length", "epsilon": 1.0,
                     "candidates": len(recipe.LENGTH_CANDIDATES), "dataset": "D_train"}
    PrivacyLedger(delta=1e-5, target_epsilon=3.0).record_selection(entry)
    with pytest.raises(recipe.RecipeError):
        recipe.dp_example_length([], epsilon=1.0, rng=np.random.default_rng(0))


def test_token_budget_from_the_measured_speed():
    ticks = iter([0.0, 2.0, 10.0, 11.0, 20.0, 24.0])  # calls of 2, 1 and 4 seconds: the best is 1 s
    calls = []
    speed = recipe.measure_speed(lambda: calls.append(1), example_tokens=1000, clock=lambda: next(ticks))
    assert speed == 1000.0 and len(calls) == 4  # one warm-up, three timed
    assert recipe.token_budget_for(seconds=3600, example_tokens_per_second=speed) == 3.6e6
    with pytest.raises(recipe.RecipeError):
        recipe.token_budget_for(seconds=0, example_tokens_per_second=1.0)


def test_choose_example_length_samples_the_exponential_mechanism():
    """The chosen length's distribution is the exponential mechanism's (non-monotone scores:
    exp(eps u / 2)) over the candidates the model allows; a non-private run takes the exact
    quantile, and a single candidate reads nothing."""
    import numpy as np

    from dpsynth.dp import private_selection as ps

    lengths = np.asarray([20] * 60 + [40] * 30 + [100] * 10)  # 90% within 48 tokens (the 40s: 48)
    cands = recipe.length_candidates(max_positions=127, min_tokens=10)
    assert cands == (32, 48, 64, 96, 128)
    eps_total = 10.0
    rng = np.random.default_rng(1)
    draws = [recipe.choose_example_length(lengths, target_epsilon=eps_total, rng=rng, candidates=cands)
             for _ in range(4000)]
    eps = recipe.LENGTH_EPSILON_SHARE * eps_total
    assert {d.epsilon for d in draws} == {eps}
    assert draws[0].entry == {"mechanism": "exponential", "name": "recipe example length", "epsilon": eps,
                              "candidates": len(cands), "dataset": "D_train"}
    want = ps.DpSelection(epsilon=eps, monotone=False).probabilities(recipe.length_scores(lengths, cands))
    got = np.bincount([cands.index(d.max_tokens) for d in draws], minlength=len(cands)) / len(draws)
    assert np.all(np.abs(got - want) <= 4 * np.sqrt(want * (1 - want) / len(draws)) + 1e-3), (got, want)
    exact = recipe.choose_example_length(lengths, target_epsilon=math.inf, rng=rng, candidates=cands)
    assert exact.max_tokens == 48 and exact.entry is None and exact.epsilon is None
    one = recipe.choose_example_length(lengths, target_epsilon=3.0, rng=rng, candidates=(32,))
    assert one.max_tokens == 32 and one.entry is None and "only candidate" in one.why
    assert recipe.LengthChoice.from_json(draws[0].to_json()) == draws[0]
    # 100 examples at epsilon 10 x 2%: a candidate 10% of N away is only e^1 less likely: said.
    assert draws[0].noisy and "NOISY" in draws[0].why
    spread = np.repeat([20] * 60 + [40] * 36 + [60] * 2 + [100] * 2, 40)  # N 4,000: 48 keeps 96%, 32 60%
    big = recipe.choose_example_length(spread, target_epsilon=3.0, rng=rng, candidates=cands)
    assert not big.noisy and big.max_tokens == 48 and "NOISY" not in big.why  # 64 (241 rows off) is e^-7 as likely
    with pytest.raises(recipe.RecipeError, match="no automatic example length"):
        recipe.length_candidates(max_positions=20, min_tokens=10)


def test_auto_length_is_refused_where_it_cannot_be_accounted():
    with pytest.raises(tune_config.TuneError, match="recipe 'auto'"):
        tune_config.TuneConfig(max_tokens="auto")
    with pytest.raises(tune_config.TuneError, match="RDP"):
        tune_config.TuneConfig(max_tokens="auto", recipe="auto", accountant="pld")
    with pytest.raises(tune_config.TuneError, match="example-level"):
        tune_config.TuneConfig(max_tokens="auto", recipe="auto", privacy_unit="user", max_examples_per_user=2)
    cfg = tune_config.TuneConfig(max_tokens="auto", recipe="auto")
    with pytest.raises(tune_config.TuneError, match="resolve"):
        tune_config.plan_run(cfg, 1000)  # the dry run cannot plan a length it has not chosen


def test_a_plan_after_a_spent_selection_meets_the_target_together():
    """sigma is calibrated on the composition of what was spent and the run: the ledger holding
    both meets the target, and sigma is larger than without the spent entry."""
    from dpsynth.dp.ledger import PrivacyLedger
    from dpsynth.dp.plan import PrivacyPlan, plan_privacy

    entry = {"mechanism": "exponential", "name": "recipe example length", "epsilon": 0.06, "candidates": 9,
             "dataset": "D_train"}
    kw = dict(dataset_size=4000, expected_batch_size=64, steps=100, epsilon=3.0)
    alone, after = plan_privacy(**kw), plan_privacy(**kw, spent=(entry,))
    assert after.noise_multiplier > alone.noise_multiplier
    ledger = PrivacyLedger(delta=after.delta, target_epsilon=3.0)
    ledger.record_selection(entry)
    ledger.record_steps(after.ledger_entry(steps=100, clip_norm=1.0))
    assert 3.0 * 0.995 < ledger.epsilon() <= 3.0 * (1 + 1e-6)
    assert after.epsilons()["rdp"] == pytest.approx(ledger.epsilon(), rel=1e-9)
    assert "spent" not in alone.to_json() and after.to_json()["spent"] == [entry]
    assert PrivacyPlan.from_json(after.to_json()) == after and PrivacyPlan.from_json(alone.to_json()) == alone
    assert [d[0] for d in after.differences(alone)] == ["noise_multiplier", "spent"]

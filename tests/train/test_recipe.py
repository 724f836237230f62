"""The automatic DP-tuning recipe: its rule's properties, and that a run and its plan use what it chose."""

import math

import pytest

from dpsynth.train import finetune, recipe


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
    with pytest.raises(finetune.TuneError, match="recipe"):
        finetune.TuneConfig(recipe="bogus")
    with pytest.raises(finetune.TuneError, match="token_budget"):
        finetune.TuneConfig(token_budget=1e6)  # a setting of the automatic recipe only


@pytest.mark.parametrize("epsilon", [1.0, 3.0, math.inf])
def test_resolved_config_is_what_the_plan_uses(epsilon):
    config = finetune.TuneConfig(mode="lora", epsilon=epsilon, recipe="auto", max_tokens=64, token_budget=5e6)
    resolved, chosen = finetune.resolve_recipe(config, 4036)
    assert (resolved.batch_size, resolved.steps, resolved.learning_rate) == (chosen.batch_size, chosen.steps,
                                                                             chosen.learning_rate)
    plan = finetune.plan_run(config, 4036)  # the dry run resolves the same way
    assert plan.steps == chosen.steps and plan.expected_batch_size == pytest.approx(chosen.batch_size)
    assert plan == finetune.plan_run(resolved, 4036)
    manual, none = finetune.resolve_recipe(finetune.TuneConfig(), 4036)
    assert none is None and manual == finetune.TuneConfig()

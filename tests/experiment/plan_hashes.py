"""The stage hashes of known experiments: key -> hash per node, for the hash-stability test.

Recorded from main before the settings refactor of issue 25 (`plan_hashes.json`); the test
(`test_plan_hashes.py`) rebuilds every plan and compares, so no refactor of the config
classes can silently invalidate a cache (the cpu study's among them).

    PYTHONPATH=. DPSYNTH_EMBEDDED_DIR=data/embedded .venv/bin/python tests/experiment/plan_hashes.py  # rewrite

Experiments: `configs/demo.yaml`; every experiment of `bench/paper.py` (the cpu study at
`--scale cpu` and `quick`, the `small` study); and variants of the demo that set the optional
keys (privacy unit, BandMF, a DP label histogram, guidance, splits, ...) to non-default
values, so the hashes of settings that are dropped at their default are pinned too.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = pathlib.Path(__file__).with_name("plan_hashes.json")
SHARED_DATA = REPO.parent / "shared" / "data"
ROOT = "/tmp/dpsynth-plan-hashes"  # the root does not enter the hashes
READS_SHARED_DATA = ("demo-user", "demo-also")  # besides the paper-* experiments


def _paper():
    spec = importlib.util.spec_from_file_location("bench_paper_for_hashes", REPO / "bench" / "paper.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _demo() -> dict:
    import yaml

    with open(REPO / "configs" / "demo.yaml", encoding="utf-8") as f:
        return yaml.safe_load(f)


def variants(data: str) -> dict[str, dict]:
    """Demo variants with optional keys set (each a valid experiment)."""
    demo = _demo()
    paper = _paper()
    users = dict(paper.cpu_datasets(data)["yelp_polarity"], user_column="user", max_dead_letters="2%")

    def v(**sections) -> dict:
        cfg = copy.deepcopy(demo)
        for name, value in sections.items():
            cfg[name] = {**cfg.get(name, {}), **value} if isinstance(value, dict) else value
        return cfg

    return {
        "demo-bandmf": v(dp_tune={"mechanism": "bandmf", "bands": 4, "epsilons": [3, "inf"]}),
        "demo-user": v(sensitive=users, public={"embedded": True, "plant": 0},
                       dp_tune={"privacy_unit": "user", "max_examples_per_user": 4, "delta": 1e-5},
                       evaluate={"baselines": False}),
        "demo-histogram": v(generate={"label_distribution": "dp_histogram", "label_noise_multiplier": 10.0}),
        "demo-guided": v(dp_tune={"label_dropout": 0.1},
                         generate={"samplings": [{"temperature": 1.0}, {"guidance": 1.5},
                                                 {"guidance": 1.5, "guidance_contrast": "null"}]}),
        "demo-modes": v(dp_tune={"modes": ["full", "prompt", "lora"], "mode_learning_rates": {"prompt": [0.03]},
                                 "prompt_length": 12, "lora_rank": 4, "loss": "full", "replicates": 2,
                                 "accountant": "pld", "recipe": "manual", "token_budget": None, "steps": 50, "epochs": None, "clip_norms": [0.5, 1.0],
                                 "options": {"microbatch_size": 8}}),
        "demo-recipe": v(dp_tune={"recipe": "manual", "token_budget": None, "learning_rates": [0.001], "batch_size": 32, "epochs": 2}),
        "demo-split": v(sensitive={"embedded": True, "split": {"holdout": "hash", "valid_fraction": 0.2}},
                        public={"embedded": True, "plant": 0}),
        "demo-auto-length": v(dp_tune={"max_tokens": "auto", "token_budget": None, "options": {"time_budget": 600}},
                              generate={"max_tokens": None}),
        "demo-also": v(dedup={"min_tokens": 40, "also_against": {"sst2": paper.cpu_datasets(data)["sst2"]}}),
    }


def experiments(data: str = str(SHARED_DATA)) -> dict[str, dict]:
    """name -> experiment config dict of every pinned experiment."""
    paper = _paper()
    out = {"demo": _demo()}
    for scale in ("cpu", "quick"):
        out.update({f"paper-{scale}-{k}": cfg for k, cfg in paper.cpu_experiments(scale, data).items()})
    out.update({f"paper-small-{k}": cfg for k, cfg in paper.experiments("small", data).items()})
    out.update(variants(data))
    return out


def plan_hashes(cfg: dict, data_dir: str | None = None) -> dict[str, str]:
    from dpsynth.experiment.config import from_dict
    from dpsynth.experiment.plan import build_plan

    plan = build_plan(from_dict(cfg), ROOT, data_dir=data_dir or "data/embedded")  # relative: paths enter the hashes
    return {n.key: n.hash for n in plan.nodes}


def all_hashes(data: str = str(SHARED_DATA)) -> dict[str, dict[str, str]]:
    return {name: plan_hashes(cfg) for name, cfg in experiments(data).items()}


# The fixture's key for where ../shared/data was when it was recorded: its files' paths enter the
# data fingerprints, so the experiments that read it are compared only where it is the same.
SHARED_KEY = "__shared_data__"


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    os.chdir(REPO)
    hashes = all_hashes()
    FIXTURE.write_text(json.dumps({SHARED_KEY: str(SHARED_DATA), **hashes}, indent=1, sort_keys=True)
                       + "\n", encoding="utf-8")
    print(f"{FIXTURE}: {sum(len(h) for h in hashes.values())} node hashes of {len(hashes)} experiments")

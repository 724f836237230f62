"""Committed figures that are not DP are labelled as such (issue 23, finding 7).

What a user may publish holds only what is accounted. The study's committed results include
some figures computed WITHOUT DP from the sensitive data (a DP-tuned model's D_valid / D_train
losses, read from the owner-only private state; owner-side diagnostics on real D_valid): each
must say, where it appears, that it is a "non-DP study-author figure" (or be left out).
"""

import json
import os
import re

from tests.conftest import REPO

LABEL = "non-DP study-author figure"
DOCS = ("README.md",) + tuple(sorted(f"docs/{n}" for n in os.listdir(os.path.join(REPO, "docs")) if n.endswith(".md")))
# A figure about the sensitive data computed without DP: a loss on D_valid/D_train, a label margin on real D_valid.
NON_DP = re.compile(r"(D_valid|D_train|batch|valid(ation)?|train(ing)?|run's) loss|loss \(?on D_|label margin|"
                    r"real D_valid", re.I)
NUMBER = re.compile(r"\d\.\d")
FIGURE_WINDOW = 80  # characters after such a mention in which a figure counts as its value


def _blocks(text: str) -> list[tuple[str, str]]:
    """(kind, text) for every paragraph, bullet and table of a Markdown text (code blocks skipped)."""
    out, cur, kind, fenced = [], [], None, False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        k = "table" if line.startswith("|") else "prose"
        starts = not line.strip() or k != kind or re.match(r"\s*([*-]|\d+\.) ", line)
        if starts and cur:
            out.append((kind, "\n".join(cur)))
            cur = []
        if line.strip():
            cur.append(line)
            kind = k
    if cur:
        out.append((kind, "\n".join(cur)))
    return out


def unlabelled(text: str) -> list[str]:
    """The blocks of `text` that show a non-DP figure about the sensitive data without the label."""
    bad = []
    for kind, block in _blocks(text):
        if kind == "table":
            header = block.splitlines()[0]
            if NON_DP.search(header) and LABEL not in header:
                bad.append(block)
        elif LABEL not in block and any(NUMBER.search(block, m.start(), m.end() + FIGURE_WINDOW)
                                        for m in NON_DP.finditer(block)):
            bad.append(block)
    return bad


def test_the_checker_finds_an_unlabelled_loss():
    assert unlabelled("The run's D_valid loss was 4.548.\n") and not unlabelled(f"D_valid loss 4.548 ({LABEL}).\n")
    assert unlabelled("| run | D_valid loss |\n|---|---|\n| a | 3.1 |\n")
    assert not unlabelled(f"| run | D_valid loss ({LABEL}) |\n|---|---|\n| a | 3.1 |\n")


def test_committed_docs_label_every_non_dp_figure():
    for name in DOCS:
        with open(os.path.join(REPO, name), encoding="utf-8") as f:
            bad = unlabelled(f.read())
        assert not bad, f"{name}: non-DP figures without '{LABEL}':\n\n" + "\n\n".join(bad)


def test_paper_tables_label_the_private_state_losses():
    """bench/paper.py renders the D_valid losses it reads from the private state: labelled in every table."""
    import sys

    sys.path.insert(0, os.path.join(REPO, "bench"))
    import paper

    row = {"trial": "t", "mode": "lora", "epsilon": 3.0, "multiple": 1, "wordcnn_accuracy": 0.7, "mauve": 0.6,
           "learning_rate": 0.01, "steps": 30}
    loss = 4.123456
    res = {"rows": [row, {**row, "mode": "prompt"}], "metrics": {"baselines": []}, "valid_loss": {"t": loss},
           "test_labels": ["a", "b"]}
    results = {k: json.loads(json.dumps(res)) for k in ("main", "full_lm", "bandmf", "dpsgd_many", "bandmf_many",
                                                        "prompt_lr")}
    for scale in ("cpu", "small"):
        md, _ = paper.render(results, ["wordcnn"], scale, "cmd")
        assert f"{loss:.3f}" in md  # the figure is shown...
        assert not unlabelled(md), unlabelled(md)  # ...and labelled wherever it is


def test_paper_lever_table_labels_the_valid_label_scores():
    """The cpu study's lever table shows each DP model's label margin on real D_valid (not DP): labelled."""
    import sys

    sys.path.insert(0, os.path.join(REPO, "bench"))
    import paper

    row = {"trial": "t", "mode": "lora", "epsilon": 3.0, "multiple": 1, "guidance": 0.0, "contrast": "others",
           "replicate": 0, "wordcnn_accuracy": 0.7, "wordcnn_balanced_accuracy": 0.6, "steps": 30}
    margin = 0.123456
    results = {name: {"rows": [row], "metrics": {"baselines": []}, "valid_loss": {},
                      "label_scores": {"dp": {"balanced_accuracy": 0.61, "mean_margin": margin}}}
               for name in ("yelp_polarity", *paper.CPU_LEVERS)}
    md, _ = paper.render_cpu(results, "cpu", "cmd")
    assert "## 8. Levers on long reviews" in md and f"{margin:.3f}" in md
    assert not unlabelled(md), unlabelled(md)

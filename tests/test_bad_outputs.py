"""The output side of the fault suite (issue 35): every command that writes a directory, run as the user runs it.

Unwritable --out / --audit-dir / --state-dir, an --out holding another command's output, two runs
into one --out, and readers given a corpus whose run never finished: each is one line, exit 2,
before any compute, and nothing already there is changed. (Tests run as root, so "unwritable" is
a path under a regular file: root may write into a 0555 directory.)
"""

import fcntl
import json
import os
import shutil
import subprocess
import sys

import pytest

from dpsynth import cli, outdir
from tests.train.conftest import make_records, tiny_base  # noqa: F401 (fixture)

# Each writing command with its required flags; "OUT" is replaced by the --out under test. The inputs
# need not exist: --out is checked before anything is read.
WRITERS = {
    "tokenize": ["--input", "in.txt", "--tokenizer", "tok.model", "--out", "OUT"],
    "dedup": ["--public", "pub", "--sensitive", "s.csv", "--tokenizer", "tok.model", "--out", "OUT"],
    "pretrain": ["--corpus", "clean", "--tokenizer", "tok.model", "--out", "OUT"],
    "import-model": ["--hf", "hf", "--out", "OUT"],
    "export-model": ["--model", "model", "--out", "OUT"],
    "dp-tune": ["--base", "base", "--train", "train.jsonl", "--out", "OUT"],
    "generate": ["--model", "model", "--num-examples", "2", "--out", "OUT"],
    "select": ["--candidates", "synth_a", "synth_b", "--valid", "valid.jsonl", "--epsilon", "1", "--out", "OUT"],
    "probe": ["--model", "model", "--data", "d.jsonl", "--control", "c.jsonl", "--out", "OUT"],
    "audit": ["--corpus", "synth", "--train", "train.jsonl", "--test", "test.jsonl", "--out", "OUT"],
    "classify": ["--train", "train.jsonl", "--valid", "valid.jsonl", "--test", "test.jsonl", "--out", "OUT/m.json"],
    "evaluate": ["--synthetic", "synth", "--real-train", "r.jsonl", "--real-test", "r.jsonl", "--out", "OUT"],
}


def _dpsynth(capsys, command, *args):
    """`dpsynth COMMAND ARGS` in-process; returns (exit status, stderr lines)."""
    capsys.readouterr()
    rc = cli.main([command, *map(str, args)])
    return rc, capsys.readouterr().err.strip().splitlines()


def _tree(path):
    """{relative path: bytes} of every file under `path`."""
    return {os.path.relpath(os.path.join(d, f), path): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(path) for f in files}


@pytest.mark.parametrize("command", sorted(set(WRITERS) - {"classify"}))  # (classify writes one file)
def test_a_users_non_empty_directory_as_out_is_one_line_and_left_alone(command, tmp_path, capsys, monkeypatch):
    """The hostile trial's `mkdir userdir; echo keep > userdir/thesis.txt; ... --out userdir`: its
    train.jsonl was overwritten and thesis.txt published with the corpus."""
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "userdir"
    mine.mkdir()
    (mine / "thesis.txt").write_text("keep\n")
    (mine / "train.jsonl").write_text('{"text":"x","label":"great"}\n')
    before = _tree(mine)
    rc, err = _dpsynth(capsys, command, *[a.replace("OUT", str(mine)) for a in WRITERS[command]])
    assert rc == 2 and len(err) == 1, err
    assert err[0] == (f"dpsynth {command}: error: --out {mine}: a non-empty directory that no dpsynth run wrote (it "
                      "holds thesis.txt, train.jsonl); dpsynth would overwrite or publish its files: choose a new or "
                      "empty --out"), err
    assert _tree(mine) == before and sorted(os.listdir(tmp_path)) == ["userdir"]


@pytest.mark.parametrize("command", sorted(WRITERS))
def test_an_unwritable_out_is_one_line_before_any_compute(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    out = str(tmp_path / "afile" / "out")
    rc, err = _dpsynth(capsys, command, *[a.replace("OUT", out) for a in WRITERS[command]])
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"dpsynth {command}: error: --out ") and "is a file, not a directory" in err[0], err
    assert sorted(os.listdir(tmp_path)) == ["afile"]


def test_unwritable_audit_and_state_dirs(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    bad = tmp_path / "afile" / "private"
    rc, err = _dpsynth(capsys, "generate", "--model", "m", "--num-examples", "2", "--out", tmp_path / "out",
                       "--train", "train.jsonl", "--audit-dir", bad)
    assert rc == 2 and len(err) == 1 and "error: --audit-dir " in err[0], err
    rc, err = _dpsynth(capsys, "dp-tune", "--base", "b", "--train", "t.jsonl", "--out", tmp_path / "out",
                       "--state-dir", bad)
    assert rc == 2 and len(err) == 1 and "error: --state-dir " in err[0], err
    assert sorted(os.listdir(tmp_path)) == ["afile"]


def _finished(path, kind, command, files):
    with outdir.claim(str(path), kind=kind, command=command, config={"seed": 1}):
        for name, text in files.items():
            (path / name).write_text(text)
    return _tree(path)


@pytest.mark.parametrize("command", sorted(WRITERS))
def test_no_command_writes_into_another_commands_output(command, tmp_path, capsys, monkeypatch):
    """Issue 35 case 1 (generate / pretrain into a DP-tuned model, evaluate into a publishable corpus) for
    every writer, against a directory of another kind (or of the same kind from another command)."""
    monkeypatch.chdir(tmp_path)
    other = ("generate", outdir.CORPUS) if command in ("evaluate", "classify", "tokenize") else ("dp-tune", outdir.MODEL)
    if command == "dp-tune":
        other = ("pretrain", outdir.MODEL)
    out = tmp_path / "theirs"
    before = _finished(out, other[1], other[0], {"manifest.json": "{}", "privacy_report.json": '{"private": true}'})
    target = str(out / "m.json") if command == "classify" else str(out)
    rc, err = _dpsynth(capsys, command, *[a.replace("OUT/m.json", target).replace("OUT", target)
                                          for a in WRITERS[command]])
    assert rc == 2 and len(err) == 1 and "holds a " in err[0] and f"of `dpsynth {other[0]}`" in err[0], err
    assert _tree(out) == before


def test_a_copied_model_without_its_run_record_is_not_overwritten(tiny_base, tmp_path, capsys):  # noqa: F811
    base_dir, _ = tiny_base
    copy = tmp_path / "lora_copy"
    shutil.copytree(base_dir, copy)
    before = _tree(copy)
    rc, err = _dpsynth(capsys, "generate", "--model", base_dir, "--allow-non-private", "--num-examples", "2",
                       "--out", copy)
    assert rc == 2 and "holds a model directory; `dpsynth generate` would overwrite it" in err[0], err
    rc, err = _dpsynth(capsys, "pretrain", "--corpus", "c", "--tokenizer", "t", "--out", copy)
    assert rc == 2 and "without a dpsynth_run.json" in err[0], err
    assert _tree(copy) == before


def _generate(capsys, model, out, seed, *more):
    return _dpsynth(capsys, "generate", "--model", model, "--allow-non-private", "--labels", "great,other",
                    "--num-examples", "6", "--examples-per-shard", "3", "--max-len", "16", "--seed", seed,
                    "--out", out, *more)


def test_generate_into_one_out_one_run_one_configuration(tiny_base, tmp_path, capsys):  # noqa: F811
    """A second run while the first holds --out refuses at once; after it, another --seed is refused, the
    same flags are an identical rerun (the same bytes), and the corpus is never mixed."""
    base_dir, _ = tiny_base
    out = tmp_path / "synth"
    out.mkdir()
    with open(out / outdir.LOCK_FILE, "w") as lock:  # a run that has just taken the lock
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write(str(os.getpid()))
        lock.flush()
        rc, err = _generate(capsys, base_dir, out, 7)
        assert rc == 2 and len(err) == 1 and f"another run is writing into it now (pid {os.getpid()})" in err[0], err
    assert os.listdir(out) == [outdir.LOCK_FILE]
    rc, err = _generate(capsys, base_dir, out, 7)
    assert rc == 0, err
    first = _tree(out)
    rc, err = _generate(capsys, base_dir, out, 8)
    assert rc == 2 and len(err) == 1 and "another configuration (differs in --seed)" in err[0], err
    assert _tree(out) == first
    rc, err = _generate(capsys, base_dir, out, 7, "--cores-per-worker", "1")  # not configuration: an identical rerun
    assert rc == 0 and _tree(out) == first, err


def test_readers_refuse_a_corpus_whose_run_did_not_finish(tiny_base, tmp_path, capsys):  # noqa: F811
    """Issue 35 case 6: a corpus without manifest.json (the run failed or was killed) is read by nobody."""
    base_dir, _ = tiny_base
    synth = tmp_path / "synth"
    assert _generate(capsys, base_dir, synth, 7)[0] == 0
    real = tmp_path / "real.jsonl"
    real.write_text("".join(json.dumps(r) + "\n" for r in make_records(20, 1)))
    os.remove(synth / "manifest.json")
    rc, err = _dpsynth(capsys, "evaluate", "--synthetic", synth, "--real-train", real, "--real-test", real,
                       "--out", tmp_path / "eval", "--classifiers", "none", "--no-perplexity")
    assert rc == 2 and len(err) == 1 and "a synthetic corpus without its manifest.json" in err[0], err
    assert not os.path.exists(tmp_path / "eval" / "metrics.json")
    rc, err = _dpsynth(capsys, "classify", "--train", synth / "train.jsonl", "--valid", synth / "train.jsonl",
                       "--test", real, "--out", tmp_path / "c.json")
    assert rc == 2 and len(err) == 1 and "without its manifest.json" in err[0], err


# Trials of the concurrent-writer test (the target is 20 of 20; 3 keep `make test-slow` short).
CONCURRENT_TRIALS = int(os.environ.get("DPSYNTH_CONCURRENT_TRIALS", "3"))
CORPUS_FILES = ("train.jsonl", "manifest.json", "generation_config.json")


@pytest.mark.slow  # 3 x 2 generate processes (~25 s each on a loaded CPU)
def test_two_concurrent_generate_runs_one_refuses_and_the_corpus_is_a_lone_runs(tiny_base, tmp_path):  # noqa: F811
    base_dir, _ = tiny_base
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def cmd(seed, out):
        return [sys.executable, "-m", "dpsynth.cli", "generate", "--model", base_dir, "--allow-non-private",
                "--labels", "great,other", "--num-examples", "20", "--examples-per-shard", "5", "--max-len", "16",
                "--seed", str(seed), "--out", str(out)]

    lone = {}
    for seed in (7, 8):
        subprocess.run(cmd(seed, tmp_path / f"lone{seed}"), env=env, check=True, capture_output=True)
        lone[seed] = {name: (tmp_path / f"lone{seed}" / name).read_bytes() for name in CORPUS_FILES}
    for trial in range(CONCURRENT_TRIALS):
        out = tmp_path / f"both{trial}"
        procs = {s: subprocess.Popen(cmd(s, out), env=env, stderr=subprocess.PIPE, text=True) for s in (7, 8)}
        result = {s: (p.wait(), p.stderr.read()) for s, p in procs.items()}
        winners = [s for s, (rc, _) in result.items() if rc == 0]
        assert len(winners) == 1, result
        rc, err = result[15 - winners[0]]
        lines = [line for line in err.splitlines() if "error" in line]
        assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
        assert "another run is writing into it now" in lines[0] or "differs in --seed" in lines[0], lines
        assert {name: (out / name).read_bytes() for name in CORPUS_FILES} == lone[winners[0]]

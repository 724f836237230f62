"""`dpsynth.outdir`: one run of one command per output directory (kinds, configurations, the lock, writability)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dpsynth import outdir
from dpsynth.outdir import OutDirError

CFG = {"seed": 7, "num_examples": 10, "out": "ignored", "verbose": True}


def _claim(out, kind=outdir.CORPUS, command="generate", config=CFG, **kw):
    return outdir.claim(str(out), kind=kind, command=command, config=config, **kw)


def _files(path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else None


# ------------------------------------------------------------------------------------------ writability
def test_unwritable_paths_are_one_line_errors_and_nothing_is_created(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for path, why in ((afile / "out", "is a file, not a directory"), (afile, "exists and is not a directory"),
                      ("/proc/dpsynth-out/x", "not writable")):  # /proc refuses new files even to root
        with pytest.raises(OutDirError, match=why) as e:
            outdir.check_writable(str(path), "--audit-dir")
        assert str(e.value).startswith(f"--audit-dir {path}") and "\n" not in str(e.value)
    outdir.check_writable(str(tmp_path / "new" / "deeper"))  # creatable: fine, and not created
    assert _files(tmp_path) == ["afile"]


def test_a_probe_write_decides_not_os_access(tmp_path, monkeypatch):
    """Root passes `os.access` on a read-only disk: the probe file is what is trusted."""
    real_open = os.open

    def read_only(path, flags, *args):
        if ".dpsynth-probe" in str(path):
            raise OSError(30, "Read-only file system", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(OutDirError, match="--out .*: not writable: Read-only file system"):
        outdir.check_writable(str(tmp_path))


def test_claim_checks_every_directory_before_creating_any(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OutDirError, match="--state-dir"):
        with _claim(tmp_path / "out", writable=(("--state-dir", str(afile / "state")),)):
            pytest.fail("the run must not start")
    assert _files(tmp_path) == ["afile"]


# ------------------------------------------------------------------------------------------ ownership
def test_a_new_directory_gets_a_run_record_without_the_values(tmp_path):
    out = tmp_path / "out"
    with _claim(out, config={**CFG, "label_source": "/home/alice/patients.csv"}) as record:
        assert _files(out) == [outdir.LOCK_FILE, outdir.RUN_FILE]
    assert _files(out) == [outdir.RUN_FILE]  # the lock file goes with the run
    on_disk = json.loads((out / outdir.RUN_FILE).read_text())
    assert on_disk == record and on_disk["kind"] == "corpus" and on_disk["command"] == "generate"
    assert set(on_disk["config"]) == {"seed", "num_examples", "label_source"}  # --out, --verbose: not configuration
    assert "alice" not in (out / outdir.RUN_FILE).read_text()


@pytest.mark.parametrize("owner_only", [True, False])
def test_the_run_files_of_an_owner_only_directory_are_owner_only(tmp_path, owner_only):
    """A sensitive token corpus, an audit or a probe is made 0700 before the claim: its run record and
    lock file are 0600 there, not protected by the directory's mode alone; elsewhere the umask's."""
    out = tmp_path / "out"
    out.mkdir(mode=0o700 if owner_only else 0o755)
    os.chmod(out, 0o700 if owner_only else 0o755)
    old = os.umask(0o022)
    try:
        with _claim(out):
            modes = {name: os.stat(out / name).st_mode & 0o777 for name in (outdir.LOCK_FILE, outdir.RUN_FILE)}
    finally:
        os.umask(old)
    assert modes == dict.fromkeys((outdir.LOCK_FILE, outdir.RUN_FILE), 0o600 if owner_only else 0o644)


def test_same_configuration_continues_and_execution_flags_do_not_count(tmp_path):
    out = tmp_path / "out"
    with _claim(out):
        (out / "train.jsonl").write_text("{}\n")
    with _claim(out, config={**CFG, "resume": True, "verbose": False, "threads": 8, "out": "elsewhere"}):
        pass
    with _claim(out, config={**CFG, "batch_size": 64}, ignore=("batch_size",)):
        pass
    assert (out / "train.jsonl").read_text() == "{}\n"


def test_another_configuration_is_refused_naming_the_flags(tmp_path):
    out = tmp_path / "out"
    with _claim(out):
        (out / "train.jsonl").write_text("{}\n")
    with pytest.raises(OutDirError, match=r"another configuration \(differs in --num-examples, --seed\)"):
        with _claim(out, config={**CFG, "seed": 8, "num_examples": 11}):
            pytest.fail("refused")
    with pytest.raises(OutDirError, match=r"differs in --temperature"):
        with _claim(out, config={**CFG, "temperature": 0.5}):
            pytest.fail("refused")


def _parser(**extra_defaults):
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-examples", type=int, default=10)
    for name, default in extra_defaults.items():
        p.add_argument("--" + name.replace("_", "-"), default=default)
    return p


def test_a_run_recorded_before_a_flag_existed_resumes_while_the_new_flag_is_at_its_default(tmp_path):
    """An upgrade adds `--min-p` (default None): the older run's record lacks it. The same run resumes;
    a new flag at another value, a changed old flag or a flag that no longer exists is refused."""
    out = tmp_path / "out"
    with _claim(out):  # the older dpsynth: no --min-p
        (out / "train.jsonl").write_text("{}\n")
    newer = _parser(min_p=None)
    with _claim(out, config={**CFG, "min_p": None}, parser=newer):
        pass
    with pytest.raises(OutDirError, match=r"differs in --min-p\)"):
        with _claim(out, config={**CFG, "min_p": 0.1}, parser=newer):
            pytest.fail("refused")
    with pytest.raises(OutDirError, match=r"differs in --seed\)"):
        with _claim(out, config={**CFG, "seed": 8, "min_p": None}, parser=newer):
            pytest.fail("refused")
    without_num_examples = {k: v for k, v in CFG.items() if k != "num_examples"}
    with pytest.raises(OutDirError, match=r"differs in --num-examples\)"):  # a flag the newer code lacks
        with _claim(out, config=without_num_examples, parser=newer):
            pytest.fail("refused")
    with pytest.raises(OutDirError, match=r"differs in --min-p\)"):  # no parser: every flag counts
        with _claim(out, config={**CFG, "min_p": None}):
            pytest.fail("refused")
    assert (out / "train.jsonl").read_text() == "{}\n"


@pytest.mark.parametrize("kind,command", [(outdir.MODEL, "pretrain"), (outdir.EVALUATION, "evaluate"),
                                          (outdir.MODEL, "dp-tune")])
def test_another_kind_or_command_is_refused_and_nothing_is_touched(tmp_path, kind, command):
    out = tmp_path / "out"
    with _claim(out, kind=outdir.MODEL, command="dp-tune", config={"epsilon": 3}):
        (out / "manifest.json").write_text("{}")
    before = {p: (out / p).read_bytes() for p in os.listdir(out)}
    if command == "dp-tune":  # the same command and kind: only the configuration differs
        with pytest.raises(OutDirError, match="another configuration"):
            with _claim(out, kind=kind, command=command, config={"epsilon": 8}):
                pass
    else:
        theirs = "an evaluation report" if kind == outdir.EVALUATION else "a model directory"
        with pytest.raises(OutDirError, match=f"holds a model directory of `dpsynth dp-tune`; `dpsynth {command}` "
                                              f"would overwrite it with {theirs}"):
            with _claim(out, kind=kind, command=command):
                pass
    assert {p: (out / p).read_bytes() for p in os.listdir(out)} == before


@pytest.mark.parametrize("files,kind", [
    ({"manifest.json": {"format": "dpsynth.model"}}, "a model directory"),
    ({"manifest.json": {"format": "dpsynth.synthetic"}}, "a synthetic corpus"),
    ({"manifest.json": {"format": "dpsynth.tokens", "kind": "public"}}, "a token corpus"),
    ({"contamination.json": {"format": "dpsynth.contamination"}}, "a dedup output"),
    ({"metrics.json": {"format": "dpsynth.metrics"}}, "an evaluation report"),
    ({"generation_config.json": {"format": "dpsynth.synthetic"}}, "a synthetic corpus"),
])
def test_directories_written_before_run_records_are_recognised(tmp_path, files, kind):
    out = tmp_path / "old"
    out.mkdir()
    for name, value in files.items():
        (out / name).write_text(json.dumps(value))
    with pytest.raises(OutDirError, match=f"holds {kind}"):
        with _claim(out, kind=outdir.EVALUATION, command="evaluate"):
            pass
    if kind == "a synthetic corpus":  # its own kind, but no record of its configuration
        with pytest.raises(OutDirError, match="without a dpsynth_run.json"):
            with _claim(out):
                pass
    assert outdir.LOCK_FILE not in os.listdir(out)


@pytest.mark.parametrize("kind,command", [(outdir.CORPUS, "generate"), (outdir.CORPUS, "select"),
                                          (outdir.EVALUATION, "evaluate"), (outdir.MODEL, "dp-tune")])
def test_a_non_empty_directory_dpsynth_did_not_write_is_refused_and_left_alone(tmp_path, kind, command):
    """A user's own directory as --out: its files would be overwritten (train.jsonl) or published (thesis.txt)."""
    mine = tmp_path / "userdir"
    mine.mkdir()
    (mine / "thesis.txt").write_text("keep")
    (mine / "train.jsonl").write_text('{"text": "x", "label": "great"}\n')
    (mine / "metrics.json").write_text('{"selected": 1}')  # e.g. a `classify --out` file: not an evaluation
    with pytest.raises(OutDirError, match=r"userdir: a non-empty directory that no dpsynth run wrote \(it holds "
                                          r"metrics.json, thesis.txt, train.jsonl\); .*choose a new or empty --out") as e:
        with _claim(mine, kind=kind, command=command):
            pytest.fail("the run must not start")
    assert "\n" not in str(e.value)
    assert _files(mine) == ["metrics.json", "thesis.txt", "train.jsonl"]  # no lock file, no run record
    assert (mine / "thesis.txt").read_text() == "keep"


def test_an_empty_directory_or_one_holding_only_temporary_leftovers_is_used(tmp_path):
    (tmp_path / "empty").mkdir()
    with _claim(tmp_path / "empty"):
        (tmp_path / "empty" / "train.jsonl").write_text("{}\n")
    (tmp_path / "left").mkdir()
    (tmp_path / "left" / f"train.jsonl{outdir.fileio.TMP_MARK}123-abc").write_text("{")  # a killed writer's
    with _claim(tmp_path / "left"):
        pass


def test_a_refused_or_failed_run_that_wrote_nothing_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with _claim(tmp_path / "out"):
            raise RuntimeError("bad flag found late")
    assert _files(tmp_path) == []
    with _claim(tmp_path / "out", config={**CFG, "seed": 99}):  # so another configuration is no conflict
        pass
    (tmp_path / "mine").mkdir()
    with pytest.raises(RuntimeError):
        with _claim(tmp_path / "mine"):
            raise RuntimeError("x")
    assert _files(tmp_path / "mine") == []  # the user's (empty) directory stays, without the lock file


def test_a_failed_run_that_wrote_outputs_keeps_its_record(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with _claim(out):
            (out / "shards").mkdir()
            raise RuntimeError("killed")
    with pytest.raises(OutDirError, match="another configuration"):
        with _claim(out, config={**CFG, "seed": 8}):
            pass
    with _claim(out):  # the resume
        pass


# ------------------------------------------------------------------------------------------ siblings
def test_a_users_non_empty_sibling_directory_is_refused_before_anything_is_written(tmp_path):
    out, private = tmp_path / "out", tmp_path / "out.private"
    private.mkdir()
    (private / "notes.txt").write_text("mine")
    with pytest.raises(OutDirError, match=r"--state-dir .*out.private: a non-empty directory that no dpsynth run "
                                          r"made \(it holds notes.txt\)"):
        with _claim(out, siblings=(("--state-dir", str(private)),)):
            pytest.fail("the run must not start")
    assert _files(tmp_path) == ["out.private"] and _files(private) == ["notes.txt"]


def test_a_sibling_a_run_made_is_its_own_on_the_rerun(tmp_path):
    """Marked when the run ends (also a failed one: a select that stopped at its dead letters reruns);
    an unmarked sibling of a directory that a dpsynth run owns (made before the mark existed) is that run's."""
    out, private = tmp_path / "out", tmp_path / "out.private"
    sib = (("private state", str(private)),)
    with pytest.raises(RuntimeError):
        with _claim(out, siblings=sib):
            private.mkdir()
            (private / "dead_letters.jsonl").write_text("{}\n")
            raise RuntimeError("too many dead letters")
    assert _files(tmp_path) == ["out.private"]  # the failed run left nothing in --out
    assert _files(private) == [outdir.SIBLING_MARK, "dead_letters.jsonl"]
    assert oct(os.stat(private / outdir.SIBLING_MARK).st_mode & 0o777) == "0o600"
    with _claim(out, siblings=sib):  # the rerun
        (out / "train.jsonl").write_text("{}\n")
    os.remove(private / outdir.SIBLING_MARK)  # as a run of an older dpsynth left it
    with _claim(out, siblings=sib):
        pass
    assert (private / outdir.SIBLING_MARK).exists()
    import shutil  # moved together (the mark names the old --out): still the run's

    shutil.move(str(out), str(tmp_path / "moved"))
    shutil.move(str(private), str(tmp_path / "moved.private"))
    with _claim(tmp_path / "moved", siblings=(("private state", str(tmp_path / "moved.private")),)):
        pass
    # One --audit-dir for two runs: the second, into a new --out, would overwrite the first's files.
    with pytest.raises(OutDirError, match=r"--audit-dir .*moved.private: a non-empty directory that a run into "
                                          r"another --out, .*/out, made \(it holds"):
        with _claim(tmp_path / "second", siblings=(("--audit-dir", str(tmp_path / "moved.private")),)):
            pytest.fail("refused")


# ------------------------------------------------------------------------------------------ the lock
def test_a_second_run_into_a_busy_directory_refuses_at_once(tmp_path):
    out = tmp_path / "out"
    with _claim(out):
        with pytest.raises(OutDirError, match=rf"another run is writing into it now \(pid {os.getpid()}\)") as e:
            with _claim(out):
                pytest.fail("two runs held one directory")
        assert "\n" not in str(e.value)
    with _claim(out):  # released at the end of the run
        pass


def test_the_lock_file_is_removed_when_the_run_ends(tmp_path):
    out = tmp_path / "out"
    with _claim(out):
        (out / "train.jsonl").write_text("{}\n")
    assert _files(out) == [outdir.RUN_FILE, "train.jsonl"]
    with pytest.raises(RuntimeError):
        with _claim(out):
            assert (out / outdir.LOCK_FILE).exists()
            raise RuntimeError("failed")
    assert _files(out) == [outdir.RUN_FILE, "train.jsonl"]


def test_a_run_that_opened_the_lock_file_before_it_was_removed_retries(tmp_path, monkeypatch):
    """Run A ends (unlinks its lock file, releases it) between run B's open and B's flock: B's flock
    succeeds on the unlinked file. B must see that the path names another file and lock the new one;
    else a third run C would lock a new file beside B and both would write."""
    import contextlib
    import fcntl

    out = tmp_path / "out"
    a = contextlib.ExitStack()
    a.enter_context(_claim(out))
    real_flock, calls = fcntl.flock, []

    def flock(fd, op):
        if not calls:
            a.close()  # A ends now
        result = real_flock(fd, op)
        calls.append(os.fstat(fd).st_nlink)  # 0: the file B locked is no longer in the directory
        return result

    monkeypatch.setattr(outdir.fcntl, "flock", flock)
    with _claim(out):  # B
        monkeypatch.setattr(outdir.fcntl, "flock", real_flock)
        assert calls == [0, 1]  # retried on the new file
        with pytest.raises(OutDirError, match="another run is writing into it now"):
            with _claim(out):  # C
                pytest.fail("two runs held one directory")
    assert _files(out) == [outdir.RUN_FILE]


def _holder(out, ready):
    code = textwrap.dedent(f"""
        import os, time
        from dpsynth import outdir
        with outdir.claim({str(out)!r}, kind="corpus", command="generate", config={{"seed": 7, "num_examples": 10}}):
            open({str(ready)!r}, "w").close()
            time.sleep(60)
    """)
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-c", code], env=env)


def test_another_process_holds_the_lock_until_it_is_killed(tmp_path):
    """A run killed with SIGKILL leaves no stale lock (flock dies with the process); the resume continues."""
    out, ready = tmp_path / "out", tmp_path / "ready"
    proc = _holder(out, ready)
    try:
        for _ in range(600):
            if ready.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert ready.exists(), "the holder did not start"
        with pytest.raises(OutDirError, match=f"another run is writing into it now \\(pid {proc.pid}\\)"):
            with _claim(out, config={"seed": 7, "num_examples": 10}):
                pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with _claim(out, config={"seed": 7, "num_examples": 10}):
        pass


# ------------------------------------------------------------------------------------------ readers
def _corpus(out, manifest=True):
    with _claim(out):
        (out / "train.jsonl").write_text('{"label": "a", "text": "x"}\n')
        if manifest:
            (out / "manifest.json").write_text(json.dumps({"format": "dpsynth.synthetic", "splits": {"train": {
                "files": {"jsonl": {"path": "train.jsonl",
                                    "sha256": outdir.fileio.sha256_file(str(out / "train.jsonl"))}}}}}))


def test_require_corpus(tmp_path):
    _corpus(tmp_path / "done")
    outdir.require_corpus(str(tmp_path / "done"))
    outdir.require_corpus_file(str(tmp_path / "done" / "train.jsonl"))
    _corpus(tmp_path / "unfinished", manifest=False)
    with pytest.raises(OutDirError, match="unfinished: a synthetic corpus without its manifest.json"):
        outdir.require_corpus(str(tmp_path / "unfinished"))
    with pytest.raises(OutDirError, match="without its manifest.json"):
        outdir.require_corpus_file(str(tmp_path / "unfinished" / "train.jsonl"))
    (tmp_path / "done" / "train.jsonl").write_text('{"label": "a", "text": "mixed"}\n')
    with pytest.raises(OutDirError, match="train.jsonl: missing or not the train split its manifest.json records"):
        outdir.require_corpus(str(tmp_path / "done"))
    with _claim(tmp_path / "model", kind=outdir.MODEL, command="dp-tune"):
        pass
    with pytest.raises(OutDirError, match="holds a model directory of `dpsynth dp-tune`, not a synthetic corpus"):
        outdir.require_corpus(str(tmp_path / "model"))
    (tmp_path / "by_hand").mkdir()
    (tmp_path / "by_hand" / "train.jsonl").write_text("{}\n")
    outdir.require_corpus(str(tmp_path / "by_hand"))  # no dpsynth run wrote it: read as today
    outdir.require_corpus_file(str(tmp_path / "real_train.csv"))


def test_check_file_out(tmp_path):
    _corpus(tmp_path / "synth")
    with pytest.raises(OutDirError, match="--out: .*synth holds a synthetic corpus of `dpsynth generate`"):
        outdir.check_file_out(str(tmp_path / "synth" / "metrics.json"), command="classify")
    with pytest.raises(OutDirError, match="--privacy-report: .*synth holds"):
        outdir.check_file_out(str(tmp_path / "m.json"), command="classify", privacy_dir=str(tmp_path / "synth"))
    with pytest.raises(OutDirError, match="is a directory"):
        outdir.check_file_out(str(tmp_path / "synth"), command="classify")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OutDirError, match="not a directory"):
        outdir.check_file_out(str(tmp_path / "afile" / "m.json"), command="classify")
    outdir.check_file_out(str(tmp_path / "results" / "m.json"), command="classify")


def test_without_run_files():
    assert outdir.without_run_files([outdir.RUN_FILE, outdir.LOCK_FILE, "config.json"]) == ["config.json"]
    with pytest.raises(ValueError, match="unknown output kind"):
        outdir.run_record("weights", "x")


def test_a_secret_flag_is_recorded_as_set_or_unset_never_as_its_hash():
    """dp-tune's and select's --seed is withheld from the release: a hash of a small integer would give it back."""
    a = outdir.run_record(outdir.MODEL, "dp-tune", {"seed": 7, "steps": 3}, secret=("seed",))
    b = outdir.run_record(outdir.MODEL, "dp-tune", {"seed": 8, "steps": 3}, secret=("seed",))
    plain = outdir.run_record(outdir.MODEL, "dp-tune", {"seed": 7, "steps": 3})
    assert a["config"]["seed"] == "set" and plain["config"]["seed"] not in json.dumps(a)
    assert a == b and a["config"]["steps"] == plain["config"]["steps"]
    assert outdir.run_record(outdir.MODEL, "dp-tune", {"seed": None}, secret=("seed",))["config"]["seed"] == "unset"

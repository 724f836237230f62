"""dpsynth.errors: one base (`DpsynthError`) for every user error, printed in one place as one line.

Checked: every exception class defined in dpsynth (and its entry points) is a `DpsynthError`,
apart from a justified allow-list; each keeps a standard base (so `except ValueError` still
catches it) and survives pickling and Apache Beam's re-raise; `errors.command` and the
`dpsynth` dispatcher print one line and return 2; and `dpsynth COMMAND` on a bad input, for
many commands, returns 2 with exactly one line on stderr and no traceback.
"""

import ast
import importlib
import inspect
import os
import pickle
import pkgutil

import pytest
import yaml

import beam_jobs
import dpsynth
import trainers
from dpsynth import cli, errors
from dpsynth.errors import DpsynthError
from tests.data.bad_inputs import write_case
from tests.test_bad_inputs import tokenizer  # noqa: F401 (fixture)

PACKAGES = (dpsynth, trainers, beam_jobs)
FIRST_PARTY = tuple(p.__name__ for p in PACKAGES)

# Exception classes dpsynth defines that are deliberately NOT user errors, and why.
NOT_USER_ERRORS = {
    # The experiment runner's outcome carriers, caught by its scheduler and reported with their own
    # documented exit codes (docs/experiment.md): 3, a stage's library is missing; 1, a stage raised
    # (anything, bugs included: the cause's traceback is printed). Never a one-line exit 2.
    "dpsynth.experiment.cache.StageUnavailable",
    "dpsynth.experiment.cache.StageFailed",
}


def _exception_classes() -> dict:
    """Every exception class defined at the top of a module of dpsynth, trainers or beam_jobs."""
    found = {}
    for package in PACKAGES:
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            try:
                module = importlib.import_module(info.name)
            except ImportError as e:  # an optional dependency (transformers, torch, ...) not installed
                if (e.name or "").split(".")[0] in FIRST_PARTY:
                    raise
                continue
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if cls.__module__ == module.__name__ and issubclass(cls, BaseException):
                    found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


@pytest.fixture(scope="module")
def exception_classes():
    return _exception_classes()


def _user_errors(classes):
    return [c for c in classes.values() if issubclass(c, DpsynthError) and c is not DpsynthError]


def test_every_exception_class_is_a_dpsynth_error_or_justified(exception_classes):
    assert len(exception_classes) >= 25, sorted(exception_classes)
    assert NOT_USER_ERRORS <= set(exception_classes), "a stale allow-list entry"
    outside = sorted(n for n, c in exception_classes.items() if not issubclass(c, DpsynthError))
    assert outside == sorted(NOT_USER_ERRORS), outside


def test_user_errors_keep_a_standard_base(exception_classes):
    """`except ValueError` (or RuntimeError, FileNotFoundError) code keeps catching them."""
    for cls in _user_errors(exception_classes):
        builtin = [b for b in cls.__mro__ if b.__module__ == "builtins" and b not in (Exception, BaseException, object)]
        assert builtin, f"{cls.__qualname__} lost its standard base: {cls.__mro__}"


def test_user_errors_survive_pickling_and_beams_reraise(exception_classes):
    """Errors cross process boundaries (runner workers, Beam workers); Beam re-raises a step's error
    as `type(e)(e.args[0] + " [while running 'STEP']", *e.args[1:])`: still the same class."""
    for cls in _user_errors(exception_classes):
        e = cls("data/x.jsonl: record 3: bad")
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is cls and str(back) == str(e) and isinstance(back, DpsynthError)
        again = type(e)(e.args[0] + " [while running 'Read']", *e.args[1:])
        assert isinstance(again, cls) and errors.error_line(again) == "data/x.jsonl: record 3: bad [while running 'Read']"


def test_errors_module_imports_nothing_from_dpsynth():
    tree = ast.parse(open(errors.__file__, encoding="utf-8").read())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not any(name.split(".")[0] in FIRST_PARTY for name in names), names


# ----------------------------------------------------------------------------- the one formatter


def test_command_prints_one_line_and_returns_2(capsys):
    from dpsynth.experiment.config import ConfigError

    def failing(error):
        @errors.command("x", also=(KeyError,))
        def main(argv=None):
            raise error
        return main

    cases = [
        (DpsynthError("bad input\nTraceback (most recent call last): ..."), "dpsynth x: error: bad input"),
        (DpsynthError(""), "dpsynth x: error: DpsynthError"),
        (ConfigError("dp_tune.epsilons[0]: must be > 0"), "dpsynth x: config error: dp_tune.epsilons[0]: must be > 0"),
        (KeyError("k"), "dpsynth x: error: 'k'"),
        (FileNotFoundError(2, "No such file or directory", "in.csv"), None),
    ]
    for error, line in cases:
        if line is None:  # neither a DpsynthError nor in `also`: propagates (with its traceback)
            with pytest.raises(FileNotFoundError):
                failing(error)([])
            continue
        assert failing(error)([]) == errors.EXIT_USER_ERROR == 2
        assert capsys.readouterr().err == line + "\n"
    ok = errors.command("x")(lambda argv=None: 0)
    assert ok([]) == 0 and capsys.readouterr().err == ""


def test_error_line_names_the_file_of_a_file_system_error():
    assert errors.error_line(PermissionError(13, "Permission denied", "out/x")) == "out/x: Permission denied"
    assert errors.error_line(errors.MissingFileError("m/tok.model: tokenizer model not found")) == \
        "m/tok.model: tokenizer model not found"


def _raise_user_error(argv):
    raise errors.MissingFileError(f"{argv[0]}: not found\n(second line)")


def test_the_dispatcher_reports_an_undecorated_command(monkeypatch, capsys):
    monkeypatch.setitem(cli.COMMANDS, "boom", (f"{__name__}:_raise_user_error", "raises"))
    assert cli.main(["boom", "in.csv"]) == 2
    assert capsys.readouterr().err == "dpsynth boom: error: in.csv: not found\n"


# ----------------------------------------------------------------------------- `dpsynth COMMAND` on bad inputs


def _argv(case, tmp, tokenizer):  # noqa: F811
    """(argv of `dpsynth ...`, a substring the error line must hold) for one bad-input case."""
    missing = str(tmp / "missing.jsonl")
    out = str(tmp / "out")
    clean = tmp / "clean.csv"
    clean.write_text("text,label\na b,great\nc d,other\n")
    if case == "privacy-unreachable-epsilon":
        return ["privacy", "--dataset-size", "1000", "--batch-size", "1000", "--steps", "100000", "--epsilon",
                "1e-5"], "unreachable"
    if case == "privacy-user-level-without-users":
        return ["privacy", "--privacy-unit", "user", "--batch-size", "60", "--steps", "40", "--epsilon", "1"], \
            "--num-users"
    if case == "dp-tune-missing-train":
        return ["dp-tune", "--base", str(tmp / "no_base"), "--train", missing, "--out", out, "--batch-size", "1",
                "--steps", "1"], "missing.jsonl"
    if case == "dp-tune-malformed-train":
        path, (_, reason) = write_case(tmp, "csv_duplicate_header")
        return ["dp-tune", "--base", str(tmp / "no_base"), "--train", path, "--out", out, "--batch-size", "1",
                "--steps", "1"], reason
    if case == "generate-missing-model":
        return ["generate", "--model", str(tmp / "no_model"), "--num-examples", "2", "--out", out], "no_model"
    if case == "tokenize-missing-tokenizer":
        return ["tokenize", "--input", str(clean), "--tokenizer", str(tmp / "no.model"), "--out", out], "no.model"
    if case == "tokenize-malformed-input":
        path, (_, reason) = write_case(tmp, "gzip_truncated")
        return ["tokenize", "--input", path, "--kind", "sensitive", "--tokenizer", tokenizer, "--out", out], reason
    if case == "dedup-missing-tokenizer":
        return ["dedup", "--public", str(clean), "--sensitive", f"s={clean}", "--tokenizer", str(tmp / "no.model"),
                "--out", out], "no.model"
    if case == "classify-missing-train":
        return ["classify", "--train", missing, "--valid", missing, "--test", missing, "--out", out], "missing.jsonl"
    if case == "import-model-missing-dir":
        return ["import-model", "--hf", str(tmp / "no_hf"), "--out", out], "no_hf"
    if case == "tokenizer-missing-corpus":
        return ["tokenizer", "train", "--corpus", missing, "--vocab-size", "100", "--out", out], "missing.jsonl"
    config = tmp / "exp.yaml"
    if case == "experiment-bad-config":
        config.write_text(yaml.safe_dump({"out": out, "dp_tune": {"epsilons": [0]}}))
        return ["experiment", str(config), "--dry-run"], "dp_tune.epsilons[0]: must be > 0"
    if case == "experiment-invalid-yaml":
        config.write_text("out: [unclosed\nsensitive: {\n")
        return ["experiment", str(config)], "not valid YAML"
    if case == "experiment-missing-config":
        return ["experiment", str(tmp / "none.yaml")], "config file not found"
    if case == "demo-bad-config":
        config.write_text(yaml.safe_dump({"out": out, "dp_tune": {"epsilons": [-1]}}))
        return ["demo", "--config", str(config), "--out", out], "must be > 0"
    raise AssertionError(case)


CLI_CASES = ("privacy-unreachable-epsilon", "privacy-user-level-without-users", "dp-tune-missing-train",
             "dp-tune-malformed-train", "generate-missing-model", "tokenize-missing-tokenizer",
             "tokenize-malformed-input", "dedup-missing-tokenizer", "classify-missing-train",
             "import-model-missing-dir", "tokenizer-missing-corpus", "experiment-bad-config",
             "experiment-invalid-yaml", "experiment-missing-config", "demo-bad-config")

STARTS_A_JOB = {"tokenize-malformed-input"}  # fails while reading, inside the Beam job


@pytest.mark.parametrize("case", CLI_CASES)
def test_a_bad_input_is_one_line_and_exit_2(case, tmp_path, tokenizer, capsys):  # noqa: F811
    argv, reason = _argv(case, tmp_path, tokenizer)
    importlib.import_module(cli.COMMANDS[argv[0]][0].split(":")[0])  # (import-time library notices: not ours)
    capsys.readouterr()
    rc = cli.main(argv)
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert rc == 2 and [line for line in lines if "error" in line.lower()] == lines[-1:], captured.err
    assert len(lines) == 1 or case in STARTS_A_JOB, captured.err  # (a job's progress line comes before its error)
    assert lines[-1].startswith((f"dpsynth {argv[0]}: error: ", f"dpsynth {argv[0]}: config error: ")), lines
    assert reason in lines[-1] and "Traceback" not in captured.err + captured.out, captured.err
    assert not os.path.exists(tmp_path / "out" / "manifest.json")

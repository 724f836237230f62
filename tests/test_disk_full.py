"""A full disk: every published file appears whole or not at all, the error is one line naming the
file (exit 2), and a rerun once there is space writes the same bytes as an uninterrupted run.

The disk is a fake (`FullDisk`): writes to the files it watches raise `OSError(ENOSPC)` once they
have written `free` bytes (the bytes that fit are written first, as a real write does), so the test
runs anywhere. `test_a_real_full_tmpfs` also fills a real 1 MiB tmpfs where this process may mount one.
"""

import builtins
import errno
import json
import os
import shutil
import subprocess
import sys

import pytest

from dpsynth import errors, fileio
from dpsynth.errors import DiskFullError


class _Limited:
    """A file object whose writes stop with ENOSPC once the shared budget is spent."""

    def __init__(self, f, disk):
        self._f, self._disk = f, disk

    def write(self, data):
        n = len(data.encode("utf-8") if isinstance(data, str) else data)
        if n > self._disk.free:
            fit = self._disk.free
            if fit and not isinstance(data, str):
                self._f.write(data[:fit])
            self._disk.free = 0
            self._f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
        self._disk.free -= n
        return self._f.write(data)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


class FullDisk:
    """Patches `open` and `os.fdopen`: a file opened for writing whose path contains `where` (under
    `root`) shares a budget of `free` bytes. `fileio` writes through `os.fdopen` and `open`."""

    def __init__(self, monkeypatch, root, where, free):
        self.root, self.where, self.free = str(root), where, free
        real_open, real_fdopen = builtins.open, os.fdopen

        def watched(path):
            path = str(path)
            return path.startswith(self.root) and self.where in path

        def fake_open(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+") and watched(file):
                return _Limited(f, self)
            return f

        def fake_fdopen(fd, mode="r", *args, **kwargs):
            path = os.readlink(f"/proc/self/fd/{fd}")
            f = real_fdopen(fd, mode, *args, **kwargs)
            return _Limited(f, self) if any(c in mode for c in "wax+") and watched(path) else f

        monkeypatch.setattr(builtins, "open", fake_open)
        monkeypatch.setattr(os, "fdopen", fake_fdopen)


# The last line of a traceback of the error (a logged one included).
_RAISED = ("OSError", "dpsynth.errors.DiskFullError", "RuntimeError")


def _tree(root):
    """{relative path: bytes} of every file under `root`."""
    out = {}
    for d, _, files in os.walk(root):
        for name in files:
            p = os.path.join(d, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


def _temporaries(root):
    return [p for p in _tree(root) if fileio.TMP_MARK in p]


# ------------------------------------------------------------------------------------------ fileio
@pytest.mark.parametrize("writer", ["write_bytes", "write_json", "open_atomic", "copy_file", "write_bytes_fs"])
def test_each_writer_leaves_the_old_file_or_none_and_names_the_path(tmp_path, monkeypatch, writer):
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 5000)
    path = tmp_path / "out" / "train.jsonl"
    path.parent.mkdir()
    path.write_bytes(b"old\n")
    write = {
        "write_bytes": lambda: fileio.write_bytes(str(path), b"y" * 5000),
        "write_json": lambda: fileio.write_json(str(path), {"k": "y" * 5000}),
        "open_atomic": lambda: _stream(str(path)),
        "copy_file": lambda: fileio.copy_file(str(src), str(path)),
        "write_bytes_fs": lambda: fileio.write_bytes_fs(str(path), b"y" * 5000),
    }[writer]
    disk = FullDisk(monkeypatch, tmp_path / "out", "train.jsonl", free=1000)
    with pytest.raises(DiskFullError) as e:
        write()
    assert str(e.value) == f"no space left on device writing {path}" and e.value.errno == errno.ENOSPC
    assert isinstance(e.value, OSError) and isinstance(e.value, errors.DpsynthError)
    assert disk.free == 0  # the fake did fill the disk (the test can fail)
    assert path.read_bytes() == b"old\n" and os.listdir(path.parent) == ["train.jsonl"]
    monkeypatch.undo()
    write()  # space again
    assert os.listdir(path.parent) == ["train.jsonl"] and path.stat().st_size > 1000


def _stream(path):
    with fileio.open_atomic(path) as f:
        for _ in range(100):
            f.write("y" * 50 + "\n")


def test_copy_file_copies_the_bytes_into_a_new_file(tmp_path):
    src = tmp_path / "a"
    src.write_bytes(os.urandom(3 * fileio.CHUNK_BYTES // 2))
    os.chmod(src, 0o600)  # e.g. a trial's model in the private state, released by a sweep
    old = os.umask(0o022)
    try:
        fileio.copy_file(str(src), str(tmp_path / "b"))
        fileio.copy_file(str(src), str(tmp_path / "c"), mode=0o600)
    finally:
        os.umask(old)
    assert (tmp_path / "b").read_bytes() == src.read_bytes() and (tmp_path / "b").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "c").stat().st_mode & 0o777 == 0o600
    (tmp_path / "t" / "sub").mkdir(parents=True)
    (tmp_path / "t" / "sub" / "f").write_text("f")
    fileio.copy_tree(str(tmp_path / "t"), str(tmp_path / "u"))
    assert _tree(tmp_path / "u") == {os.path.join("sub", "f"): b"f"}


# ------------------------------------------------------------------------------------------ errors
def test_a_full_disk_however_wrapped_is_one_line_exit_2(capsys):
    """Raw (a writer outside fileio), as `DiskFullError`, or as Apache Beam re-raises a step's error."""
    def beam_wrapped():
        try:
            raise DiskFullError.of("/o/shards/train-00000.jsonl")
        except DiskFullError as e:
            raise RuntimeError(f"DiskFullError: {e} [while running 'GenerateShards']") from e

    cases = [(lambda: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device", "/o/m.jsonl")),
              "no space left on device writing /o/m.jsonl"),
             (lambda: (_ for _ in ()).throw(OSError(errno.EDQUOT, "Disk quota exceeded", "/o/q")),
              "disk quota exceeded writing /o/q"),
             (beam_wrapped, "no space left on device writing /o/shards/train-00000.jsonl"),
             (lambda: (_ for _ in ()).throw(RuntimeError(  # from a worker process: text only
                 "Pipeline failed: Traceback ...\ndpsynth.errors.DiskFullError: no space left on device writing "
                 "/o/shards/a b.jsonl [while running 'GenerateShards']\n")),
              "no space left on device writing /o/shards/a b.jsonl")]
    for fail, message in cases:
        main = errors.command("generate")(lambda argv, fail=fail: fail())
        assert main([]) == errors.EXIT_USER_ERROR
        assert capsys.readouterr().err == f"dpsynth generate: error: {message}\n"
    with pytest.raises(RuntimeError):  # anything else is a bug: its traceback is wanted
        errors.command("generate")(lambda argv: (_ for _ in ()).throw(RuntimeError("bug")))([])


# ------------------------------------------------------------------------------------------ generate
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.generate.fakes import write_fake_model_dir
    from tests.generate.test_job import MAX_LEN, TABLE_SEED

    return write_fake_model_dir(str(tmp_path_factory.mktemp("model")), max_len=MAX_LEN, seed=TABLE_SEED)


@pytest.fixture(scope="module")
def generated(model_dir, tmp_path_factory):
    from dpsynth.generate.job import generate
    from tests.generate.fakes import load_fake_bundle
    from tests.generate.test_job import _config

    out = tmp_path_factory.mktemp("uninterrupted")
    generate(_config(model_dir, out), loader=load_fake_bundle)
    return _tree(out)


@pytest.mark.parametrize("where,free", [("/shards/", 700), ("/valid.jsonl", 100), ("/manifest.json", 100)])
def test_generate_on_a_full_disk_then_a_rerun_equals_an_uninterrupted_run(model_dir, generated, tmp_path,
                                                                         monkeypatch, capsys, where, free):
    """Full while a Beam step writes a shard (the error comes back through the pipeline), while a split
    is written after it, or at the manifest: one line; no file partial or under a temporary name."""
    from dpsynth.generate.job import generate
    from tests.generate.fakes import load_fake_bundle
    from tests.generate.test_job import _config

    out = tmp_path / "out"
    main = errors.command("generate")(lambda argv: generate(_config(model_dir, out), loader=load_fake_bundle))
    disk = FullDisk(monkeypatch, out, where, free)
    assert main([]) == errors.EXIT_USER_ERROR
    assert disk.free == 0
    lines = capsys.readouterr().err.splitlines()  # (also progress lines)
    err = [line for line in lines if line.startswith("dpsynth")]
    assert len(err) == 1 and err[0] == lines[-1]
    assert err[0].startswith(f"dpsynth generate: error: no space left on device writing {out}")
    assert where.strip("/") in err[0] and "[while running" not in err[0]
    assert not any(line.startswith(_RAISED) for line in lines)  # no traceback of the error
    partial = _tree(out)
    assert not _temporaries(out)
    assert all(generated[p] == data for p, data in partial.items())  # each file whole, or not there
    monkeypatch.undo()
    generate(_config(model_dir, out), loader=load_fake_bundle)
    assert _tree(out) == generated


# ------------------------------------------------------------------------------------------ select
@pytest.fixture(scope="module")
def select_inputs(tmp_path_factory):
    from tests.evaluate.conftest import make_records
    from tests.evaluate.test_dp_select import tuning_report, write_corpus

    root = str(tmp_path_factory.mktemp("cands"))
    rep = tuning_report()
    paths = [write_corpus(root, "signal", make_records(200, 1, signal=3), make_records(40, 2, signal=3), rep),
             write_corpus(root, "nosignal", make_records(200, 3, signal=0), make_records(40, 4, signal=0), rep)]
    valid = os.path.join(root, "valid.jsonl")
    with open(valid, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in make_records(120, 5, signal=2, prefix="v"))
    return paths, valid


def _select(paths, valid, out):
    from trainers import select as cli

    return cli.main(["--candidates", *paths, "--valid", valid, "--out", str(out), "--epsilon", "50",
                     "--max-epochs", "1", "--seed", "1"])


def test_select_on_a_full_disk_then_a_rerun_equals_an_uninterrupted_run(select_inputs, tmp_path, monkeypatch,
                                                                        capsys):
    """The selected corpus's train.jsonl (a copy of the winner's) on a full disk: not left truncated.
    (The selection's ledger entry carries a fresh random run id per execution, as any rerun's does:
    fixed here, so the rest must be equal byte for byte.)"""
    from dpsynth.dp import ledger

    monkeypatch.setattr(ledger, "new_run_id", lambda: "0" * 32)
    paths, valid = select_inputs
    assert _select(paths, valid, tmp_path / "ref") == 0
    reference = _tree(tmp_path / "ref")
    assert len(reference["train.jsonl"]) > 4096
    capsys.readouterr()
    out = tmp_path / "out"
    with pytest.MonkeyPatch.context() as full:
        disk = FullDisk(full, out, "train.jsonl", free=4096)
        assert _select(paths, valid, out) == errors.EXIT_USER_ERROR
    assert disk.free == 0
    lines = capsys.readouterr().err.splitlines()  # (also progress lines)
    line = f"dpsynth select: error: no space left on device writing {out}/train.jsonl"
    assert [x for x in lines if x.startswith("dpsynth") and ": note: " not in x] == [line] and lines[-1] == line
    assert not any(x.startswith(_RAISED) for x in lines)  # no traceback of the error
    left = _tree(out) if out.exists() else {}  # (a run that failed before it wrote anything leaves nothing)
    assert "train.jsonl" not in left and "manifest.json" not in left and not _temporaries(out)
    assert _select(paths, valid, out) == 0  # the rerun (the same flags: its run record resumes)
    assert _tree(out) == reference


# ------------------------------------------------------------------------------------------ a real tmpfs
def _can_mount():
    return os.geteuid() == 0 and shutil.which("mount") is not None and shutil.which("umount") is not None


@pytest.mark.skipif(not _can_mount(), reason="mounting a tmpfs needs root and mount(8)")
def test_a_real_full_tmpfs(tmp_path):
    """`fileio.write_bytes` of 2 MiB on a 1 MiB tmpfs: `DiskFullError`, no partial file, no temporary."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"mount refused here: {r.stderr.decode(errors='replace').strip()}")
    try:
        code = ("import sys\nfrom dpsynth import errors, fileio\n"
                "main = errors.command('select')(lambda argv: fileio.write_bytes(sys.argv[1], b'x' * (2 << 20)))\n"
                "sys.exit(main([]))\n")
        target = str(mnt / "train.jsonl")
        env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
        r = subprocess.run([sys.executable, "-c", code, target], capture_output=True, env=env)
        assert r.returncode == 2
        assert r.stderr.decode() == f"dpsynth select: error: no space left on device writing {target}\n"
        assert os.listdir(mnt) == []
    finally:
        subprocess.run(["umount", str(mnt)], check=False)

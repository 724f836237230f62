"""Every output directory belongs to one run of one command.

A command that writes a directory (`--out`) enters `claim(out, kind=..., command=..., config=...)`
before any compute. The claim

1. checks that `--out` (and the other directories the run will write, e.g. `--audit-dir`,
   `--state-dir`) can be written, by a probe file in the nearest existing directory (so a
   read-only disk, a path under a regular file or a missing permission is one line, exit 2,
   never a traceback after the compute);
2. holds an exclusive lock (`OUT/.dpsynth_run.lock`, `fcntl.flock`) for the whole run: a second
   run into the same `--out` refuses at once with one line (the lock dies with its process, so
   a run killed with `kill -9` leaves no stale lock);
3. compares the directory's owner with this run: the run record `OUT/dpsynth_run.json`
   ({"format": "dpsynth.run", "kind", "command", "config_sha256", "config": {flag: SHA-256
   prefix of its value}}; the values themselves stay out of the possibly published directory),
   or, in a directory written before run records existed, the kind its manifest or marker
   files show. Another kind (a model directory as the `--out` of `generate`), another command
   of the same kind (`pretrain` into a DP-tuned model) or another configuration (another
   `--seed`) is refused, naming the flags that differ; the same command with the same
   configuration continues (a resume after a kill, or an identical rerun), also when the
   directory's record predates flags added to dpsynth since and this run leaves them at their
   defaults (an upgrade does not strand a half-finished run);
4. refuses a non-empty directory that no dpsynth run wrote (no run record, manifest or marker
   file: a user's own directory, whose files the run would overwrite or publish), and likewise
   a non-empty sibling directory the run writes (`siblings`: `OUT.private`, `OUT.candidates`,
   `--state-dir`, `--audit-dir`) unless `--out` holds a dpsynth run (its sibling, also one moved
   with it or made before the mark existed) or the sibling's `SIBLING_MARK` names this `--out`
   (a rerun after a run that failed before it wrote into `--out`); temporary files
   (`fileio.TMP_MARK`), the run record and the lock do not count;
5. writes the run record (once, when the directory is new), and `SIBLING_MARK` into each
   sibling the run made;
6. removes the lock file when the run ends (success or failure): a finished directory holds
   only what the run wrote. A run that opened the lock file just before it was unlinked finds,
   after its `flock`, that the path no longer names the file it holds, and retries (`_lock`),
   so two runs never both hold "the" lock.

The commands write their own manifest last, so a reader sees a finished run or none (and
`require_corpus` refuses a corpus whose run left no manifest). The kinds are `KINDS`; the
model, corpus and token manifests carry their kind too (field `KIND_FIELD`, "output_kind").

Flags that do not change what a run writes (`EXECUTION_FLAGS`: --verbose, --resume,
--stop-after, where private state goes, threads and the multi-host flags) are not part of the
configuration. An `--out` URL (`gs://...`, tokenize and dedup) is not held: no probe, lock or run
record there (object stores have no `flock`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from dpsynth import fileio
from dpsynth.errors import DpsynthError

RUN_FILE = "dpsynth_run.json"
LOCK_FILE = ".dpsynth_run.lock"
RUN_FILES = (RUN_FILE, LOCK_FILE)
SIBLING_MARK = ".dpsynth_sibling"  # in a sibling directory a run wrote (OUT.private, ...): {"format", "out"}
FORMAT = "dpsynth.run"
FORMAT_VERSION = 1

TOKENS, DEDUP, MODEL, HF_MODEL, CORPUS, EVALUATION = "tokens", "dedup", "model", "hf-model", "corpus", "evaluation"
AUDIT = "audit"  # `dpsynth audit`'s owner-only report (never published)
PROBE = "probe"  # `dpsynth probe`'s owner-only contamination probe (never published)
KINDS = (TOKENS, DEDUP, MODEL, HF_MODEL, CORPUS, EVALUATION, AUDIT, PROBE)
_KIND_WORDS = {TOKENS: "token corpus", DEDUP: "dedup output", MODEL: "model directory",
               HF_MODEL: "Hugging Face export", CORPUS: "synthetic corpus", EVALUATION: "evaluation report",
               AUDIT: "release audit", PROBE: "contamination probe"}
# A manifest's "format" -> its kind (directories written before run records existed).
_FORMAT_KINDS = {"dpsynth.model": MODEL, "dpsynth.synthetic": CORPUS, "dpsynth.tokens": TOKENS}
# Marker files (and the "format" they hold; None: any file) -> the kind of the directory holding
# them, when it has no manifest.json (a run written before run records, or interrupted).
_MARKER_KINDS = (("contamination.json", "dpsynth.contamination", DEDUP), ("metrics.json", "dpsynth.metrics", EVALUATION),
                 ("dpsynth_export.json", None, HF_MODEL), ("generation_config.json", "dpsynth.synthetic", CORPUS),
                 ("variables", None, MODEL), ("release_audit.json", "dpsynth.release_audit", AUDIT),
                 ("contamination_probe.json", "dpsynth.contamination_probe", PROBE))
MANIFEST = "manifest.json"
KIND_FIELD = "output_kind"  # the manifests' field (a token manifest's "kind" says public or sensitive)

EXECUTION_FLAGS = frozenset({
    "out", "verbose", "resume", "stop_after", "state_dir", "audit_dir", "threads", "cores_per_worker",
    "distributed", "coordinator_address", "num_processes", "process_id", "mesh_data", "mesh_model", "peak_tflops",
    "tensorboard", "log_every", "progress_interval",
})


class OutDirError(DpsynthError, ValueError):
    """An output directory this run may not write (unwritable, busy, or another run's); one line."""


def is_url(path: str) -> bool:
    return "://" in path


def without_run_files(names: Iterable[str]) -> list[str]:
    """`names` (a directory listing) without the run record and lock (for "is it empty?" checks)."""
    return [n for n in names if n not in RUN_FILES]


def _contents(directory: str) -> list[str]:
    """What `directory` holds besides run files, sibling marks and temporary files (a killed
    writer's leftovers, `fileio.TMP_MARK`); [] when it is missing or not a directory."""
    if is_url(directory) or not os.path.isdir(directory):
        return []
    return sorted(n for n in without_run_files(os.listdir(directory))
                  if n != SIBLING_MARK and fileio.TMP_MARK not in n)


def _not_ours(flag: str, directory: str, names: list[str], what: str) -> OutDirError:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return OutDirError(f"{flag} {directory}: a non-empty directory that {what} (it holds {shown}); "
                       f"dpsynth would overwrite or publish its files: choose a new or empty {flag}")


def check_unowned_empty(directory: str, flag: str = "--out") -> None:
    """Raises `OutDirError` if `directory` holds files although no dpsynth run wrote it (`owner`)."""
    if owner(directory) is None and (names := _contents(directory)):
        raise _not_ours(flag, directory, names, "no dpsynth run wrote")


def check_sibling(directory: str, flag: str, out_dir: str) -> None:
    """Raises `OutDirError` if the sibling `directory` (e.g. `OUT.private`) holds files although
    `out_dir` holds no dpsynth run and the sibling no `SIBLING_MARK` of a run into `out_dir` (a
    user's directory; or one --audit-dir or --state-dir for two runs, whose second would overwrite
    the first's files). A sibling of a directory a dpsynth run owns is that run's (also when the
    two were copied or moved together, or the sibling predates the mark)."""
    names = _contents(directory)
    if not names or owner(out_dir) is not None:
        return  # (a directory and its sibling copied or moved together resume too)
    mark = _read_json(os.path.join(directory, SIBLING_MARK))
    if not isinstance(mark, dict):
        raise _not_ours(flag, directory, names, "no dpsynth run made")
    if mark.get("out") not in (None, os.path.abspath(out_dir)):
        raise _not_ours(flag, directory, names, f"a run into another --out, {mark['out']}, made")


def mark_sibling(directory: str, out_dir: str) -> None:
    """Writes `SIBLING_MARK` (0600) into the existing sibling `directory` of `out_dir`, if it has none."""
    mark = os.path.join(directory, SIBLING_MARK)
    if os.path.isdir(directory) and not os.path.exists(mark):
        fileio.write_json(mark, {"format": "dpsynth.sibling", "out": os.path.abspath(out_dir)}, mode=0o600)


def check_writable(path: str, flag: str = "--out") -> None:
    """Raises `OutDirError` unless the directory `path` exists writable or can be created.

    Probes with a real file (created and removed) in `path` or its nearest existing ancestor:
    `os.access` says yes to root on a read-only disk. Creates nothing else.
    """
    if not path or is_url(path):
        return
    target = os.path.abspath(path)
    if os.path.exists(target) and not os.path.isdir(target):
        raise OutDirError(f"{flag} {path}: exists and is not a directory")
    existing = target
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise OutDirError(f"{flag} {path}: cannot be created ({existing} is a file, not a directory)")
    probe = os.path.join(existing, f".dpsynth-probe{fileio.TMP_MARK}{os.getpid()}-{uuid.uuid4().hex}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.remove(probe)
    except OSError as e:
        where = "" if existing == target else f" ({existing} is not writable)"
        raise OutDirError(f"{flag} {path}: not writable{where}: {e.strerror or e}") from None


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def run_record(kind: str, command: str, config: Mapping[str, Any] | None = None,
               ignore: Iterable[str] = (), secret: Iterable[str] = ()) -> dict[str, Any]:
    """The run record of `dpsynth COMMAND` writing a `kind` with `config` (flag name -> value).

    Flags in `EXECUTION_FLAGS` or `ignore` are left out; each other value is kept only as a
    16-hex-digit SHA-256 prefix (enough to name the flags that differ). Flags in `secret` (a seed
    the release withholds: a hash of a guessable number is the number) are kept only as set or
    unset: their changes are the command's own resume checks (private state), not the record's.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown output kind {kind!r} (one of {KINDS})")
    skip = EXECUTION_FLAGS | set(ignore)
    secret = set(secret)
    fields = {k: (("set" if v is not None else "unset") if k in secret else _digest(v)[:16])
              for k, v in sorted((config or {}).items()) if k not in skip}
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": kind, "command": command,
            "config_sha256": _digest(fields), "config": fields}


def _read_json(path: str) -> Any:
    try:
        return fileio.read_json(path)
    except (OSError, ValueError):
        return None


def _format_of(path: str) -> Any:
    value = _read_json(path)
    return value.get("format") if isinstance(value, dict) else None


def owner(directory: str) -> dict[str, Any] | None:
    """Who wrote `directory`: its run record; else {"kind": K} from its manifest or marker files
    (written before run records existed); None if absent or holding nothing dpsynth wrote."""
    if is_url(directory) or not os.path.isdir(directory):
        return None
    record = _read_json(os.path.join(directory, RUN_FILE))
    if isinstance(record, dict) and record.get("format") == FORMAT:
        return record
    manifest = _read_json(os.path.join(directory, MANIFEST))
    if isinstance(manifest, dict):
        kind = manifest.get(KIND_FIELD) or _FORMAT_KINDS.get(manifest.get("format"))
        if kind:
            return {"kind": kind}
    for name, fmt, kind in _MARKER_KINDS:
        path = os.path.join(directory, name)
        if os.path.exists(path) and (fmt is None or _format_of(path) == fmt):
            return {"kind": kind}
    return None


def _a_kind(kind: str) -> str:
    """The kind's words with their article: "a token corpus", "an evaluation report"."""
    words = _KIND_WORDS.get(kind, kind)
    return f"{'an' if words[:1].lower() in 'aeio' else 'a'} {words}"


def _describe(found: Mapping[str, Any]) -> str:
    what = _a_kind(found["kind"])
    return f"{what} of `dpsynth {found['command']}`" if found.get("command") else what


def _differing(theirs: Mapping[str, str], ours: Mapping[str, str], defaults: Mapping[str, str]) -> list[str]:
    """The flags whose recorded digests differ. A flag one record lacks (added to dpsynth after the
    older run was recorded) differs only if the other record holds a value other than its default."""
    def same(k: str) -> bool:
        if k in theirs and k in ours:
            return theirs[k] == ours[k]
        return k in defaults and (theirs.get(k) or ours.get(k)) == defaults[k]
    return sorted(k for k in set(theirs) | set(ours) if not same(k))


def check_owner(directory: str, record: Mapping[str, Any], flag: str = "--out",
                defaults: Mapping[str, str] | None = None) -> None:
    """Raises `OutDirError` unless `directory` is new, empty, or holds a run of the same command and
    configuration as `record` (a resume, or an identical rerun). A non-empty directory no dpsynth run
    wrote is refused (`check_unowned_empty`).

    `defaults` (the "config" of a run record with every flag at its default): a run recorded by an
    older dpsynth, before a flag existed, matches a run that leaves that flag at its default."""
    found = owner(directory)
    if found is None:
        check_unowned_empty(directory, flag)
        return
    command, kind = record["command"], record["kind"]
    head = f"{flag} {directory}: holds {_describe(found)}"
    if found["kind"] != kind or found.get("command", command) != command:
        raise OutDirError(f"{head}; `dpsynth {command}` would overwrite it with {_a_kind(kind)}: "
                          f"choose another {flag}")
    if "config_sha256" not in found:
        raise OutDirError(f"{head} without a {RUN_FILE} (an older dpsynth, or a copy), so this run cannot tell "
                          f"whether it has the same configuration: choose another {flag}, or delete the directory")
    if found["config_sha256"] != record["config_sha256"]:
        differ = _differing(found.get("config") or {}, record["config"], defaults or {})
        if not differ and found.get("config"):
            return  # recorded by an older dpsynth: the flags added since are at their defaults
        flags = ", ".join("--" + k.replace("_", "-") for k in differ) or "its configuration"
        raise OutDirError(f"{head} with another configuration (differs in {flags}); rerun with the same flags to "
                          f"resume it, or choose another {flag}")


def check_not_owned(directory: str, flag: str, command: str) -> None:
    """Raises `OutDirError` if `directory` is another command's output directory (for commands
    that write single files, e.g. a report, into a directory they do not own)."""
    found = owner(directory)
    if found is not None:
        raise OutDirError(f"{flag}: {directory} holds {_describe(found)}; `dpsynth {command}` would write its "
                          f"files into it: choose a path outside it")


def check_file_out(path: str, *, command: str, privacy_dir: str | None = None) -> None:
    """For a command whose `--out` is one file (`classify`): its directory (and `privacy_dir`, where
    reports go) must be writable and no other run's output directory (`check_not_owned`); the
    file itself no directory."""
    if os.path.isdir(path):
        raise OutDirError(f"--out {path}: is a directory; {command} writes one file")
    for flag, directory in (("--out", os.path.dirname(os.path.abspath(path))), ("--privacy-report", privacy_dir)):
        if directory:
            check_writable(directory, flag)
            check_not_owned(directory, flag, command)


def require_corpus_file(path: str) -> None:
    """`require_corpus` of the directory holding the file `path` (a split read on its own)."""
    require_corpus(os.path.dirname(os.path.abspath(path)))


def _lock_holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        pid = int(os.pread(fd, 32, 0).decode().strip() or 0)
        if pid:
            return f" (pid {pid})"
    return ""


@contextlib.contextmanager
def claim(out_dir: str, *, kind: str, command: str, config: Mapping[str, Any] | None = None,
          ignore: Iterable[str] = (), writable: Iterable[tuple[str, str | None]] = (),
          siblings: Iterable[tuple[str, str | None]] = (), primary: bool = True, secret: Iterable[str] = (),
          parser: Any = None) -> Iterator[dict[str, Any]]:
    """Holds `out_dir` for this run (module docstring); yields the run record.

    Args:
        out_dir: the command's `--out` directory (created when missing).
        kind: one of `KINDS`.
        command: the command's name (`generate`).
        config: the run's flags (name -> value, e.g. `vars(args)`).
        ignore: more flags that do not change the output (besides `EXECUTION_FLAGS`).
        writable: (flag, directory) pairs the run also writes (checked, not created).
        siblings: (flag, directory) pairs of the directories beside `out_dir` that the run makes and
            fills (`OUT.private`, `--state-dir`, ...): also checked writable, refused when non-empty
            and no dpsynth run made them (`check_sibling`), marked (`mark_sibling`) as this run's.
        primary: False in every process of a multi-host run but one: only the writability is checked.
        secret: flags whose values the output withholds (recorded as set or unset, `run_record`).
        parser: the command's argparse parser: its defaults let a run recorded by an older dpsynth
            (without the flags added since) be resumed while those flags stay at their defaults.

    Raises:
        OutDirError: an unwritable directory, a concurrent run, a directory of another kind,
            command or configuration, or a non-empty directory (or sibling) no dpsynth run wrote.
    """
    record = run_record(kind, command, config, ignore, secret)
    defaults = None if parser is None else run_record(
        kind, command, {k: parser.get_default(k) for k in config or {}}, ignore, secret)["config"]
    siblings = [(flag, path) for flag, path in siblings if path and not is_url(path)]
    check_writable(out_dir)
    for flag, path in (*writable, *siblings):
        check_writable(path or "", flag)
    if is_url(out_dir) or not primary:
        yield record
        return
    # Before the lock file is made in another run's (or a user's) directory; again under the lock.
    check_owner(out_dir, record, defaults=defaults)
    for flag, path in siblings:
        check_sibling(path, flag, out_dir)
    created, fd = _lock(out_dir)
    record_path, wrote, checked = os.path.join(out_dir, RUN_FILE), False, False
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        check_owner(out_dir, record, defaults=defaults)
        for flag, path in siblings:
            check_sibling(path, flag, out_dir)
        checked = True
        for _, path in siblings:
            mark_sibling(path, out_dir)
        if not os.path.exists(record_path):
            fileio.write_json(record_path, record, mode=_run_file_mode(out_dir))
            wrote = True
        yield record
        for _, path in siblings:  # made during the run
            mark_sibling(path, out_dir)
    except BaseException:
        if checked:  # what this run wrote into its siblings is its own (for its rerun), also when it failed
            for _, path in siblings:
                with contextlib.suppress(OSError):
                    mark_sibling(path, out_dir)
        # A run refused or failed before it wrote anything leaves nothing (a rerun with other flags is no
        # "other configuration"); one that wrote outputs keeps its record, so only its resume continues them.
        if wrote and not without_run_files(os.listdir(out_dir)):
            os.remove(record_path)
            if created:
                _unlock(out_dir, fd)
                fd = -1
                with contextlib.suppress(OSError):  # (another run may have made its lock file there meanwhile)
                    os.rmdir(out_dir)
        raise
    finally:
        if fd >= 0:
            _unlock(out_dir, fd)


def _unlock(out_dir: str, fd: int) -> None:
    """Removes the lock file if it is still the one `fd` holds, then closes `fd` (releasing the lock).

    Unlinked before it is released: a run that opened the file meanwhile gets its `flock` only on
    the unlinked file, sees that the path names another file (or none) and retries (`_lock`)."""
    path = os.path.join(out_dir, LOCK_FILE)
    try:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                os.remove(path)
    finally:
        os.close(fd)


def _run_file_mode(out_dir: str) -> int | None:
    """0600 for the run files in an owner-only directory (no group or other bits: a sensitive token
    corpus, an audit, a probe, which their commands make 0700 before the claim), so that they do not
    depend on the directory's mode alone; None (the umask's) elsewhere."""
    return fileio.PRIVATE_FILE_MODE if os.stat(out_dir).st_mode & 0o077 == 0 else None


def _lock(out_dir: str) -> tuple[bool, int]:
    """Creates `out_dir` if needed and takes its lock; returns (created it, the lock's descriptor)."""
    path = os.path.join(out_dir, LOCK_FILE)
    for _ in range(10):  # the lock file is removed by the run that ends (see `_unlock`) between open and flock
        created = not os.path.isdir(out_dir)
        try:
            os.makedirs(out_dir, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, _run_file_mode(out_dir) or 0o644)
        except OSError as e:
            raise OutDirError(f"--out {out_dir}: cannot be written: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _lock_holder(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise OutDirError(f"--out {out_dir}: another run is writing into it now{holder}; wait for it to end, "
                              "or choose another --out") from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return created, fd
        except FileNotFoundError:
            pass
        os.close(fd)
    raise OutDirError(f"--out {out_dir}: its lock file keeps being replaced; is another program deleting it?")


def require_corpus(directory: str) -> None:
    """Raises `OutDirError` unless `directory` may be read as a synthetic corpus.

    Refused: a directory a dpsynth run wrote that is not a corpus (a model, an evaluation); a
    `dpsynth generate` output without its `manifest.json` (a run that stopped, or failed, before
    it finished: it has a run record or shards); and a split file whose SHA-256 is not the one
    its manifest records (edited, or mixed by another writer). A directory no dpsynth run wrote
    (a corpus made by hand: no run record, no manifest, no shards) is accepted.
    """
    found = owner(directory)
    if found is None:
        return
    if found["kind"] != CORPUS:
        raise OutDirError(f"{directory}: holds {_describe(found)}, not a synthetic corpus")
    manifest_path = os.path.join(directory, MANIFEST)
    if not os.path.exists(manifest_path):
        if "command" in found or os.path.isdir(os.path.join(directory, "shards")):
            raise OutDirError(f"{directory}: a synthetic corpus without its {MANIFEST} (its `dpsynth generate` run "
                              "stopped or failed before the end); rerun that command to finish it")
        return
    manifest = _read_json(manifest_path)
    if not isinstance(manifest, dict):
        raise OutDirError(f"{manifest_path}: not valid JSON")
    for split, entry in (manifest.get("splits") or {}).items():
        jsonl = (entry.get("files") or {}).get("jsonl") or {}
        if jsonl.get("path") and jsonl.get("sha256"):
            path = os.path.join(directory, jsonl["path"])
            if not os.path.exists(path) or fileio.sha256_file(path) != jsonl["sha256"]:
                raise OutDirError(f"{path}: missing or not the {split} split its {MANIFEST} records (SHA-256 "
                                  "differs): edited, or written by another run")

"""Dead letters at the entry points: every rejected record counted, explained, kept, and bounded.

The readers (`dpsynth.data.readers`) never drop a record silently: a record they cannot use
becomes a `DeadLetter` (file, record number, reason; never the text), and
`Dataset.records_in == len(records) + len(dead_letters)`. This module is what every entry point
that reads data does with them (`dpsynth dp-tune`, `classify`, `evaluate`, `generate`'s label
source, the experiment's sensitive stage):

* says how many records were read, used and dead-lettered, and why (the reasons counted by
  kind, numbers folded: `invalid UTF-8 at byte N of the line (2)`), never the text;
* writes every dead letter (one JSON object per line: file, record, reason, and which input it
  belongs to) to an owner-only file outside anything released: the tuner's private state,
  `OUT.private/dead_letters.jsonl` beside a job's output (`default_path`), or the experiment's
  sensitive stage directory;
* fails past a threshold, `--max-dead-letters N` (records) or `P%` (of the records read),
  default `DEFAULT_LIMIT`: data that is mostly unreadable is a wrong file or a wrong column, not
  something to train on quietly.

    dataset = read_checked(paths, name="D_train", limit="1%", out="state/dead_letters.jsonl")

Dead letters of sensitive data are not DP (which record numbers are malformed is a fact about
the data), so they are owner-only like every other private state.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import re
import sys
from collections.abc import Sequence
from typing import TextIO

from dpsynth.data.readers import Dataset, DeadLetter, InputError, read_sensitive

DEFAULT_LIMIT = "1%"  # the default of every --max-dead-letters
FILE = "dead_letters.jsonl"
PRIVATE_SUFFIX = ".private"  # a job's owner-only sibling directory (as for the memorisation audit)
SHOWN_REASONS = 5  # reason kinds printed; the file has them all
LIMIT_HELP = ("fail when more records than this are dead-lettered (unreadable, unlabelled, empty, ...): N records "
              f"or P%% of those read (default {DEFAULT_LIMIT.replace('%', '%%')}); every dead letter is listed "
              "(file, record number, reason; never the text) in an owner-only file")


class TooManyDeadLetters(InputError):
    """More records were rejected than `--max-dead-letters` allows; `summaries` holds every input's."""

    def __init__(self, message: str, summaries: Sequence["Summary"] = ()):
        super().__init__(message)
        self.summaries = tuple(summaries)


@dataclasses.dataclass(frozen=True)
class Limit:
    """How many dead letters an input may have: `count` records, or `fraction` of the records read."""

    count: int | None = None
    fraction: float | None = None

    def allowed(self, records_in: int) -> int:
        if self.count is not None:
            return self.count
        return int(math.floor(self.fraction * records_in + 1e-9))

    def __str__(self) -> str:
        return str(self.count) if self.count is not None else f"{100 * self.fraction:g}%"


def parse_limit(value: str | int | Limit | None) -> Limit:
    """`"N"` (records), `"P%"` (percent of the records read), an int, a `Limit`, or None (the default).

    Raises:
        InputError: anything else (names the flag).
    """
    if value is None:
        value = DEFAULT_LIMIT
    if isinstance(value, Limit):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise InputError(f"--max-dead-letters: must be >= 0, got {value}")
        return Limit(count=value)
    text = str(value).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", text)
    if m and float(m.group(1)) <= 100:
        return Limit(fraction=float(m.group(1)) / 100)
    if re.fullmatch(r"\d+", text):
        return Limit(count=int(text))
    raise InputError(f"--max-dead-letters: expected N (records) or P% (of the records read, 0-100), got {value!r}")


def reason_kind(reason: str) -> str:
    """A dead letter's reason with its numbers folded (`at byte 17` -> `at byte N`), for counting."""
    return re.sub(r"(?<![\w-])\d+", "N", reason)  # (not the 8 of "UTF-8")


@dataclasses.dataclass(frozen=True)
class Summary:
    """What reading one input did: records read, used, dead-lettered (by reason kind)."""

    name: str
    records_in: int
    used: int
    dead: tuple[DeadLetter, ...]
    limit: Limit

    @property
    def reasons(self) -> list[tuple[str, int]]:
        """(reason kind, count), most frequent first."""
        return collections.Counter(reason_kind(d.reason) for d in self.dead).most_common()

    @property
    def over_limit(self) -> bool:
        return len(self.dead) > self.limit.allowed(self.records_in)

    def describe(self, path: str | None = None) -> str:
        """One line: counts and reasons, never a record's text."""
        shown = self.reasons[:SHOWN_REASONS]
        more = len(self.reasons) - len(shown)
        text = (f"{self.name}: {len(self.dead)} of {self.records_in} records dead-lettered, {self.used} used ("
                + ", ".join(f"{k}: {n}" for k, n in shown) + (f", {more} more kinds" if more else "") + ")")
        if path:
            text += f"; listed in {path} (file, record number, reason)"
        return text


def summarize(dataset: Dataset, *, name: str, limit: str | int | Limit | None = None) -> Summary:
    """The dead-letter summary of a read `dataset` (nothing raised past the limit: see `enforce`).

    Asserts the readers' invariant: records read = records used + dead-lettered.
    """
    used, dead = len(dataset.records), tuple(dataset.dead_letters)
    if dataset.records_in != used + len(dead):  # the readers' contract; a silent drop would break it
        raise AssertionError(f"{name}: {dataset.records_in} records read but {used} used + {len(dead)} dead-lettered")
    return Summary(name=name, records_in=dataset.records_in, used=used, dead=dead, limit=parse_limit(limit))


def enforce(summaries: Sequence[Summary], path: str | None = None) -> None:
    """Raises `TooManyDeadLetters` (naming the first input past its limit) if any is."""
    for s in summaries:
        if s.over_limit:
            first = s.dead[0]
            raise TooManyDeadLetters(
                f"{s.describe(path)}: more than --max-dead-letters {s.limit} allows (at most "
                f"{s.limit.allowed(s.records_in)}); first: {first.file} record {first.record}: {first.reason}. "
                "Check the file's format" + (", its --encoding (e.g. cp1252?)" if _undecodable(s) else "")
                + " and the text/label columns, or raise --max-dead-letters", summaries)


def _undecodable(summary: Summary) -> bool:
    """Whether some of `summary`'s dead letters are bytes invalid in the file's encoding."""
    return any(kind.startswith("invalid ") and "JSON" not in kind for kind, _ in summary.reasons)


def check(dataset: Dataset, *, name: str, limit: str | int | Limit | None = None) -> Summary:
    """`summarize`, then raises `TooManyDeadLetters` past `limit`."""
    summary = summarize(dataset, name=name, limit=limit)
    enforce([summary])
    return summary


def write(path: str, summaries: Sequence[Summary]) -> str:
    """Writes every dead letter of `summaries` to the owner-only JSONL file `path` (0600, parent 0700)."""
    import json

    from dpsynth.owner_only import write_private_text

    lines = [json.dumps({"input": s.name, **d.to_json()}, ensure_ascii=False, sort_keys=True)
             for s in summaries for d in s.dead]
    return write_private_text(path, "".join(line + "\n" for line in lines))


def private_dir(out: str) -> str:
    """A job's owner-only sibling directory `OUT.private` (its private state), beside (never inside) OUT."""
    if "://" in out:
        return out.rstrip("/") + PRIVATE_SUFFIX
    return os.path.abspath(out).rstrip(os.sep) + PRIVATE_SUFFIX


def default_path(out: str) -> str:
    """A job's dead-letter file: `OUT.private/dead_letters.jsonl`, owner-only, beside (never inside) OUT."""
    return os.path.join(private_dir(out), FILE)


def account(summaries: Sequence[Summary], *, out: str | None, prefix: str = "",
            stream: TextIO | None = None) -> None:
    """Prints each summary that has dead letters and writes them all to `out` (when there are any)."""
    stream = stream or sys.stderr
    if not any(s.dead for s in summaries):
        return
    path = write(out, summaries) if out else None
    for s in summaries:
        if s.dead:
            print(f"{prefix}{s.describe(path)}", file=stream, flush=True)


@dataclasses.dataclass(frozen=True)
class Policy:
    """What an entry point does with dead letters: the `limit`, the file `out` (None: not written), where it prints."""

    limit: Limit = dataclasses.field(default_factory=lambda: parse_limit(None))
    out: str | None = None
    prefix: str = ""

    @classmethod
    def of(cls, limit: str | int | Limit | None, out: str | None, prefix: str = "") -> "Policy":
        return cls(limit=parse_limit(limit), out=out, prefix=prefix)


def read_checked(inputs: Sequence[tuple], policy: Policy, *, stream: TextIO | None = None,
                 **read_kwargs) -> list[Dataset]:
    """Reads labeled inputs with `read_sensitive` and accounts their dead letters.

    `inputs`: `(name, paths)` or `(name, paths, kwargs)` (this input's own `read_sensitive`
    arguments, over `read_kwargs`).

    Every input is read and every dead letter written before the threshold is applied, so a
    refused run still lists what was wrong. Returns one `Dataset` per input.

    Raises:
        InputError: unreadable input; `TooManyDeadLetters` past `policy.limit` (for any input).
    """
    datasets, summaries = [], []
    for name, paths, *own in inputs:
        ds = read_sensitive(paths, **{**read_kwargs, **(own[0] if own else {})})
        datasets.append(ds)
        summaries.append(summarize(ds, name=name, limit=policy.limit))
    account(summaries, out=policy.out, prefix=policy.prefix, stream=stream)
    enforce(summaries, policy.out if any(s.dead for s in summaries) else None)
    return datasets

"""The reading settings that every command shares: one declaration of their flags, defaults and help.

    from dpsynth.data import read_config
    read_config.add_flags(parser, "text_column", "label_column", "encoding", "max_dead_letters",
                          notes={"max_dead_letters": "here: OUT/dead_letters.jsonl"})

Each command binds the subset it reads with (`add_flags`, through `dpsynth.binding`), so a new
reading setting (or a new default) is declared once, here, for every command at once. The flags'
destinations are the field names (`args.text_column`, ...), which the entry points hand to the
readers (`dpsynth.data.readers`) and the dead-letter limit (`dpsynth.data.dead_letters`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping

from dpsynth import binding
from dpsynth.data import dead_letters, readers


DEFAULT_SHARD_MB = 64.0  # a Beam job's input per shard (`dpsynth.beam.inputs.DEFAULT_SHARD_BYTES`)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReadConfig:
    """How a command reads its input files.

    Attributes:
        text_column: the text field: a CSV/TSV column, a JSON(L) key, a Parquet column.
        label_column: the label field ('' for unlabeled text, where the command accepts it).
        max_document_bytes: larger documents (UTF-8 bytes) are dead-lettered.
        encoding: the files' text encoding (`readers.ENCODING_HELP`).
        max_dead_letters: the dead-letter limit, N records or P% (`dead_letters.LIMIT_HELP`).
        num_shards, shard_mb: how a Beam job splits its input (None: one shard per shard_mb MiB).
        tfds_data_dir: a prepared TFDS data_dir for `tfds:NAME` inputs.
    """

    text_column: str = binding.setting("text", help="the text field: a CSV/TSV column, a JSON key, a Parquet column")
    label_column: str = binding.setting("label", help="the label field")
    max_document_bytes: int = binding.setting(readers.DEFAULT_MAX_DOCUMENT_BYTES,
                                              help="larger documents (UTF-8 bytes) are dead-lettered")
    encoding: str = binding.setting(readers.DEFAULT_ENCODING, help=readers.ENCODING_HELP)
    max_dead_letters: str = binding.setting(dead_letters.DEFAULT_LIMIT, help=dead_letters.LIMIT_HELP)
    num_shards: int | None = binding.setting(None, help="shards of the input (default: one per --shard-mb)")
    shard_mb: float = binding.setting(DEFAULT_SHARD_MB, help="target input MiB per shard")
    tfds_data_dir: str | None = binding.setting(None, help="prepared TFDS data_dir for tfds:NAME inputs")

    @property
    def shard_bytes(self) -> int:
        return int(self.shard_mb * (1 << 20))


FIELDS = tuple(f.name for f in dataclasses.fields(ReadConfig))
_METAVARS = {"max_dead_letters": "N|P%", "max_document_bytes": "BYTES", "shard_mb": "MIB", "num_shards": "N",
             "tfds_data_dir": "DIR"}


def add_flags(parser: argparse.ArgumentParser, *fields: str, notes: Mapping[str, str] | None = None) -> list[str]:
    """Adds the flags of `fields` (ReadConfig field names, in ReadConfig's order) to `parser`.

    `notes`: field -> what the flag means for this command, appended to its help in parentheses
    (e.g. which files an encoding applies to, where the dead letters go).
    """
    unknown = set(fields) - set(FIELDS)
    if unknown or not fields:
        raise ValueError(f"read flags: unknown or no fields {sorted(unknown)}; choose from {FIELDS}")
    notes = dict(notes or {})
    if set(notes) - set(fields):
        raise ValueError(f"read flags: notes for fields not bound: {sorted(set(notes) - set(fields))}")
    meta = {f.name: f.metadata for f in dataclasses.fields(ReadConfig)}
    overrides = {}
    for name in fields:
        kw = {"metavar": _METAVARS[name]} if name in _METAVARS else {}
        if name in notes:
            kw["help"] = f"{meta[name][binding.HELP]} ({notes[name]})"
        if kw:
            overrides[name] = kw
    return binding.add_flags(parser, ReadConfig, skip=tuple(n for n in FIELDS if n not in fields), overrides=overrides)

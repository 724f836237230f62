"""Tests for dpsynth.beam.inputs: driver-side planning of the tokenize job's inputs."""

import pytest

from beam_jobs import tokenize as tokenize_job
from dpsynth.beam import inputs
from dpsynth.data import readers


def test_fatal_inputs_fail_before_the_pipeline(tmp_path, tokenizer_path):
    (tmp_path / "d.csv").write_text("review,label\nhi,a\n")
    with pytest.raises(readers.InputError, match=r"d\.csv: missing column\(s\) \['text'\]"):
        inputs.plan_source(str(tmp_path / "d.csv"), kind="sensitive")
    (tmp_path / "bad.jsonl").write_bytes(b"\n".join([b"{}", b"\xff", b'{"text": " "}']) + b"\n")
    with pytest.raises(readers.EmptyDatasetError, match=r"no valid document \(3 dead-lettered"):
        tokenize_job.run(["--input", str(tmp_path / "bad.jsonl"), "--tokenizer", tokenizer_path,
                          "--out", str(tmp_path / "o")])

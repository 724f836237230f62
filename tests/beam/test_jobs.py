"""Tests for dpsynth.beam.jobs and the job entry points: flags, runner options, shipping to workers."""

import pathlib
import shutil
import subprocess
import sys
import tarfile

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import GoogleCloudOptions, SetupOptions, StandardOptions
from apache_beam.testing.util import assert_that, equal_to

from beam_jobs import dedup as dedup_job
from beam_jobs import tokenize as tokenize_job
from dpsynth.beam import jobs
from dpsynth.beam.pipeline import make_pipeline_options, run_pipeline
from dpsynth.data import token_shards

from .conftest import REPO

DATAFLOW = ["--runner=DataflowRunner", "--project=my-project", "--region=us-central1",
            "--temp_location=gs://bucket/tmp", "--setup_file=./setup.py", "--num_workers=4"]


def test_parse_named():
    assert jobs.parse_named("imdb=data/imdb.csv") == ("imdb", "data/imdb.csv")
    assert jobs.parse_named("data/a=b.csv") == (None, "data/a=b.csv")
    assert jobs.parse_named("gs://b/x.csv") == (None, "gs://b/x.csv")
    assert jobs.parse_named("tfds:imdb_reviews") == (None, "tfds:imdb_reviews")


@pytest.mark.parametrize("job,flags", [
    (dedup_job, ["--public", "p", "--sensitive", "s", "--tokenizer", "t", "--out", "gs://b/o"]),
    (tokenize_job, ["--input", "p", "--tokenizer", "t", "--out", "gs://b/o"]),
])
def test_beam_flags_pass_through_unchanged_for_dataflow(job, flags):
    args, beam_args = job.build_parser().parse_known_args(flags + DATAFLOW)
    assert beam_args == DATAFLOW
    options = make_pipeline_options(beam_args)
    assert options.view_as(StandardOptions).runner == "DataflowRunner"
    gcp = options.view_as(GoogleCloudOptions)
    assert (gcp.project, gcp.region, gcp.temp_location) == ("my-project", "us-central1", "gs://bucket/tmp")
    assert options.view_as(SetupOptions).setup_file == "./setup.py"


def test_local_runner_is_the_default():
    assert make_pipeline_options([]).view_as(StandardOptions).runner.endswith("FnApiRunner")


def test_run_pipeline_builds_and_runs_a_fresh_pipeline_per_call():
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    made = []

    def factory():
        made.append(beam.Pipeline(options=make_pipeline_options()))
        return made[-1]

    def build(p):
        assert p is made[-1]
        assert_that(p | "Create" >> beam.Create([1, 2]) | "Double" >> beam.Map(lambda x: 2 * x), equal_to([2, 4]))

    run_pipeline(build, test_pipeline=factory)
    run_pipeline(build, test_pipeline=factory)
    assert len(made) == 2 and made[0] is not made[1]
    with pytest.raises(Exception, match="Failed assert"):  # a failing pipeline raises (it was waited for)
        run_pipeline(lambda p: assert_that(p | beam.Create([1]), equal_to([2])))


def _sdist(tmp_path) -> pathlib.Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, src / name)
    for name in ("native", "dpsynth", "beam_jobs", "trainers"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(tmp_path / "dist")], cwd=src,
                   check=True, capture_output=True, timeout=300)
    (path,) = (tmp_path / "dist").glob("*.tar.gz")
    return path


def test_setup_file_sdist_carries_the_native_sources(tmp_path):
    """`--setup_file ./setup.py` ships an sdist that workers build: it needs every native file."""
    native = sorted(p.name for p in (REPO / "native").iterdir() if p.suffix in (".cc", ".h"))
    assert native, "native/ has no sources"
    with tarfile.open(_sdist(tmp_path)) as tar:
        names = {pathlib.PurePosixPath(n).name for n in tar.getnames() if "/native/" in n}
        shipped = {pathlib.PurePosixPath(n).parts[1] for n in tar.getnames() if len(pathlib.PurePosixPath(n).parts) > 1}
    assert set(native) <= names
    assert {"dpsynth", "beam_jobs", "trainers", "setup.py"} <= shipped


@pytest.mark.slow
def test_worker_style_build_from_the_sdist(tmp_path):
    """What a Dataflow worker does with --setup_file: pip builds the sdist, compiling dpsynth._native."""
    sdist = _sdist(tmp_path)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "w"), str(sdist)],
                   check=True, timeout=900)
    (wheel,) = (tmp_path / "w").glob("*.whl")
    import zipfile

    assert any(n.startswith("dpsynth/_native") for n in zipfile.ZipFile(wheel).namelist())


def test_dedup_tokenizes_file_and_in_memory_corpora_in_one_pipeline(tmp_path, tokenizer_path):
    """Files of every corpus are read in one step; an in-memory (TFDS) corpus is created on its own."""
    from dpsynth.data.tokenizers import Tokenizer
    from dpsynth.beam import inputs
    from dpsynth.data import readers

    (tmp_path / "pub.jsonl").write_text('{"text": "a public text"}\n{"text": "another one"}\n')
    (tmp_path / "s.jsonl").write_text('{"text": "good food", "label": "a"}\n')
    records = ({"id": "m1", "text": "kept in memory", "label": "b"}, {"id": "m2", "text": " ", "label": "b"})
    sources = [inputs.plan_source(str(tmp_path / "pub.jsonl"), kind="public", name="public"),
               inputs.plan_source(str(tmp_path / "s.jsonl"), kind="sensitive", name="files"),
               inputs.CorpusSource("memory", "sensitive", ("tfds:x",), readers.Columns(text="text", label="label"),
                                   records=records)]
    tokenizer = Tokenizer.load(tokenizer_path)
    dirs = {s.name: str(tmp_path / "tok" / s.name) for s in sources}
    def build(p):
        names = (jobs._token_manifests(p, sources, dirs, tokenizer, tokenizer_path, num_shards=None,
                                       shard_bytes=1 << 20, max_document_bytes=1 << 20)
                 | beam.Map(lambda kv: kv[0]))
        assert_that(names, equal_to(["public", "files", "memory"]))

    run_pipeline(build)
    manifests = {s.name: token_shards.read_manifest(dirs[s.name]) for s in sources}
    assert {n: m["num_documents"] for n, m in manifests.items()} == {"public": 2, "files": 1, "memory": 1}
    assert manifests["memory"]["dead_lettered"] == 1 and manifests["files"]["labels"] == {"a": 1}

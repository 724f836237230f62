"""Beam PTransforms of the metric job: one element per synthetic corpus, heavy state in setup.

    corpus dirs --ScoreCorpora--> (row, plot data) --CollectRows--+
    [baselines] --ScoreBaselines--> baseline rows --CollectBaselines--+--WriteReport--> report paths

Each `ScoreCorpusFn` worker loads the real splits, the embedder (with the real-test features)
and the backbone once in `setup()`; scoring a corpus is `scoring.Scorer.score_corpus`. The
report is written once from the collected rows (`report.write_report`). `run_job` is the
whole job (what `beam_jobs/metrics.py` calls).
"""

from __future__ import annotations

from collections.abc import Sequence

import apache_beam as beam

from dpsynth import outdir
from dpsynth.beam.pipeline import PipelineFactory, run_pipeline
from dpsynth.evaluate import report, scoring

NAMESPACE = "dpsynth.evaluate"


class _ScorerFn(beam.DoFn):
    def __init__(self, real_paths: tuple[str, str, str | None], config: scoring.EvaluateConfig, max_dead_letters=0,
                 encoding: str | None = None):
        self.real_paths, self.config, self.max_dead_letters = real_paths, config, max_dead_letters
        self.encoding = encoding
        self.scorer = None

    def setup(self):
        self.scorer = scoring.Scorer(scoring.load_real(*self.real_paths, max_dead_letters=self.max_dead_letters,
                                                       encoding=self.encoding), self.config)


class ScoreCorpusFn(_ScorerFn):
    """corpus dir -> (row, plot data); counts ok / error corpora."""

    def process(self, path: str):
        row, plot = self.scorer.score_corpus(path)
        beam.metrics.Metrics.counter(NAMESPACE, f"corpora_{row.get('status', 'error')}").inc()
        yield row, plot


class ScoreBaselinesFn(_ScorerFn):
    """(ignored) -> baseline rows (real data and DP-on-real per classifier)."""

    def process(self, _):
        for row in self.scorer.score_baselines():
            beam.metrics.Metrics.counter(NAMESPACE, "baselines").inc()
            yield row


class WriteReportFn(beam.DoFn):
    """[(row, plot)] + [baseline rows] -> paths of metrics.json/csv and report.html.

    The majority-class predictor's scores come from the real test labels, read in `setup()`.
    """

    def __init__(self, out_dir: str, classifiers: Sequence[str], real_test: str, encoding: str | None = None):
        self.out_dir, self.classifiers, self.real_test = out_dir, tuple(classifiers), real_test
        self.encoding = encoding
        self.majority = None

    def setup(self):
        from dpsynth.evaluate import corpora

        self.majority = scoring.majority_of(corpora.read_real(self.real_test, "real test", encoding=self.encoding))

    def process(self, scored, baselines):
        rows = [r for r, _ in scored]
        plots = [p for _, p in scored]
        yield report.write_report(rows, plots, baselines, self.out_dir, self.classifiers, majority=self.majority)


class ScoreCorpora(beam.PTransform):
    """Scores synthetic corpora against the real splits."""

    def __init__(self, real_paths: tuple[str, str, str | None], config: scoring.EvaluateConfig, max_dead_letters=0,
                 encoding: str | None = None):
        super().__init__()
        self.real_paths, self.config, self.max_dead_letters = real_paths, config, max_dead_letters
        self.encoding = encoding

    def expand(self, dirs):
        """PCollection[str] (corpus directories) -> PCollection[tuple[dict, dict]] (row, plot data)."""
        return (dirs
                | "SpreadCorpora" >> beam.Reshuffle()
                | "ScoreEachCorpus" >> beam.ParDo(ScoreCorpusFn(self.real_paths, self.config, self.max_dead_letters,
                                                               self.encoding)))


def build(p: beam.Pipeline, synthetic_dirs: Sequence[str], real_paths: tuple[str, str, str | None], out_dir: str,
          config: scoring.EvaluateConfig, max_dead_letters=0, encoding: str | None = None):
    """Adds the metric job to pipeline `p`; returns the PCollection holding the report paths dict."""
    if not synthetic_dirs:
        raise ValueError("no synthetic corpus given")
    scored = (p | "ListCorpora" >> beam.Create(sorted(synthetic_dirs))
              | "ScoreCorpora" >> ScoreCorpora(real_paths, config, max_dead_letters, encoding)
              | "CollectRows" >> beam.combiners.ToList())
    baselines = (p | "BaselineTask" >> beam.Create([0])
                 | "ScoreBaselines" >> beam.ParDo(ScoreBaselinesFn(real_paths, config, max_dead_letters, encoding))
                 | "CollectBaselines" >> beam.combiners.ToList())
    return scored | "WriteReport" >> beam.ParDo(WriteReportFn(out_dir, config.classifiers, real_paths[1], encoding),
                                                beam.pvalue.AsSingleton(baselines))


def run_job(synthetic_dirs: Sequence[str], real_paths: tuple[str, str, str | None], out_dir: str,
            config: scoring.EvaluateConfig, *, beam_args: Sequence[str] | None = None,
            test_pipeline: PipelineFactory | None = None, max_dead_letters=0, encoding: str | None = None) -> None:
    """Runs the metric job: every corpus in `synthetic_dirs` against the real splits, one report.

    Args:
      synthetic_dirs: synthetic corpus directories (train.jsonl, valid.jsonl).
      real_paths: (real train, real test, real valid or None).
      out_dir: where metrics.json, metrics.csv, report.html and plots/ go.
      config: the metric settings.
      beam_args: Beam flags; test_pipeline: the test hook (`dpsynth.beam.pipeline`).
      max_dead_letters: rejected records tolerated per real split (default 0; the CLI passes its
        `--max-dead-letters` after telling the user, `dpsynth.data.dead_letters`).
      encoding: the real splits' text encoding (default UTF-8).

    Raises:
      ValueError, FileNotFoundError: bad real splits (before any compute) or no corpus.
      dpsynth.outdir.OutDirError: a synthetic directory without its manifest, or of another kind.
    """
    scoring.load_real(*real_paths, max_dead_letters=max_dead_letters, encoding=encoding)  # before any compute
    for path in synthetic_dirs:  # an unfinished or foreign directory: refused, not a row of the report
        outdir.require_corpus(path)
    run_pipeline(lambda p: build(p, synthetic_dirs, real_paths, out_dir, config, max_dead_letters, encoding),
                 beam_args=beam_args, test_pipeline=test_pipeline)

"""How every Beam job makes and runs its pipelines: options with a local default runner.

Beam's `DirectRunner` first tries to download the Prism binary and only then falls back;
dpsynth therefore defaults to the in-process portable `FnApiRunner`, which runs everything
locally. Its multi-process mode is `--direct_running_mode=multi_processing
--direct_num_workers=N`; there a worker process that dies fails the job instead of hanging it
(`dpsynth.beam.workers`). Any other runner is chosen with the standard `--runner` flag
(`DataflowRunner`, `DaskRunner`, `FlinkRunner`, ...) and is used unchanged.

Every job (tokenize, dedup, generate, evaluate) builds and runs its pipelines with
`run_pipeline`. The one test hook, everywhere (library jobs and `beam_jobs/*.run`), is
`test_pipeline`: a zero-argument callable returning a fresh `beam.Pipeline`, called once
per pipeline the job runs (each runs one). Tests pass e.g. `test_pipeline=TestPipeline`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from dpsynth.beam import workers

LOCAL_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"

PipelineFactory = Callable[[], beam.Pipeline]


def make_pipeline_options(beam_args: Sequence[str] | None = None, **overrides) -> PipelineOptions:
    """Builds `PipelineOptions` from leftover command-line args, defaulting the runner.

    Args:
      beam_args: standard Beam flags (`--runner`, `--project`, `--temp_location`,
        `--setup_file`, `--direct_num_workers`, ...).
      **overrides: option values set programmatically (e.g. `save_main_session=False`).
    """
    options = PipelineOptions(list(beam_args or []), **overrides)
    standard = options.view_as(StandardOptions)
    if not standard.runner:
        standard.runner = LOCAL_RUNNER
    return options


def run_pipeline(
    build: Callable[[beam.Pipeline], Any],
    *,
    beam_args: Sequence[str] | None = None,
    test_pipeline: PipelineFactory | None = None,
) -> None:
    """Makes a fresh pipeline, adds the job's graph with `build(p)` and runs it to completion.

    Args:
      build: adds the job's transforms to the pipeline it is given.
      beam_args: Beam flags for `make_pipeline_options` (ignored with `test_pipeline`).
      test_pipeline: returns the pipeline to use instead (tests: `TestPipeline`).
    """
    workers.install()
    p = test_pipeline() if test_pipeline is not None else beam.Pipeline(options=make_pipeline_options(beam_args))
    build(p)
    result = p.run()
    try:
        result.wait_until_finish()
    finally:
        client = getattr(result, "client", None)  # DaskRunner: close the client it opened
        if client is not None:
            client.close()

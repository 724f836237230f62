"""Pipeline options shared by every Beam job: a local default runner that never downloads.

Beam's `DirectRunner` first tries to download the Prism binary and only then falls back;
dpsynth therefore defaults to the in-process portable `FnApiRunner`, which runs everything
locally. Its multi-process mode is `--direct_running_mode=multi_processing
--direct_num_workers=N`. Any other runner is chosen with the standard `--runner` flag
(`DataflowRunner`, `DaskRunner`, `FlinkRunner`, ...) and is used unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

LOCAL_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"


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

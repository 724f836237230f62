"""dpsynth: differentially private synthetic text with large language models.

Implements Kurakin et al. 2023, "Harnessing large-language models to generate private
synthetic text": contamination-free pretraining data, DP fine-tuning (full, prompt, LoRA),
sharded generation and evaluation. See README.md for the pipeline and file formats.
"""

__version__ = "0.1.0"

from dpsynth import logs as _logs

_logs.install_filter()  # before anything imports Apache Beam (see dpsynth.logs)

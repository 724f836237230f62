"""Synthetic-data generation from a (DP-tuned) model.

Modules:
  sampler: batched KV-cache sampling (temperature, top-k, best-of-N, EOS), compiled once
    per (batch, prompt-length bucket).
  labels: label distributions (uniform, DP label histogram), exact label assignment, prompts.
  job: the sharded, deterministic, resumable Beam job (`generate`, `GenerateSynthetic`) and
    the demo function `run_generate_demo`.
  report: `generation_report.json` (duplicates, label balance, lengths, memorisation audit).
"""

"""Synthetic-data generation from a (DP-tuned) model.

Modules:
  sampler: batched KV-cache sampling (temperature, top-k, best-of-N, EOS), compiled once
    per (batch, prompt-length bucket).
  labels: label distributions (uniform, DP label histogram), exact label assignment.
  job: the sharded, deterministic, resumable Beam job (`generate`, `GenerateSynthetic`).
Label prompts are built by `dpsynth.train.prompts` (the one contract shared with the tuner).
  report: `generation_report.json` (duplicates, label balance, lengths, memorisation audit).
"""

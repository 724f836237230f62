"""Synthetic-data generation from a (DP-tuned) model.

Modules:
  sampler: batched KV-cache sampling (temperature, top-k, best-of-N, EOS), compiled once
    per (batch, prompt-length bucket).
  labels: label distributions (uniform, DP label histogram), exact label assignment.
  job: the sharded, deterministic, resumable Beam job (`generate`) and the generation API;
    its steps: model_info (reading the model directory), plan (config, shard specs, label
    distribution, the DP label histogram draw), transforms (`GenerateSynthetic`, the shard
    DoFn), outputs (the output directory: shards, merged splits, privacy report, manifest).
  postprocess: filters of samples by their own content (no privacy cost).
  report: `generation_report.json` (duplicates, label balance, lengths, memorisation audit).
Label prompts are built by `dpsynth.train.prompts` (the one contract shared with the tuner).
"""

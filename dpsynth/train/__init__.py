"""The one training core and what builds on it.

- `core`: TrainState, GradientStrategy, MeanGradient, make_train_functions (compiled steps).
- `sharding`: meshes, logical-axis rules, multi-host placement.
- `lm`: variable-collection splits and the next-token loss with z-loss.
- `optim`: Adafactor (rsqrt schedule) and AdamW.
- `checkpoint`: resumable training state and the `dpsynth.model` directory.
- `pretrain`: the pretraining loop behind `dpsynth pretrain`.
- `prompts`: labeled examples as Prefix-LM rows (label prompt + text + EOS).
- `finetune`: DP fine-tuning (`dpsynth dp-tune`): full, prompt and LoRA modes, sweeps, resume;
  the DP mechanisms and the privacy plan come from `dpsynth.dp`. Its parts: `tune_config`
  (configuration, recipe, privacy plan), `tune_resume` (state directory, resume check), `tune_data`
  (rows), `tune_model` (model, loss, step functions), `tune_loop` (the loop), `tune_report` (privacy
  report) and `tune_plan` (resource plan).
"""

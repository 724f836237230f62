"""The audit of a released synthetic corpus against the data it came from (owner-only, NOT DP).

* `copying`: the longest token sequence each synthetic example shares with D_train (the
  dedup's suffix arrays), counts at >= 50 / >= 20 tokens, and the distance-to-closest-record
  comparison with held-out real records (D_test).
* `canaries`: canaries planted in D_train through dp-tune and generate, scored by an LM fit
  on the synthetic corpus only (`ngram`), with AUROC, exposure and epsilon lower bounds.
* `run`: reads the corpus and the real splits, runs both, writes the owner-only report
  (`dpsynth audit`).
"""

"""Removing every >= k token sequence a public corpus shares with the sensitive datasets.

* `suffix_array`: native SA-IS suffix arrays, LCP arrays and cross-set matching statistics.
* `index.SensitiveIndex`: all sensitive documents, built once, saved as one file.
* `match.dedup_shard`: finds and cuts the shared sequences of one public shard;
  `count_shared` / `longest_shared` check generated text for memorisation.
* `report`: `contamination.json` from the shards' statistics.
"""

# k: the dedup cuts every public sequence of >= k tokens shared with the sensitive data (the
# paper's 50); the generation's memorisation audit counts synthetic examples sharing >= k.
DEFAULT_MIN_TOKENS = 50

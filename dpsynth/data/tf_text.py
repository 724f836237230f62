"""TF-Text tokenization with the same SentencePiece model as `dpsynth.data.tokenizers.Tokenizer`.

`tf_tokenizer(tokenizer)` builds `tensorflow_text.SentencepieceTokenizer(model=proto)` from
the very model bytes, so in-graph tokenization (e.g. inside a `tf.data` input pipeline) gives
the same ids as `Tokenizer.encode` (tested).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def tf_tokenizer(tokenizer):
    """A `tensorflow_text.SentencepieceTokenizer` over the model of a dpsynth `Tokenizer`."""
    import tensorflow_text as tf_text

    return tf_text.SentencepieceTokenizer(model=tokenizer.model_proto, out_type="int32")


def tf_encode(tokenizer, texts: Sequence[str]) -> list[np.ndarray]:
    """Token ids of `texts` computed by TF-Text (int32 arrays, like `Tokenizer.encode`)."""
    import tensorflow as tf

    ragged = tf_tokenizer(tokenizer).tokenize(tf.constant(list(texts), dtype=tf.string))
    return [np.asarray(row, dtype=np.int32) for row in ragged.to_list()]

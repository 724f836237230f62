"""The WordCNN classifier family (Kurakin et al. 2023): `classifiers.WordCNN` with its vocabulary.

The input vocabulary is one of `VOCABULARIES`: "train" (the most frequent words of the
classifier's own training set), "tokenizer" (the pieces of a public SentencePiece tokenizer),
"hashing" (words hashed into fixed buckets, no data), or "auto": the own training set when
training is non-private, else the public tokenizer with a model_dir and hashing without one.
A "train" vocabulary under DP is read from D_train without DP (a declared side channel).

Settings of its own (`WordCNNSettings`, `--wordcnn-<setting>` flags, `classifier_options:
{wordcnn: {...}}`): `vocabulary`. Its sizes are the spec's `wordcnn` (`classifiers.WordCNNConfig`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from dpsynth import binding
from dpsynth.evaluate import classifiers, registry, trainer

VOCABULARIES = ("auto", "tokenizer", "hashing", "train")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WordCNNSettings:
    """The WordCNN's own settings.

    Attributes:
      vocabulary: its input vocabulary, one of `VOCABULARIES` (module doc); "auto" (default): the
        own training set when training is non-private; for DP training the public pieces of
        model_dir's tokenizer, or hashed words without a model_dir.
    """

    vocabulary: str = binding.setting("auto", choices=VOCABULARIES,
                                      help="the WordCNN's vocabulary; auto: own training set if non-private, for DP "
                                           "training the model's tokenizer pieces, else hashed words (train: from "
                                           "the training set, a declared side channel under DP)")

    def __post_init__(self):
        if self.vocabulary not in VOCABULARIES:
            raise binding.SettingError("vocabulary", f"must be one of {', '.join(VOCABULARIES)}; got {self.vocabulary!r}")


def wordcnn_model(train_texts: Sequence[str] | None, num_classes: int, config: classifiers.WordCNNConfig,
                  seed: int = 0, *, vocabulary: str = "train", tokenizer: Any = None,
                  tokenizer_source: str = "the tokenizer") -> trainer.Model:
    """A fresh WordCNN; its input vocabulary comes from `vocabulary`.

    Args:
      train_texts: the training texts; read only when `vocabulary == "train"`.
      vocabulary: "train" (the `config.vocab_words` most frequent words of `train_texts`),
        "tokenizer" (the pieces of `tokenizer`, a public SentencePiece model: the CNN reads
        piece ids, `config.max_len` of them) or "hashing" (words hashed into
        `config.vocab_words` buckets; no data).
      tokenizer: a `dpsynth.data.tokenizers.Tokenizer` for "tokenizer"; tokenizer_source names it.
    """
    if vocabulary == "train":
        if train_texts is None:
            raise ValueError("a vocabulary from the training set needs its texts")
        feat = classifiers.WordFeaturizer.fit(train_texts, config)
        vocab = {"source": "train", "detail": f"the {feat.vocab.size - 2} most frequent words of the training set",
                 "size": feat.vocab_size}
    elif vocabulary == "tokenizer":
        if tokenizer is None:
            raise ValueError("a vocabulary from tokenizer pieces needs a tokenizer (a model_dir)")
        feat = classifiers.SubwordFeaturizer(tokenizer, config.max_len)
        vocab = {"source": "tokenizer", "size": feat.vocab_size,
                 "detail": f"the {feat.vocab_size} SentencePiece pieces of {tokenizer_source} (sha256 "
                           f"{tokenizer.sha256}); texts are read as piece ids"}
    elif vocabulary == "hashing":
        feat = classifiers.HashingWordFeaturizer(config.vocab_words, config.max_len)
        vocab = {"source": "hashing", "size": feat.vocab_size,
                 "detail": f"words hashed (CRC-32) into {config.vocab_words} buckets; no data read"}
    else:
        raise ValueError(f"WordCNN vocabulary must be one of {VOCABULARIES[1:]}, got {vocabulary!r}")
    module = classifiers.WordCNN(feat.vocab_size, num_classes, config)
    params = module.init(jax.random.PRNGKey(seed), jnp.zeros((1, config.max_len), jnp.int32))["params"]
    return trainer.Model(module, params, {}, feat, "wordcnn", embedding_path=("embed", "embedding"), vocabulary=vocab)


class WordCNNKind(registry.ClassifierKind):
    """The WordCNN: sizes from `spec.wordcnn`, vocabulary from its `WordCNNSettings`."""

    settings = WordCNNSettings

    def check(self, spec) -> None:
        if self.settings_of(spec).vocabulary == "tokenizer" and spec.model_dir is None:
            raise ValueError("wordcnn.vocabulary: 'tokenizer' needs model_dir (a model directory with tokenizer.model)")

    def vocabulary(self, spec, private: bool) -> str:
        """The vocabulary source for a private or non-private training set ("auto" resolved)."""
        chosen = self.settings_of(spec).vocabulary
        if chosen != "auto":
            return chosen
        if not private:
            return "train"
        return "tokenizer" if spec.model_dir else "hashing"

    def input_len(self, spec) -> int:
        return spec.wordcnn.max_len

    def reads_train_texts(self, spec, private: bool) -> bool:
        return self.vocabulary(spec, private) == "train"

    def make(self, spec, train_texts: Sequence[str] | None, num_classes: int, *, backbone: Any = None,
             private: bool = False) -> trainer.Model:
        vocabulary = self.vocabulary(spec, private)
        tokenizer, source = None, "the tokenizer"
        if vocabulary == "tokenizer":
            if backbone is not None:
                tokenizer = backbone.tokenizer
            else:
                from dpsynth.data.tokenizers import load_tokenizer

                tokenizer = load_tokenizer(spec.model_dir)
            source = f"{spec.model_dir}/{tokenizer.filename}"
        return wordcnn_model(train_texts if vocabulary == "train" else None, num_classes, spec.wordcnn,
                             vocabulary=vocabulary, tokenizer=tokenizer, tokenizer_source=source)


WORDCNN = WordCNNKind()

from dpsynth.evaluate import text


def test_words_lowercase_split_on_punctuation():
    assert text.words("Great TEA!!! isn't it,really? 5-star") == ["great", "tea", "isn", "t", "it", "really", "5", "star"]
    assert text.words("  ") == []


def test_vocabulary_most_frequent_and_reserved_ids():
    vocab = text.Vocabulary.build(["b a a c", "a b d"], max_size=2)
    assert vocab.tokens == ("a", "b") and vocab.size == 4
    assert vocab.encode("A b zzz") == [2, 3, text.OOV]
    batch = vocab.encode_batch(["a", "b a a a"], max_len=3)
    assert batch.tolist() == [[2, 0, 0], [3, 2, 2]]

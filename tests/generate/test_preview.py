"""Preview samples of a model directory (dpsynth.generate.preview) on the fake model."""

from dpsynth.generate.preview import preview_samples
from tests.generate.fakes import load_fake_bundle, write_fake_model_dir


def test_preview_is_deterministic_and_keeps_prompts(tmp_path):
    model = write_fake_model_dir(str(tmp_path / "m"), max_len=24, seed=11)
    a = preview_samples(model, 3, max_len=16, seed=1, loader=load_fake_bundle)
    assert a == preview_samples(model, 3, max_len=16, seed=1, loader=load_fake_bundle) and len(a) == 3
    assert all(isinstance(t, str) for t in a)
    b = preview_samples(model, 2, prompts=["great"], max_len=16, seed=1, loader=load_fake_bundle)
    assert all(t.startswith("great") for t in b)

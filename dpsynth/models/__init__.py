"""Decoder-only Transformer, LoRA adapters, soft prompts, KV-cache decoding and presets."""

from dpsynth.models.config import PRESETS, ModelConfig, get_config
from dpsynth.models.transformer import Transformer, segment_positions

__all__ = ["PRESETS", "ModelConfig", "Transformer", "get_config", "segment_positions"]

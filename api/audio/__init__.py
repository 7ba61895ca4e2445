"""Audio output: the response formats and the encoders that turn float32 samples into their bytes."""

from api.audio.encoder import AudioEncoder, create_encoder, to_int16
from api.audio.formats import CONTENT_TYPES, AudioFormat

__all__ = ["CONTENT_TYPES", "AudioEncoder", "AudioFormat", "create_encoder", "to_int16"]

"""OpenAI-compatible text-to-speech server over the Kokoro-82M model."""

__version__ = "0.1.0"

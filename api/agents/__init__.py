"""The streaming-speech protocols of other vendors that voice-agent frameworks already speak (Deepgram's,
ElevenLabs'), each a thin adapter over the live session (api/live.py)."""

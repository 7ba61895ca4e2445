"""Live speech: the session that speaks text as it arrives (session.py), and beneath it the streaming
protocols of other vendors that voice-agent frameworks already speak (Deepgram's, ElevenLabs', Cartesia's,
Wyoming's), each a thin adapter over that session."""

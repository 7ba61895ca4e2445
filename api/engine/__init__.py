"""Engines turn phoneme tokens into audio; the scheduler runs them off the event loop."""

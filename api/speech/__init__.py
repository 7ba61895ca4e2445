"""The speech service: text in, audio out, for every route and session above it."""

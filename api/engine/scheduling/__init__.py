"""The engine's scheduler: its queue, the pure batching and lane decisions, and the threads that run them."""

"""The engine's lifecycle under the scheduler: its states, and what stands in for a model freed while idle."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

from api.engine.base import ChunkAudio, Engine, EngineError, ReadyCallback, SynthesisItem


class EngineState(str, enum.Enum):
    STARTING = "starting"
    READY = "ready"
    UNLOADED = "unloaded"  # the model was freed while idle; the next request loads it again
    RELOADING = "reloading"
    FAILED = "failed"
    STOPPED = "stopped"


# A worker in these states serves requests (an unloaded one after loading its model again): /ready says so.
SERVING_STATES = frozenset({EngineState.READY, EngineState.UNLOADED, EngineState.RELOADING})


class UnloadedEngine:
    """What the scheduler shows of an engine whose model it has freed: its name, vocabulary and abilities,
    so that the routes answer as before; nothing to synthesize with until a new engine is loaded."""

    def __init__(self, engine: Engine) -> None:
        self.name = engine.name
        self.sample_rate = engine.sample_rate
        self.vocab: Mapping[str, int] = dict(engine.vocab)
        self.gives_durations = engine.gives_durations
        self.batch_defaults = engine.batch_defaults

    def load(self) -> None:
        raise EngineError("an unloaded engine is replaced by a new one, not loaded again")

    def synthesize(
        self, items: Sequence[SynthesisItem], on_ready: ReadyCallback | None = None
    ) -> list[ChunkAudio]:
        raise EngineError("the model is unloaded")


def commits_unload(*, wanted: bool, queued: int, running: int) -> bool:
    """Whether an unload asked for commits now: only with no chunk queued and no call running."""
    return wanted and queued == 0 and running == 0

"""Contexts on one socket (ElevenLabs' multi-stream input, Cartesia's WebSocket): each context is one
utterance of the live session, spoken in the order the contexts started; this base class keeps which
context each utterance speaks for and which the client has given up on."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from api.live.protocol import LiveProtocol, SessionLink, Utterance
from api.protocol import InputTextClear, InputTextDone, LiveSession


@dataclass
class Context:
    """One of the client's contexts, from its first message to its last audio."""

    id: str | None
    closed: bool = False  # the client has sent all its text
    chars_end_ms: float = 0.0  # ElevenLabs: where its last alignment ended, from the context's start
    options: dict[str, Any] = field(default_factory=dict)  # a vendor's settings sent with its first message


class ContextProtocol(LiveProtocol):
    """A vendor protocol whose client names contexts. Subclasses translate messages through `open`, `close`
    and `abandon`, and say what a context's end looks like in `final`."""

    def __init__(self) -> None:
        self.pending: deque[Context] = deque()  # contexts whose utterance has not finished, in order
        self.spoken: dict[int, Context] = {}  # utterance number -> its context, from its first audio
        self.abandoned: list[Context] = []

    def subprotocol(self, offered: Sequence[str]) -> str | None:
        return None

    def current(self, context_id: str | None) -> Context | None:
        """The context taking text, if it is `context_id` and still open."""
        last = self.pending[-1] if self.pending else None
        return last if last is not None and last.id == context_id and not last.closed else None

    def find(self, context_id: str | None) -> Context | None:
        return next((context for context in self.pending if context.id == context_id), None)

    def open(self, context_id: str | None, options: dict[str, Any] | None = None) -> list[BaseModel]:
        """A new context; an open one before it has all its text."""
        events: list[BaseModel] = []
        if self.pending and not self.pending[-1].closed:
            self.pending[-1].closed = True
            events.append(InputTextDone(type="input_text.done"))
        self.pending.append(Context(context_id, options=options or {}))
        return events

    def close(self, context: Context) -> list[BaseModel]:
        """The context has all its text: its utterance ends once spoken."""
        if context.closed:
            return []
        context.closed = True
        return [InputTextDone(type="input_text.done")] if context is self.pending[-1] else []

    def abandon(self) -> list[BaseModel]:
        """Barge-in: every context not finished is dropped at once (the session's clear)."""
        self.abandoned = list(self.pending)
        self.pending.clear()
        return [InputTextClear(type="input_text.clear")]

    def context_of(self, utterance: Utterance) -> Context:
        context = self.spoken.get(utterance.number)
        if context is None:
            context = self.pending[0] if self.pending else Context(None, closed=True)
            self.spoken[utterance.number] = context
        return context

    async def done(self, session: SessionLink, utterance: Utterance) -> None:
        context = self.context_of(utterance)
        self.spoken.pop(utterance.number, None)
        if self.pending and self.pending[0] is context:
            self.pending.popleft()
        await self.final(session, context, abandoned=False)

    async def cleared(self, session: SessionLink) -> None:
        for context in self.abandoned:
            await self.final(session, context, abandoned=True)
        self.abandoned = []
        self.spoken.clear()

    async def final(self, session: SessionLink, context: Context, *, abandoned: bool) -> None:
        """What the client hears at a context's end (its audio all sent, or it was abandoned)."""

    async def updated(self, session: SessionLink, config: LiveSession) -> None:
        raise AssertionError("a vendor protocol sends no session update")

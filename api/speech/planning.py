"""How text is planned into chunks: the token limits the settings give, and the planners built on them."""

from __future__ import annotations

import dataclasses

from api.settings import Settings
from api.text.chunk import ChunkLimits
from api.text.plan import Planner


def chunk_limits(settings: Settings) -> ChunkLimits:
    return ChunkLimits(
        first_budget=settings.first_chunk_tokens,
        target_min=settings.chunk_min_tokens,
        target_max=settings.chunk_max_tokens,
        hard_max=settings.chunk_hard_max_tokens,
        # A first-chunk cap below the first budget or above the hard max means no more than they do.
        first_max=min(
            max(settings.first_chunk_max_tokens, settings.first_chunk_tokens), settings.chunk_hard_max_tokens
        ),
        tail_min=min(settings.chunk_tail_min_tokens, settings.chunk_min_tokens),
    )


def request_planner(settings: Settings) -> Planner:
    """A speech request's: its first chunk and G2P piece short, as they set the time to first audio."""
    return Planner(
        limits=chunk_limits(settings),
        piece_chars=settings.g2p_piece_chars,
        first_piece_chars=settings.first_g2p_piece_chars,
    )


def book_planner(settings: Settings) -> Planner:
    """A book chapter's: every chunk planned like a later one, as nobody waits for its first audio."""
    limits = chunk_limits(settings)
    return Planner(
        limits=dataclasses.replace(limits, first_budget=limits.target_min, first_max=limits.hard_max),
        piece_chars=settings.g2p_piece_chars,
        first_piece_chars=settings.g2p_piece_chars,
    )


def utterance_planner(settings: Settings) -> Planner:
    """A live utterance's first phrase's: it starts with a chunk this short, as its synthesis is the wait
    for audio."""
    limits = chunk_limits(settings)
    first_budget = min(settings.live_first_chunk_tokens, limits.hard_max)
    first_max = min(max(settings.live_first_chunk_max_tokens, first_budget), limits.hard_max)
    return Planner(
        limits=dataclasses.replace(limits, first_budget=first_budget, first_max=first_max),
        piece_chars=settings.g2p_piece_chars,
        first_piece_chars=settings.first_g2p_piece_chars,
    )

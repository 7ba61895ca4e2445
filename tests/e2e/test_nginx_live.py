"""The live WebSocket through the repo's nginx config (Debian's nginx in front of two tone-engine
replicas): the upgrade goes through, and an utterance typed in pieces comes back whole."""

from __future__ import annotations

import asyncio

from scripts.bench.bench_live import llm_tokens, speak_live
from tests.e2e.test_nginx import balancer, replicas

__all__ = ["balancer", "replicas"]  # test_nginx's fixtures, used here too

TEXT = "A short sentence for the balancer. And a second one, typed in pieces."


def test_a_live_utterance_goes_through_nginx(balancer: str) -> None:
    session = {"response_format": "pcm", "return_timestamps": True}
    heard = asyncio.run(speak_live(balancer, llm_tokens(TEXT), 0.01, session=session))
    assert not heard.errors
    assert heard.done is not None
    assert [stamp["word"] for stamp in heard.timestamps] == TEXT.split()
    assert len(heard.audio) / 48000 > 2.0

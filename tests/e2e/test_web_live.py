"""The live WebSocket end to end, against a real server process over the tone engine: the playground's live
mode in a real browser (Debian's headless Chromium through Selenium), where "Type it live" types the text
into the socket a word at a time, the audio starts before the typing ends, the read-along follows, Stop is
a barge-in, and a busy server's 1013 is counted down and retried; and the socket through the repo's nginx
config (Debian's nginx), which must pass the upgrade on."""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from scripts.bench.live import llm_tokens, speak_live
from scripts.harness import Server, free_port, serving, spawn
from tests.deploy import load_render_nginx
from tests.e2e.test_web import (
    CHROMEDRIVER,
    CHROMIUM,
    TEXT,
    browser,
    holding_the_only_slot,
    open_page,
    player,
    wait_for,
    web_server,
)

__all__ = ["browser", "web_server"]  # test_web's fixtures, used here too

needs_browser = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (scripts/test.sh installs them)",
)


def metric(server: Server, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", httpx.get(f"{server.url}/metrics").text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@needs_browser
def test_live_mode_speaks_while_it_types_and_the_words_follow(browser: Any, web_server: Server) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, web_server)
    browser.find_element(By.ID, "live").click()
    wait_for(lambda: player(browser, "samplesScheduled") > 0, what="live audio to arrive")
    typed_then = player(browser, "wordsTypedAtFirstAudio")
    assert 0 < typed_then < len(TEXT.split()), "the audio should start before the whole text is typed"
    assert "after the first word was typed" in browser.find_element(By.ID, "ttfa").text
    first_word = wait_for(lambda: player(browser, "currentWord") >= 0 and player(browser, "currentWord") + 1)
    wait_for(lambda: player(browser, "currentWord") + 1 > first_word + 2, what="the highlight to advance")
    wait_for(lambda: "Done" in browser.find_element(By.ID, "status").text, timeout=60, what="the end")
    words = [span.text for span in browser.find_elements(By.CSS_SELECTOR, "#readalong span")]
    assert " ".join(words) == TEXT
    assert metric(web_server, 'kokoro_live_utterances_total{end="done"}') >= 1


@needs_browser
def test_stop_while_live_is_a_barge_in(browser: Any, web_server: Server) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, web_server)
    text = browser.find_element(By.ID, "text")
    text.clear()
    text.send_keys(" ".join([TEXT] * 4))
    cleared = metric(web_server, 'kokoro_live_utterances_total{end="cleared"}')
    browser.find_element(By.ID, "live").click()
    wait_for(lambda: player(browser, "samplesScheduled") > 0, what="live audio to arrive")
    browser.find_element(By.ID, "stop").click()
    assert not player(browser, "playing")
    wait_for(
        lambda: metric(web_server, 'kokoro_live_utterances_total{end="cleared"}') > cleared,
        what="the server to drop the utterance",
    )
    assert metric(web_server, "kokoro_engine_queue_depth") == 0
    assert browser.find_element(By.ID, "live").is_enabled()


@needs_browser
def test_a_busy_server_closes_with_1013_and_the_page_retries(browser: Any, web_server: Server) -> None:
    """The server takes one request at a time and has no waiting line: while a request holds the slot, a
    live socket is refused (close code 1013, 'retry after N s'); the page counts down and tries again."""
    from selenium.webdriver.common.by import By

    open_page(browser, web_server)
    with holding_the_only_slot(web_server):
        browser.find_element(By.ID, "live").click()
        status = wait_for(lambda: "1013" in (text := browser.find_element(By.ID, "status").text) and text)
        assert "Retrying in" in status
        assert player(browser, "retries") >= 1
    wait_for(lambda: player(browser, "samplesScheduled") > 0, timeout=60, what="the retry to play")


@pytest.fixture(scope="module")
def balancer(web_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """nginx with the repo's config in front of the page's server (one replica is enough for the upgrade)."""
    if shutil.which("nginx") is None:
        pytest.skip("nginx is not installed (scripts/test.sh installs it)")
    render = load_render_nginx()
    port = free_port()
    folder = tmp_path_factory.mktemp("nginx")
    conf = render.write_config(folder, [web_server.url.removeprefix("http://")], f"127.0.0.1:{port}")
    with serving(spawn(render.nginx_command(conf), folder / "nginx.log", port), timeout_s=20) as nginx:
        yield nginx.url


def test_a_live_utterance_goes_through_nginx(balancer: str) -> None:
    session = {"response_format": "pcm", "return_timestamps": True}
    heard = asyncio.run(speak_live(balancer, llm_tokens(TEXT), 0.01, session=session))
    assert not heard.errors
    assert heard.done is not None
    assert [stamp["word"] for stamp in heard.timestamps] == TEXT.split()
    assert len(heard.audio) / 48000 > 2.0

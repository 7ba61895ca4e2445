"""The playground page in a real browser: Debian's headless Chromium driven by Selenium (Debian's
chromium-driver), against a real server process over the tone engine. It types text, presses Play, and
checks that audio plays, that the highlighted word advances, that the download is a valid file of the
chosen format, and that a 503 is shown and retried; it also takes the docs' screenshots."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.harness import Server, running_server

ROOT = Path(__file__).resolve().parents[2]
UPDATE_SCREENSHOTS_ENV = "KOKORO_UPDATE_SCREENSHOTS"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
TEXT = "The quick brown fox jumps over the lazy dog. Then it runs far away into the green hills."

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (scripts/test.sh installs them)",
)


@pytest.fixture(scope="module")
def web_server(random_weights: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("web-server") / "server.log"
    # One request at a time and none waiting, so the test can make the page meet a 503; the tone engine
    # sleeps a little per chunk so playback and synthesis overlap as with a real model.
    with running_server(
        random_weights,
        log,
        module="tests.tone_server",
        KOKORO_MAX_INFLIGHT="1",
        KOKORO_MAX_WAITING="0",
        TONE_ENGINE_DELAY_S="0.2",
        KOKORO_DATA_DIR=str(log.parent / "data"),
    ) as server:
        yield server


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """Where the page's screenshots go: the docs' own (docs/img) with KOKORO_UPDATE_SCREENSHOTS=1, else a
    temporary folder, so that a test run leaves the working tree as it found it."""
    if os.environ.get(UPDATE_SCREENSHOTS_ENV) == "1":
        return ROOT / "docs" / "img"
    return tmp_path


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--autoplay-policy=no-user-gesture-required",
    ):
        options.add_argument(flag)
    options.add_argument("--window-size=1200,1400")
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path)}
    )
    driver.download_dir = tmp_path
    yield driver
    driver.quit()


def player(driver: Any, field: str) -> Any:
    return driver.execute_script(f"return window.kokoroPlayer.{field};")


def wait_for(condition: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def open_page(driver: Any, server: Server) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{server.url}/web")
    wait_for(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#voice option")) > 10, what="the voice list")
    text = driver.find_element(By.ID, "text")
    text.clear()
    text.send_keys(TEXT)


def test_play_streams_audio_and_the_words_follow(browser: Any, web_server: Server, screenshots: Path) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, web_server)
    browser.find_element(By.ID, "play").click()
    wait_for(lambda: player(browser, "samplesScheduled") > 0, what="audio to arrive")
    assert player(browser, "ttfaMs") is not None
    assert "Time to first audio" in browser.find_element(By.ID, "ttfa").text
    # The audio graph runs: its clock advances while the words light up one after another.
    first_time = browser.execute_script("return window.kokoroPlayer.contextTime();")
    first_word = wait_for(lambda: player(browser, "currentWord") >= 0 and player(browser, "currentWord"))
    wait_for(lambda: player(browser, "currentWord") > first_word + 2, what="the highlight to advance")
    assert browser.execute_script("return window.kokoroPlayer.contextTime();") > first_time
    highlighted = browser.find_elements(By.CSS_SELECTOR, "#readalong span.current")
    assert len(highlighted) == 1
    assert highlighted[0].get_attribute("aria-current") == "true"
    assert highlighted[0].text in TEXT
    wait_for(lambda: "Done" in browser.find_element(By.ID, "status").text, timeout=60, what="the end")
    words = [span.text for span in browser.find_elements(By.CSS_SELECTOR, "#readalong span")]
    assert " ".join(words) == TEXT
    browser.save_screenshot(str(screenshots / "web-desktop.png"))


@pytest.mark.parametrize("fmt", ["wav", "mp3"])
def test_download_is_a_valid_file_of_the_chosen_format(browser: Any, web_server: Server, fmt: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    open_page(browser, web_server)
    browser.find_element(By.ID, "play").click()
    wait_for(lambda: "Done" in browser.find_element(By.ID, "status").text, timeout=60, what="playback")
    Select(browser.find_element(By.ID, "format")).select_by_visible_text(fmt)
    browser.find_element(By.ID, "download").click()
    target = browser.download_dir / f"speech.{fmt}"
    wait_for(target.exists, what=f"speech.{fmt}")
    data = wait_for(lambda: target.read_bytes() if target.stat().st_size > 1000 else b"", what="the file")
    if fmt == "wav":
        assert data[:4] == b"RIFF"
        assert data[8:12] == b"WAVE"
        played = player(browser, "samplesScheduled")
        assert len(data) == 44 + 2 * played  # exactly the samples that were played
    else:
        assert data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0)


@contextmanager
def holding_the_only_slot(server: Server) -> Iterator[None]:
    """The block runs while a long stream holds the server's one request slot; the stream ends after it."""
    release = threading.Event()
    holding = threading.Event()

    def hold() -> None:
        body = {"input": " ".join([TEXT] * 6), "voice": "af_heart", "response_format": "pcm"}
        with httpx.stream("POST", f"{server.url}/v1/audio/speech", json=body, timeout=120) as response:
            for _ in response.iter_bytes():
                holding.set()
                if release.is_set():
                    break

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(30)
        yield
    finally:
        release.set()
        holder.join(60)


def test_a_503_is_shown_with_its_countdown_and_retried(browser: Any, web_server: Server) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, web_server)
    with holding_the_only_slot(web_server):
        browser.find_element(By.ID, "play").click()
        status = wait_for(lambda: "503" in (text := browser.find_element(By.ID, "status").text) and text)
        assert "Retrying in" in status
        assert player(browser, "retries") >= 1
    wait_for(lambda: player(browser, "samplesScheduled") > 0, timeout=60, what="the retry to play")


def test_voice_search_language_filter_and_mix(browser: Any, web_server: Server) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    open_page(browser, web_server)
    Select(browser.find_element(By.ID, "language")).select_by_visible_text("British English")
    voices = [
        option.get_attribute("value") for option in Select(browser.find_element(By.ID, "voice")).options
    ]
    assert voices
    assert all(voice.startswith("b") for voice in voices)
    search = browser.find_element(By.ID, "voice-search")
    search.send_keys("george")
    assert [o.get_attribute("value") for o in Select(browser.find_element(By.ID, "voice")).options] == [
        "bm_george"
    ]
    browser.find_element(By.ID, "mix-add").click()
    search.clear()
    search.send_keys("emma")
    weight = browser.find_element(By.ID, "mix-weight")
    weight.clear()
    weight.send_keys("2")
    browser.find_element(By.ID, "mix-add").click()
    assert "bm_george(1)+bf_emma(2)" in browser.find_element(By.ID, "curl").text
    browser.find_element(By.ID, "play").click()
    wait_for(lambda: player(browser, "samplesScheduled") > 0, what="the mix to play")


def test_a_400_is_shown_by_its_field(browser: Any, web_server: Server) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, web_server)
    text = browser.find_element(By.ID, "text")
    text.clear()
    text.send_keys("Hello [voice:nobody] there.")
    browser.find_element(By.ID, "play").click()
    error = wait_for(lambda: browser.find_element(By.ID, "text-error").text, what="the field's message")
    assert "nobody" in error
    assert text.get_attribute("aria-invalid") == "true"


def test_phone_width_layout(browser: Any, web_server: Server, screenshots: Path) -> None:
    from selenium.webdriver.common.by import By

    browser.set_window_size(390, 1400)
    open_page(browser, web_server)
    # Nothing is wider than the screen: no sideways scrolling on a phone.
    assert browser.execute_script("return document.documentElement.scrollWidth;") <= 390
    for element_id in ("text", "voice", "play", "download", "speed"):
        assert browser.find_element(By.ID, element_id).is_displayed()
    browser.save_screenshot(str(screenshots / "web-phone.png"))


def test_the_book_tab_makes_an_audiobook_with_its_chapters(
    browser: Any, web_server: Server, screenshots: Path
) -> None:
    import av
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    open_page(browser, web_server)
    browser.find_element(By.ID, "tab-book").click()
    assert not browser.find_element(By.ID, "speech-panel").is_displayed()
    assert browser.find_element(By.ID, "tab-book").get_attribute("aria-selected") == "true"
    browser.find_element(By.ID, "book-file").send_keys(str(ROOT / "tests" / "data" / "books" / "alice.md"))
    Select(browser.find_element(By.ID, "book-format")).select_by_visible_text("mp3")
    browser.find_element(By.ID, "book-start").click()
    done = wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, "#book-jobs li[data-state=done]"),
        timeout=90,
        what="the book to be done",
    )[0]
    chapters = [line.text for line in done.find_elements(By.CSS_SELECTOR, "ol li")]
    assert chapters[0] == "Chapter I. Down the Rabbit-Hole (0:00)"
    assert chapters[2].startswith("Chapter III. A Caucus-Race and a Long Tale (0:")
    assert "Done:" in done.find_element(By.CLASS_NAME, "job-state").text
    browser.save_screenshot(str(screenshots / "web-book.png"))
    done.find_element(By.XPATH, ".//button[starts-with(., 'Download')]").click()
    target = browser.download_dir / "Alice's Adventures in Wonderland.mp3"
    wait_for(lambda: target.exists() and target.stat().st_size > 0, what="the book's download")
    with av.open(str(target)) as container:
        assert [chapter["metadata"]["title"] for chapter in container.chapters()][1] == (
            "Chapter II. The Pool of Tears"
        )

"""The page at / in a real headless Chromium (Debian's, driven by Playwright) against a running server:
it fills a template, shows where and when each position was revealed, and replays it step by step."""

from __future__ import annotations

import shutil

import httpx
import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def page(tmp_path):
    from playwright.sync_api import sync_playwright

    if not shutil.which(CHROMIUM):
        pytest.fail("Debian's chromium is missing: bash scripts/test.sh installs it (apt-get install chromium)")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                       headless=True, args=FLAGS,
                                                       viewport={"width": 1000, "height": 700})
        try:
            yield context.new_page()
        finally:
            context.close()


def test_the_page_fills_a_template_and_shows_the_order(server, page, tmp_path):
    template = "to be[MASK:6]or not[MASK:8]"
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('model').textContent.includes('context')")
    page.fill("#prompt", template)
    page.select_option("#order", "l2r")
    page.fill("#seed", "3")
    page.click("#go")
    page.wait_for_selector("body[data-done]", timeout=60_000)
    assert page.evaluate("document.body.dataset.done") == "yes", page.evaluate("window.aogptState.error")

    # what the page shows is what the server decided for the same request
    request = {"prompt": template, "order": "l2r", "seed": 3, "temperature": 0.8, "top_p": 0.95}
    want = httpx.post(server.url + "/v1/completions", json=request, timeout=60).json()["choices"][0]["aogpt"]
    cells = page.eval_on_selector_all(
        "#text .tok", "cs => cs.map(c => [c.dataset.step, c.textContent, getComputedStyle(c).backgroundColor])")
    assert len(cells) == len(want["tokens"])
    steps = [int(s) for s, _, _ in cells]
    assert steps == [max(s, 0) for s in want["steps"]]  # known positions are step 0 on the page
    assert "".join(text for _, text, _ in cells) == "".join(want["pieces"])
    assert "".join(text for s, text, _ in cells if s == "0") == "to beor not"
    revealed = [s for s in steps if s > 0]
    assert revealed == sorted(revealed), "left to right: the steps grow along the text"
    colours = {colour for s, _, colour in cells if int(s) > 0}
    assert len(colours) > 1, "positions are coloured by the step that revealed them"

    # the replay slider: at step k only positions revealed by step k show their tokens
    last = max(steps)
    k = last // 2
    page.fill("#slider", str(k))
    masked = page.eval_on_selector_all("#text .tok.masked", "cs => cs.length")
    assert masked == sum(s > k for s in steps)
    now = page.eval_on_selector_all("#text .tok.now", "cs => cs.map(c => Number(c.dataset.step))")
    assert now and set(now) == {k}
    assert page.text_content("#stepLabel") == f"step {k} / {last}"
    page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
    assert (tmp_path / "page.png").stat().st_size > 10_000


def test_the_page_says_what_is_wrong_with_a_request(server, page):
    page.goto(server.url + "/")
    page.fill("#prompt", "x" * 40)  # more than the context of 32 tokens
    page.click("#go")
    page.wait_for_selector("body[data-done]", timeout=60_000)
    assert page.evaluate("document.body.dataset.done") == "error"
    assert "exceed the model's context" in page.text_content("#status")

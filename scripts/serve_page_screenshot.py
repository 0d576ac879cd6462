"""A screenshot of `aogpt serve`'s page (docs/img/serve-page.png): Debian's headless Chromium, driven by
Playwright, fills a template, generates, and stops the replay slider part-way.

    .venv/bin/aogpt serve --checkpoint RUN --port 8000 &
    .venv/bin/python scripts/serve_page_screenshot.py --url http://127.0.0.1:8000/ --out docs/img/serve-page.png
"""

from __future__ import annotations

import argparse
import tempfile

from playwright.sync_api import sync_playwright

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000/")
    p.add_argument("--out", default="docs/img/serve-page.png")
    p.add_argument("--template", default="HAMLET:\nTo be, or not to be, [MASK:16]\n[MASK:24]\n\nOPHELIA:\n[MASK:24]")
    p.add_argument("--order", default="random")
    p.add_argument("--seed", default="7")
    p.add_argument("--replay", type=float, default=0.6, help="where the slider stops, as a share of the steps")
    args = p.parse_args()
    with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        context = pw.chromium.launch_persistent_context(profile, executable_path="/usr/bin/chromium", headless=True,
                                                        args=FLAGS, viewport={"width": 1100, "height": 820})
        page = context.new_page()
        page.goto(args.url)
        page.wait_for_function("document.getElementById('model').textContent.includes('context')")
        page.fill("#prompt", args.template)
        page.select_option("#order", args.order)
        page.fill("#seed", args.seed)
        page.click("#go")
        page.wait_for_selector("body[data-done]", timeout=120_000)
        last = page.evaluate("window.aogptState.last")
        page.fill("#slider", str(round(last * args.replay)))
        page.wait_for_timeout(500)  # let the colour transitions finish
        page.screenshot(path=args.out, full_page=True)
        context.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

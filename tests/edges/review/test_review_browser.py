"""The review page in real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright): sign in,
review a held record with the keyboard only, add a missed span by selecting it, release; then the released
output and the audit trail. Chromium missing is a failure, not a skip (scripts/install-browser.sh installs it)."""
from __future__ import annotations

import os
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from adapter.review.app import create_review_app
from tests.support import NOTE, PASSWORDS, LiveServer, make_setup, released_text, secrets_of

CHROMIUM = os.environ.get("DEID_ADAPTER_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
SCREENSHOT = Path(os.environ.get("DEID_ADAPTER_SCREENSHOT_DIR", "/tmp")) / "deid-review-page.png"


def select_text(page, needle: str) -> None:
    """Drag the mouse across `needle` in the note, as a reviewer selects it."""
    box = page.evaluate("""(needle) => {
        const walker = document.createTreeWalker(document.querySelector('.texts'), NodeFilter.SHOW_TEXT);
        for (let n = walker.nextNode(); n; n = walker.nextNode()) {
            const i = n.data.indexOf(needle);
            if (i < 0) continue;
            const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + needle.length);
            const rects = r.getClientRects(); const a = rects[0], b = rects[rects.length - 1];
            return {x1: a.left + 1, y1: a.top + a.height / 2, x2: b.right - 1, y2: b.top + b.height / 2};
        }
        return null; }""", needle)
    assert box, f"{needle!r} not on the page"
    page.mouse.move(box["x1"], box["y1"])
    page.mouse.down()
    page.mouse.move(box["x2"], box["y2"], steps=5)
    page.mouse.up()


def test_keyboard_review_in_chromium(tmp_path, test_key):
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run scripts/install-browser.sh"
    setup = make_setup(tmp_path, test_key)
    item = setup.hold()
    started = time.perf_counter()
    with LiveServer(create_review_app(setup.config())) as srv, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 720})
        page.goto(srv.url + "/")
        assert page.url.endswith("/login")  # no access without sign-in

        # sign in with the keyboard: the name field has focus (autofocus)
        page.wait_for_function("document.activeElement && document.activeElement.name === 'name'")
        page.keyboard.type("rita")
        page.keyboard.press("Tab")
        page.keyboard.type(PASSWORDS["rita"])
        page.keyboard.press("Enter")
        page.wait_for_url(srv.url + "/")
        assert page.locator("table.queue tbody tr").count() == 1

        page.goto(f"{srv.url}/records/{item}")
        marks = page.locator("mark.span")
        assert marks.count() == 2
        assert marks.nth(0).get_attribute("data-label") == "DATE 0.90 · undecided"

        # keyboard only: Tab to the first span (past the header's links and the "Keys" summary), confirm it;
        # j to the next, reject it
        for _ in range(20):
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.matches('mark.span')"):
                break
        assert page.evaluate("document.activeElement.dataset.origin") == "0"
        page.keyboard.press("c")
        page.keyboard.press("j")
        page.keyboard.press("r")
        assert marks.nth(0).get_attribute("data-action") == "confirm"
        assert marks.nth(1).get_attribute("data-action") == "reject"

        # a missed span: select it, press a (adds with the category chosen under "Add a missed span": NAME)
        select_text(page, "Quentin Marsh")
        page.keyboard.press("a")
        added = page.locator("mark.act-add")
        assert added.count() == 1 and added.inner_text() == "Quentin Marsh"
        assert page.evaluate("document.activeElement.dataset.action") == "add"
        page.screenshot(path=str(SCREENSHOT), full_page=True)

        page.keyboard.press("Control+Enter")
        page.wait_for_selector("#next")
        assert "Released" in page.locator("#status").inner_text()
        html = page.content()
        browser.close()
    elapsed = time.perf_counter() - started
    print(f"browser review: {elapsed:.2f} s, screenshot {SCREENSHOT}")

    assert all(s not in html for s in secrets_of(setup, test_key))
    assert released_text(setup, item) == (
        "Seen on [DATE] by Dr. Alvarez; call 617-555-0142. Lives with [NAME] in Brookline.")
    review = [r for r in setup.trail.export(operations=["review"])]
    assert len(review) == 1 and review[0]["actor"] == "rita" and review[0]["detail"]["decision"] == "release"
    actions = sorted((f["category"], f["detector"]) for f in review[0]["findings"])
    assert actions == [("DATE", "review:confirm"), ("NAME", "review:add"), ("PHONE_NUMBER", "review:reject")]
    start = NOTE.index("Quentin")
    assert [f["start"], f["end"]] == [start, start + len("Quentin Marsh")] if (f := next(
        f for f in review[0]["findings"] if f["detector"] == "review:add")) else False
    assert setup.trail.verify().ok
    assert setup.queue.row(item).status == "released" and setup.queue.row(item).reviewer == "rita"

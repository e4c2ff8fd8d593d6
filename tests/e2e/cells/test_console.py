"""The console's System page through the router (docs/console.md): the
router's /readyz names the cells, the page offers a switch between them, and
each cell's figures come from that cell (GET /v1/system?cell=NAME). A real
headless Chromium, as tests/e2e/test_console.py drives it."""

from __future__ import annotations

import pytest

from tests.e2e.test_console import VIEWPORT, WAIT_MS, browser, sign_in  # noqa: F401 (fixture)
from tests.support.cells import OPERATOR_KEY, ROUTER

pytestmark = pytest.mark.e2e


def test_console__system_through_the_router__each_cell_by_its_switch(cells, browser):  # noqa: F811
    context = browser.new_context(viewport=VIEWPORT, base_url=ROUTER)
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        sign_in(page, OPERATOR_KEY)
        page.get_by_role("link", name="System").click()
        switch = page.locator("#cells")
        switch.wait_for()
        first = switch.locator("strong").inner_text()
        other = "eu" if first == "us" else "us"
        assert sorted([first, *switch.locator("a").all_inner_texts()]) == ["eu", "us"]
        page.locator(".page-head p", has_text=f"Cell {first}.").wait_for()
        page.locator("#consumers").wait_for()

        switch.get_by_role("link", name=other).click()
        page.locator(".page-head p", has_text=f"Cell {other}.").wait_for()
        assert switch.locator("strong").inner_text() == other
        assert "cell=" + other in page.url
        page.locator("#consumers").wait_for()
        # The window keeps the cell.
        page.locator("#windows").get_by_role("link", name="15 min").click()
        page.locator("#windows strong", has_text="15 min").wait_for()
        assert switch.locator("strong").inner_text() == other
    finally:
        context.close()
    assert not errors, f"the page threw: {errors}"

"""The console through the router (docs/console.md): the System page offers
a switch between the cells the router's /readyz names, each cell's figures
from that cell (GET /v1/system?cell=NAME); a tenant's page, its cell and its
keys, whichever cell it lives in. A real headless Chromium, as
tests/e2e/test_console.py drives it."""

from __future__ import annotations

import pytest

from tests.e2e.test_console import VIEWPORT, WAIT_MS, browser, sign_in  # noqa: F401 (fixture)
from tests.support.cells import OPERATOR_KEY, ROUTER, new_tenant

pytestmark = pytest.mark.e2e


def test_console__through_the_router__each_cell_s_system_and_tenants(cells, browser):  # noqa: F811
    context = browser.new_context(viewport=VIEWPORT, base_url=ROUTER)
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        sign_in(page, OPERATOR_KEY)
        page.get_by_role("link", name="System").click()
        switch = page.locator("#cell-switch")
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

        # A tenant of each cell: its page names its cell and shows its keys,
        # each read from that cell through the router.
        made = {cell: new_tenant(cell, "console") for cell in ("us", "eu")}
        for cell, tenant in made.items():
            page.goto(f"/ui/#/tenants/{tenant['tenant_id']}")
            page.locator("#tenant-cell", has_text=cell).wait_for()
            page.locator("#keys tbody tr").first.wait_for()
        # The list merges every cell's tenants (the router's GET /v1/tenants);
        # the first page, sorted by id, holds both cells' (a tenant of each at
        # least, and the package makes a few dozen).
        page.goto("/ui/#/tenants")
        page.locator("#tenants tbody tr").first.wait_for()
        cells_line = page.locator("#cells").inner_text()
        assert "us " in cells_line and "eu " in cells_line, cells_line
        cells_shown = set(page.locator("#tenants td[data-label='Cell']").all_inner_texts())
        assert cells_shown == {"us", "eu"}, cells_shown
    finally:
        context.close()
    assert not errors, f"the page threw: {errors}"

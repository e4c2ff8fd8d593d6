"""The web console (/ui/) in a real browser: headless Chromium, the system's own
(Debian's package, `make system-deps`), driven by Playwright, against a real
gateway on the test's database and broker.

What a person does: sign in with a key, see the jobs the API made, watch runs
appear without reloading, pause a job from the page, read a workflow run's
graph, and find that another tenant's key shows none of it and a bad key is
refused in words. Screenshots of the main pages at 1280x800 go to
.artifacts/console/ (docs/console.md).

Without a chromium binary the browser tests skip, saying why, except in CI
(CI=true), where a missing browser fails them.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator

import httpx
import pytest

from cronwheel.kafka import Topics
from services.gateway.app import create_app
from tests.support import platform_state
from tests.support.gateway import served
from tests.support.procs import ROOT, launcher
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e
OPERATOR_KEY = "cwop_test_" + uuid.uuid4().hex
ARTIFACTS = ROOT / ".artifacts" / "console"
VIEWPORT = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
WAIT_MS = 15_000  # a page refreshes itself every 3 s


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        why = "no chromium binary on PATH (make system-deps installs Debian's `chromium`)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}: in CI the console's browser tests must run")
        pytest.skip(why)
    return path


@pytest.fixture(scope="module")
def browser():
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def stack(database_url, kafka_bootstrap, topic_prefix) -> Iterator[dict]:
    """A served gateway and two tenants, each with a client holding its key."""
    app = create_app(database_url, Topics(topic_prefix), kafka_bootstrap, OPERATOR_KEY)
    with served(app) as op:
        op.headers["Authorization"] = f"Bearer {OPERATOR_KEY}"
        out = {"url": str(op.base_url).rstrip("/"), "operator": op}
        for name in ("acme", "globex"):
            r = op.post("/v1/tenants", json={"name": name})
            assert r.status_code == 201, r.text
            out[name] = httpx.Client(
                base_url=out["url"],
                timeout=10,
                headers={"Authorization": f"Bearer {r.json()['api_key']}"},
            )
            out[f"{name}_key"] = r.json()["api_key"]
        try:
            yield out
        finally:
            out["acme"].close()
            out["globex"].close()


@pytest.fixture
def page(browser, stack):
    # A viewer in Paris: the page shows its zone, UTC on hover.
    context = browser.new_context(
        viewport=VIEWPORT, base_url=stack["url"], timezone_id="Europe/Paris", locale="en-GB"
    )
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    try:
        yield pg
    finally:
        context.close()
    assert not errors, f"the page threw: {errors}"


def sign_in(pg, key: str) -> None:
    pg.goto("/ui/")
    pg.fill("#key", key)
    pg.click("#sign-in button[type=submit]")


def shot(pg, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def confirm(pg) -> None:
    pg.wait_for_selector("dialog#confirm[open]")
    pg.click("#confirm-ok")


JOB = {
    "name": "nightly-report",
    "schedule": {"cron": "30 2 * * *", "timezone": "America/New_York"},
    "target": {"type": "queue", "queue": "reports"},
    "payload": {"report": "sales"},
}


def test_console__sign_in_see_job_watch_runs_arrive_and_pause(stack, page):
    acme = stack["acme"]
    job = acme.post("/v1/jobs", json=JOB).json()
    acme.post(
        "/v1/jobs",
        json={**JOB, "name": "every-five", "schedule": {"cron": "*/5 * * * *", "timezone": "UTC"}},
    )
    spring = acme.post(
        "/v1/jobs",
        json={**JOB, "name": "spring-forward",
              "schedule": {"cron": "30 2 14 3 *", "timezone": "America/New_York"}},
    ).json()  # fmt: skip

    sign_in(page, stack["acme_key"])
    row = page.locator(f"#jobs tr[data-job-id='{job['job_id']}']")
    row.wait_for()
    text = row.inner_text()
    assert "nightly-report" in text and "30 2 * * *" in text and "at 02:30 every day" in text
    assert "America/New_York" in text and "queue reports" in text and "active" in text
    assert page.locator("#jobs tbody tr").count() == 3
    # The next fire's DST mark in the table is the preview's: 02:30 on March
    # 14th in New York falls in the spring-forward gap in years such as 2027.
    first = acme.get(
        "/v1/schedules/preview",
        params={"cron": "30 2 14 3 *", "timezone": "America/New_York", "count": 1},
    ).json()["fires"][0]
    mark = page.locator(f"#jobs tr[data-job-id='{spring['job_id']}'] .dst")
    if first["dst"] == "gap":
        assert mark.inner_text() == "DST gap"
    else:
        assert mark.count() == 0
    # Next fire in the viewer's zone, UTC on hover.
    assert page.locator("#jobs time").first.get_attribute("title").endswith("Z (UTC)")
    shot(page, "jobs")

    row.get_by_role("link", name="nightly-report").click()
    page.locator("#fires tbody tr").nth(9).wait_for()  # the next ten fires
    page.locator("text=No runs yet").wait_for()
    # Runs appear by the page's own polling: the document is never reloaded.
    page.evaluate("window.__stay = 'same document'")
    run_ids = [acme.post(f"/v1/jobs/{job['job_id']}/trigger").json()["run_id"]]
    page.locator(f"#runs li[data-run-id='{run_ids[0]}']").wait_for()
    run_ids.append(acme.post(f"/v1/jobs/{job['job_id']}/trigger").json()["run_id"])
    page.locator(f"#runs li[data-run-id='{run_ids[1]}']").wait_for()
    assert page.evaluate("window.__stay") == "same document"
    assert page.locator("#runs li").first.get_attribute("data-state") == "PENDING"
    shot(page, "job")

    # Pause from the page, with its confirmation; the API says paused.
    page.get_by_role("button", name="Pause").click()
    confirm(page)
    wait_for(
        lambda: acme.get(f"/v1/jobs/{job['job_id']}").json()["paused"],
        what="the API to say the job is paused",
    )
    page.locator("#job-state", has_text="paused").wait_for()
    page.locator(".flash-ok", has_text="Paused").wait_for()

    # A run: its state, payload, attempts (none yet).
    page.locator(f"#runs li[data-run-id='{run_ids[0]}'] a").click()
    page.locator("#run-state", has_text="PENDING").wait_for()
    assert '"report": "sales"' in page.locator("pre.json").first.inner_text()
    assert "No attempt yet" in page.inner_text("main")
    shot(page, "run")

    # DST marks from the preview: 02:30 on March's Sundays in New York falls
    # into the spring-forward gap once a year.
    sundays = acme.post(
        "/v1/jobs",
        json={**JOB, "name": "march-sundays",
              "schedule": {"cron": "30 2 * 3 0", "timezone": "America/New_York"}},
    ).json()  # fmt: skip
    preview = acme.get(
        "/v1/schedules/preview",
        params={"cron": "30 2 * 3 0", "timezone": "America/New_York", "count": 10},
    ).json()["fires"]
    gaps = [f["local"] for f in preview if f["dst"] == "gap"]
    assert gaps
    page.goto(f"/ui/#/jobs/{sundays['job_id']}")
    page.locator("#fires tbody tr").nth(9).wait_for()
    marked = page.locator("#fires tr[data-dst='gap'] code").all_inner_texts()
    assert marked == gaps
    assert "on Sunday in March" in page.inner_text("main")

    page.set_viewport_size(PHONE)
    page.goto("/ui/#/jobs")
    page.locator("#jobs tbody tr").first.wait_for()
    shot(page, "jobs-phone")


DIAMOND = {
    "name": "etl",
    "nodes": [
        {"name": "extract", "target": {"type": "queue", "queue": "etl"}},
        {"name": "clean", "target": {"type": "queue", "queue": "etl"}, "depends_on": ["extract"]},
        {"name": "enrich", "target": {"type": "queue", "queue": "etl"}, "depends_on": ["extract"]},
        {"name": "audit", "target": {"type": "queue", "queue": "etl"}, "depends_on": ["extract"]},
        {
            "name": "load",
            "target": {"type": "queue", "queue": "etl"},
            "depends_on": ["clean", "enrich"],
        },
        {"name": "notify", "target": {"type": "queue", "queue": "etl"}, "depends_on": ["load"]},
    ],
}


def finish(api: httpx.Client, wfr: str, node: str, outcome: str, **extra) -> None:
    """A worker's part for one node's run, through the worker protocol, once
    the workflow service has created it."""

    def run_id():
        nodes = api.get(f"/v1/workflow-runs/{wfr}").json()["nodes"]
        return next(n["run_id"] for n in nodes if n["name"] == node)

    rid = wait_for(run_id, timeout=60, interval=0.1, what=f"node {node}'s run")
    started = api.post(f"/v1/runs/{rid}/start", json={"worker_id": "w1"}).json()
    done = api.post(
        f"/v1/runs/{rid}/complete",
        json={"attempt": started["attempt"], "start_token": started["start_token"],
              "outcome": outcome, **extra},
    )  # fmt: skip
    assert done.status_code == 200, done.text


def test_console__workflow_run_graph_shows_every_nodes_state(
    stack, page, database_url, kafka_bootstrap, topic_prefix
):
    acme = stack["acme"]
    wf = acme.post("/v1/workflows", json=DIAMOND)
    assert wf.status_code == 201, wf.text
    wf_id = wf.json()["workflow_id"]
    wfr = acme.post(f"/v1/workflows/{wf_id}/trigger").json()["workflow_run_id"]
    with launcher(database_url, kafka_bootstrap, topic_prefix) as launch:
        # The relay carries each completion to the workflow service, which
        # creates the nodes below it.
        launch.start("relay")
        launch.start("workflow")
        finish(acme, wfr, "extract", "SUCCEEDED", result={"rows": 3})
        _test_workflow_pages(stack, page, wf_id, wfr)


def _test_workflow_pages(stack, page, wf_id: str, wfr: str) -> None:
    acme = stack["acme"]
    sign_in(page, stack["acme_key"])
    page.get_by_role("link", name="Workflows").click()
    page.locator(f"#workflows tr[data-workflow-id='{wf_id}'] a").click()
    page.locator("svg#dag g.dag-node").nth(4).wait_for()  # the definition's graph
    page.locator(f"#workflow-runs tr[data-workflow-run-id='{wfr}'] a").click()

    page.locator("#wfr-state").wait_for()
    # Live: the graph follows the run as its nodes finish, without a reload.
    page.evaluate("window.__stay = 'same document'")
    page.locator("g.dag-node[data-node='clean'][data-state='PENDING']").wait_for(timeout=60_000)
    finish(acme, wfr, "clean", "SUCCEEDED")
    finish(acme, wfr, "enrich", "FAILED", error="upstream 503", retryable=False)
    wait_for(
        lambda: acme.get(f"/v1/workflow-runs/{wfr}").json()["state"] == "FAILED",
        timeout=60,
        what="the workflow run to fail",
    )
    page.locator("#wfr-state [data-state='FAILED']").wait_for()
    assert page.evaluate("window.__stay") == "same document"
    nodes = acme.get(f"/v1/workflow-runs/{wfr}").json()["nodes"]
    drawn = page.locator("svg#dag g.dag-node")
    assert drawn.count() == len(nodes) == 6
    for n in nodes:
        g = page.locator(f"svg#dag g.dag-node[data-node='{n['name']}'][data-state='{n['state']}']")
        g.wait_for()  # the page may be one poll behind the API
        assert n["state"].replace("_", " ") in g.text_content()
    states = {n["name"]: n["state"] for n in nodes}
    assert states["extract"] == "SUCCEEDED" and states["enrich"] == "FAILED"
    assert states["notify"] == "SKIPPED"
    # Coloured by state: a succeeded node and a waiting one are filled differently.
    fill = "el => getComputedStyle(el.querySelector('rect')).fill"
    assert page.locator("g.dag-node[data-node='extract']").evaluate(fill) != page.locator(
        "g.dag-node[data-node='enrich']"
    ).evaluate(fill)
    # Laid out in layers: every edge points rightwards.
    xs = page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('g.dag-node')].map(
             g => [g.dataset.node, g.transform.baseVal[0].matrix.e]))"""
    )
    for n in DIAMOND["nodes"]:
        for parent in n.get("depends_on", []):
            assert xs[parent] < xs[n["name"]], (parent, n["name"], xs)
    assert page.locator("svg#dag path.dag-edge").count() == 6
    shot(page, "workflow-run")

    # The root node opens its run, from the keyboard.
    page.locator("g.dag-node[data-node='extract']").focus()
    page.keyboard.press("Enter")
    page.locator("#run-state", has_text="SUCCEEDED").wait_for()
    assert '"rows": 3' in page.inner_text("main")


def test_console__another_tenants_key_sees_none_of_it(stack, page):
    job = stack["acme"].post("/v1/jobs", json=JOB).json()
    sign_in(page, stack["globex_key"])
    page.locator(".empty", has_text="No jobs yet").wait_for()
    assert "nightly-report" not in page.inner_text("body")
    page.goto(f"/ui/#/jobs/{job['job_id']}")  # its id, typed in: the API says no such job
    page.locator(".error", has_text="Not found: no such job").wait_for()
    assert "nightly-report" not in page.inner_text("body")

    page.get_by_role("button", name="Sign out").click()
    page.locator("#key").wait_for()
    assert page.evaluate("sessionStorage.length") == 0
    assert page.evaluate("document.cookie") == ""


def test_console__a_bad_key_is_refused_in_words(stack, page):
    sign_in(page, "cw_" + "x" * 43)
    alert = page.locator("#sign-in-status .error")
    alert.wait_for()
    assert alert.inner_text().startswith("The key was not accepted")
    assert page.locator("#nav").is_hidden()
    assert page.evaluate("sessionStorage.length") == 0


def test_console__operator_sees_tenants_and_the_system(stack, page):
    tenants = stack["operator"].get("/v1/tenants").json()["items"]
    sign_in(page, OPERATOR_KEY)
    page.locator("#tenants tbody tr").nth(1).wait_for()
    names = page.locator("#tenants tbody th").all_inner_texts()
    assert sorted(names) == ["acme", "globex"]
    shot(page, "tenants")

    tenant = next(t for t in tenants if t["name"] == "acme")
    page.locator(f"#tenants tr[data-tenant-id='{tenant['tenant_id']}'] a").click()
    page.locator("#keys tbody tr").first.wait_for()
    assert page.locator("#quotas tbody tr").count() == 3

    page.get_by_role("link", name="System").click()
    ready = page.locator("#readiness")
    ready.wait_for()
    assert ready.get_attribute("data-status") == "ready", ready.inner_text()
    page.locator("#consumers").wait_for()
    assert "Dead letters" in page.inner_text("main")


def test_console__system_page_shows_the_platforms_figures_live(
    stack, page, database_url, kafka_bootstrap, topic_prefix
):
    """GET /v1/system drawn: services and their leases, consumer lag, dead
    letters with their reasons, lateness p50/p99 of known runs, backlogs; a
    dead letter set aside while the page is open appears without a reload."""
    topics = Topics(topic_prefix)
    tenants = {t["name"]: t for t in stack["operator"].get("/v1/tenants").json()["items"]}
    expected = platform_state.known_runs(database_url, tenants["acme"]["tenant_id"])
    platform_state.backlog(database_url, ready=3, held=0, overdue=2)
    platform_state.leases(database_url, live="timer", lapsed="relay")
    runs = topics.runs(tenants["acme"]["tenant_id"])
    platform_state.dead_letter(kafka_bootstrap, topics, "not single-object encoded", runs)

    sign_in(page, OPERATOR_KEY)
    page.get_by_role("link", name="System").click()
    page.locator("#dead-letter-count[data-count='1']").wait_for()
    assert "not single-object encoded" in page.inner_text("#dead-letters")
    # The summary first: each figure in a word and a level.
    tiles = {
        t.get_attribute("id"): (t.get_attribute("data-level"), t.inner_text())
        for t in page.locator("#summary li").all()
    }
    assert tiles["tile-dead"][0] == "bad" and tiles["tile-dead"][1].endswith("1")
    assert tiles["tile-lateness"] == ("ok", "Firing lateness p99\n98 ms")
    assert tiles["tile-services"][0] == "bad" and "1 of 3" in tiles["tile-services"][1]
    assert tiles["tile-timers"][0] == "bad" and tiles["tile-lag"][0] == "ok"
    late = page.locator("#lateness")
    assert late.get_attribute("data-runs") == str(expected["fired"]["runs"])
    assert late.get_attribute("data-fired-p99-ms") == str(expected["fired"]["p99_ms"])
    assert "p99 98 ms" in late.inner_text()
    assert page.locator("#services tr[data-kind='timer']").get_attribute("data-ready") == "true"
    relay = page.locator("#services tr[data-kind='relay']")
    assert relay.get_attribute("data-ready") == "false"
    assert "no instance holds a lease" in relay.inner_text()
    assert (
        page.locator("#consumers tr[data-consumer='dispatcher']").get_attribute("data-lag") == "0"
    )
    assert page.inner_text("#outbox").startswith("3 to publish")
    assert page.inner_text("#timers-overdue").startswith("2 more than")
    assert "1 still pending after being announced again" in page.inner_text("#reannounced")
    shot(page, "system")

    url = page.url
    platform_state.dead_letter(kafka_bootstrap, topics, "expected RunReady, got RunCompleted", runs)
    page.locator("#dead-letter-count[data-count='2']").wait_for()  # redrawn by itself
    assert page.url == url and "got RunCompleted" in page.inner_text("#dead-letters")


def test_console__served_by_the_gateway_as_static_files_only(stack):
    """/ui/ through the gateway's middleware (its POST fast path in front): the
    page, its modules, a strict CSP; nothing outside static/; not in the API spec."""
    c = stack["operator"]
    index = c.get("/ui/", headers={"Authorization": ""})
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in index.headers["content-security-policy"]
    assert c.get("/ui").status_code == 308
    js = c.get("/ui/app.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    for bad in ("/ui/nope.js", "/ui/..%2Fapp.py", "/ui/__init__.py", "/ui/%2e%2e"):
        r = c.get(bad)
        assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND", bad
    assert not any(p.startswith("/ui") for p in c.get("/openapi.json").json()["paths"])


def test_console__keyboard_only_pause_and_an_action_refused_in_words(stack, page):
    acme = stack["acme"]
    job = acme.post("/v1/jobs", json=JOB).json()
    page.goto("/ui/")
    page.locator("#key:focus").wait_for()  # the form takes the focus
    page.keyboard.type(stack["acme_key"])
    page.keyboard.press("Enter")
    page.locator(f"#jobs tr[data-job-id='{job['job_id']}']").wait_for()

    toggle = f"toggle:{job['job_id']}"
    for _ in range(40):  # Tab through the page to the job's Pause button
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.dataset.key") == toggle:
            break
    else:
        raise AssertionError("Tab never reached the Pause button")
    page.keyboard.press("Enter")
    page.locator("#confirm-cancel:focus").wait_for()  # the safe choice first
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    wait_for(lambda: acme.get(f"/v1/jobs/{job['job_id']}").json()["paused"], what="paused")
    # Redrawn as Resume, the focus still on that button.
    page.locator(f"[data-key='{toggle}']:focus", has_text="Resume").wait_for()

    # The job deleted behind the page's back while the confirmation is open
    # (no polling then): Trigger is refused, in words.
    page.locator(f"[data-key='trigger:{job['job_id']}']").click()
    page.wait_for_selector("dialog#confirm[open]")
    assert acme.delete(f"/v1/jobs/{job['job_id']}").status_code == 204
    page.click("#confirm-ok")
    page.locator(".flash-error", has_text="Not found: no such job").wait_for()

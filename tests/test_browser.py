"""A real browser on the example project: find a dead letter by date, fix, replay, see it done.

Headless Chromium (Debian's ``chromium``) driven through Debian's ``chromium-driver``
by Selenium, against ``manage.py runserver`` of the example project on its own
database (a SQLite file, or a PostgreSQL database of this checkout on PostgreSQL
runs), filled by ``manage.py demo``. Screenshots of the dead-letter list and the
dashboard go to the folder the test prints (JOBS_SCREENSHOTS, or reports/screenshots).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import timedelta
from importlib.util import find_spec
from pathlib import Path

import django
import pytest
from django.utils import timezone

from tests.conftest import POSTGRES, ROOT

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        find_spec("django.tasks") is None,
        reason="the example project uses django.tasks (Django >= 6.0)",
    ),
]

EXAMPLE = ROOT / "example_project"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _need_browser():
    if CHROMIUM and CHROMEDRIVER:
        return
    message = (
        "needs Debian's chromium and chromium-driver (python3 dev.py test installs them as root)"
    )
    if os.environ.get("JOBS_REQUIRE_BROWSER"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def example_env(tmp_path):
    """Environment of the example project's processes, on a database of its own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    if not POSTGRES:
        env.pop("EXAMPLE_DB", None)
        env["EXAMPLE_SQLITE"] = str(tmp_path / "example.sqlite3")
        yield env
        return
    import psycopg

    name = f"{os.environ.get('JOBS_TEST_DB', 'django_jobs')}_browser"
    server = {
        "host": os.environ.get("PGHOST", "127.0.0.1"),
        "port": os.environ.get("PGPORT", "5432"),
        "user": os.environ.get("PGUSER", "postgres"),
        "password": os.environ.get("PGPASSWORD") or None,
    }
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    env.update(EXAMPLE_DB="postgres", PGDATABASE=name)
    yield env
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def manage(env, *args, timeout=180):
    out = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.fixture
def live_server_url(example_env, tmp_path):
    """The example project, demo data in, served by runserver on a free local port."""
    manage(example_env, "demo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "runserver.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=EXAMPLE,
        env=example_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{base}/admin/login/", timeout=2).close()  # noqa: S310 - our server
                break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None, (tmp_path / "runserver.log").read_text()
                assert time.monotonic() < deadline, "runserver did not answer"
                time.sleep(0.2)
        yield base
    finally:
        server.terminate()
        server.wait(10)
        log.close()


@pytest.fixture
def browser(tmp_path):
    _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(5)
    yield driver
    driver.quit()


# The README shows the admin as this test sees it (a dead letter, at 1280 px).
README_SCREENSHOT = ROOT / "docs" / "_static" / "admin-dead-letter.png"


@pytest.fixture
def screenshots():
    folder = Path(os.environ.get("JOBS_SCREENSHOTS") or ROOT / "reports" / "screenshots")
    folder = folder / ("postgres" if POSTGRES else "sqlite")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def csp_violations(driver):
    return [
        e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e["message"]
    ]


def test_find_fix_replay_and_see_the_marker(
    browser, live_server_url, example_env, screenshots, capsys
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    b, base = browser, live_server_url
    wait = WebDriverWait(b, 15)

    # Log in.
    b.get(f"{base}/admin/login/?next=/admin/")
    b.find_element(By.ID, "id_username").send_keys("admin")
    b.find_element(By.ID, "id_password").send_keys("admin")
    b.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait.until(ec.url_to_be(f"{base}/admin/"))

    # The dead letters, filtered by a dead-at range with the range filter's own form.
    def filter_dead_at(start, end):
        b.get(f"{base}/admin/django_jobs/deadletter/")
        form = b.find_element(By.ID, "dead-at-form")
        # Days only: no time to type (an empty time once made "Enter a valid time.").
        for name, value in (("gte", start.strftime("%Y-%m-%d")), ("lte", end.strftime("%Y-%m-%d"))):
            field = form.find_element(By.NAME, f"dead_at__range__{name}")
            field.clear()
            field.send_keys(value)
        form.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        wait.until(ec.url_contains("dead_at__range__gte="))
        assert "Enter a valid" not in b.page_source
        return b.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")

    today = timezone.localdate()
    assert filter_dead_at(today - timedelta(days=9), today - timedelta(days=2)) == []
    rows = filter_dead_at(today, today)
    assert len(rows) == 1
    assert "shop.jobs.reserve_stock" in rows[0].text and "fatal" in rows[0].text.lower()
    b.save_screenshot(str(screenshots / "dead-letters.png"))

    # Its detail page says why, and carries the order id in the (masked) payload.
    rows[0].find_element(By.CSS_SELECTOR, "th a").click()
    wait.until(ec.presence_of_element_located((By.ID, "django-jobs-replay-form")))
    summary = b.find_element(By.ID, "django-jobs-summary")
    assert "is no longer made" in summary.text and "fatal error" in summary.text
    order_id = json.loads(b.find_element(By.CSS_SELECTOR, "pre.django-jobs-json").text)["order_id"]
    letter_url = b.current_url
    b.save_screenshot(str(screenshots / "dead-letter.png"))
    if POSTGRES:  # the README's picture of the admin (docs/_static), kept current by this run
        shutil.copyfile(screenshots / "dead-letter.png", README_SCREENSHOT)

    # Put the cause right (the order's item), then replay.
    b.get(f"{base}/admin/shop/order/{order_id}/change/")
    item = b.find_element(By.ID, "id_item")
    item.clear()
    item.send_keys("widget-2")
    b.find_element(By.NAME, "_save").click()
    # The saved message, not the URL: the change page's URL matches already, and a get()
    # while the POST is in flight could land on its redirect instead of the letter.
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".messagelist .success")))
    b.get(letter_url)
    b.find_element(By.ID, "django-jobs-replay").click()
    message = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".messagelist li")))
    assert message.text == "1 replayed."
    assert "is live" in b.page_source
    assert not b.find_elements(By.ID, "django-jobs-replay-form")  # one replay only

    # A real worker runs it; the letter now leads to the job's completion marker.
    manage(example_env, "runjobs", "--burst")
    b.refresh()
    b.find_element(By.LINK_TEXT, "its completion marker").click()
    wait.until(ec.url_contains("/admin/django_jobs/completionmarker/"))
    page = b.page_source
    assert "shop.jobs.reserve_stock" in page and "widget-2" in page

    # The dashboard: two charts drawn server-side, and no CSP violation anywhere on the way.
    b.get(f"{base}/admin/django_jobs/")
    b.find_element(By.LINK_TEXT, "Jobs dashboard").click()
    charts = b.find_elements(By.CSS_SELECTOR, "svg.django-jobs-chart")
    assert len(charts) == 2
    assert len(charts[0].find_elements(By.TAG_NAME, "rect")) == 60
    b.save_screenshot(str(screenshots / "dashboard.png"))
    if django.VERSION >= (6, 0):  # the example project sends a strict CSP there
        violations = csp_violations(b)
        assert violations == []

    with capsys.disabled():
        print(f"\n[browser] screenshots in {screenshots}")


# Rows an operator meets on a bad day: long names and errors, leases, a paused queue, a worker.
BAD_DAY = """
from datetime import timedelta
from django.utils import timezone
from django_jobs.models import (
    DeadLetter, DeadReason, Job, QueueState, Schedule, WorkerBeat, uuid7,
)
now = timezone.now()
error = ("smtplib.SMTPServerDisconnected: Connection unexpectedly closed while sending the "
         "message to mail-relay-03.eu-west-1.internal.example.com:587 after 30 s " + "x" * 400)
for i in range(12):
    DeadLetter.objects.create(
        id=uuid7(), name="shop.jobs.send_confirmation_email_to_the_customer_after_checkout",
        queue="transactional-emails", payload='{"order_id": %d}' % i, attempts=5, max_attempts=5,
        reason=DeadReason.ATTEMPTS_EXHAUSTED, error=error, traceback="Traceback ...\\n" + error,
        errors=[{"attempt": n, "type": "smtplib.SMTPServerDisconnected", "message": error[33:],
                 "traceback": "Traceback ...", "worker": "web-7f9c:4242:ab12",
                 "at": (now - timedelta(hours=i, minutes=5 - n)).isoformat()} for n in range(1, 6)],
        enqueued_at=now - timedelta(hours=i + 1), dead_at=now - timedelta(hours=i),
        key="order-confirmation-%d-ada.lovelace@example.com" % i,
    )
for i in range(6):
    Job.objects.create(
        name="shop.jobs.rebuild_the_search_index_for_every_product_category", queue="maintenance",
        payload="{}", run_at=now + timedelta(minutes=i * 7 - 20), enqueued_at=now,
        max_attempts=3, attempts=1 if i < 3 else 0,
        locked_by="worker-production-7f9c8d6b5-x2x9z:12345:0a1b2c3d4e5f#%d" % i if i < 3 else None,
        lease_expires_at=now + timedelta(seconds=30 - i * 20) if i < 3 else None,
    )
QueueState.objects.ensure(["default", "maintenance", "transactional-emails"])
QueueState.objects.filter(name="maintenance").pause(by="ada", reason="search cluster upgrade")
WorkerBeat.objects.create(
    id="worker-production-7f9c8d6b5-x2x9z:12345:0a1b2c3d4e5f",
    host="worker-production-7f9c8d6b5-x2x9z", pid=12345,
    queues=["default", "maintenance", "transactional-emails"], concurrency=8,
    started_at=now - timedelta(hours=3), last_seen_at=now, running=3, stats={"done": 1234},
)
Schedule.objects.create(
    name="nightly-search-reindex-for-every-product-category", cron="0 3 * * *",
    timezone="Europe/Amsterdam", job_name="shop.jobs.rebuild_the_search_index_for_every_product",
    last_tick_at=now - timedelta(hours=15), last_job_id=uuid7(), declared=False,
)
"""

FITS = """
const doc = document.documentElement;
const table = document.getElementById("result_list");
const box = table ? table.closest(".results") : null;
const sidebar = document.getElementById("nav-sidebar");
return {
  page: [doc.scrollWidth, doc.clientWidth],
  table: table ? [table.scrollWidth, box.clientWidth, table.getBoundingClientRect().right,
                  box.getBoundingClientRect().right] : null,
  sidebar: sidebar ? sidebar.getBoundingClientRect().width : 0,
  // The narrowest column but the checkboxes: "fits" must not mean "crushed".
  narrowest: Math.min(...Array.from(
    document.querySelectorAll("#result_list thead th:not(.action-checkbox-column)"),
    (th) => th.getBoundingClientRect().width)),
  tallest: Math.max(0, ...Array.from(
    document.querySelectorAll("#result_list tbody tr"), (tr) => tr.getBoundingClientRect().height)),
};
"""


# The titles of sorted columns whose words the sort arrows (floated right) overlap.
ARROWS_OVER_TITLES = """
const covered = [];
for (const th of document.querySelectorAll("#result_list thead th.sorted")) {
  const arrows = th.querySelector(".sortoptions .toggle").getBoundingClientRect();
  // The words' own boxes: the link around them is a block as wide as the cell.
  const texts = document.createTreeWalker(th.querySelector(".text"), NodeFilter.SHOW_TEXT);
  const range = document.createRange();
  const words = [];
  while (texts.nextNode()) {
    range.selectNodeContents(texts.currentNode);
    words.push(...range.getClientRects());
  }
  for (const word of words) {
    const across = word.left < arrows.right - 1 && word.right > arrows.left + 1;
    const level = word.top < arrows.bottom - 1 && word.bottom > arrows.top + 1;
    if (across && level) covered.push(th.innerText);
  }
}
return covered;
"""


def test_operator_pages_fit_1280_px_with_the_sidebar_open(
    browser, live_server_url, example_env, screenshots, capsys
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    b, base = browser, live_server_url
    wait = WebDriverWait(b, 15)
    manage(example_env, "shell", "-c", BAD_DAY)
    b.set_window_size(1280, 1000)
    b.get(f"{base}/admin/login/?next=/admin/")
    b.find_element(By.ID, "id_username").send_keys("admin")
    b.find_element(By.ID, "id_password").send_keys("admin")
    b.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait.until(ec.url_to_be(f"{base}/admin/"))
    assert b.execute_script("return window.innerWidth") == 1280
    # The admin index links the dashboard.
    b.find_element(By.CSS_SELECTOR, "#django-jobs-index-dashboard a")

    def check(path, shot):
        b.get(f"{base}{path}")
        fits = b.execute_script(FITS)
        b.save_screenshot(str(screenshots / f"{shot}.png"))
        assert fits["page"][0] <= fits["page"][1], (path, "scrolls sideways", fits)
        if fits["table"]:
            table_w, box_w, table_right, box_right = fits["table"]
            assert table_w <= box_w and table_right <= box_right + 1, (path, fits)
            # Not crushed either: no column narrower than an icon, no row a tower of letters.
            assert fits["narrowest"] >= 40, (path, "a column is crushed", fits)
            assert fits["tallest"] < 240, (path, "a row is too tall", fits)
            # A sorted column's arrows sit beside its title's words, not over them.
            assert not b.execute_script(ARROWS_OVER_TITLES), (path, "sort arrows cover a title")
        return fits

    lists = [
        "deadletter",
        "job",
        "completionmarker",
        "queuestate",
        "workerbeat",
        "schedule",
        "runningjob",
    ]
    for model in lists:
        fits = check(f"/admin/django_jobs/{model}/", f"list-{model}")
        assert fits["sidebar"] > 200, "the navigation sidebar is open"
        # The action bar is one line: the Run button beside its select, not under it.
        for select in b.find_elements(By.CSS_SELECTOR, "select[name=action]"):
            run = b.find_element(By.CSS_SELECTOR, "button[name=index]")
            assert abs(run.rect["y"] - select.rect["y"]) < 10, (model, "Run wrapped")
        # Every list links the dashboard.
        b.find_element(By.CSS_SELECTOR, ".object-tools a[href='/admin/django_jobs/job/dashboard/']")
    page = b.page_source
    check("/admin/django_jobs/job/", "list-job")
    assert "worker-production-7f9c8d6b5-x2x9z" in b.page_source and "left" in b.page_source
    assert "dashboard" in page.lower()

    # The letter's page: the summary is at the top, in the first screenful.
    check("/admin/django_jobs/deadletter/?q=smtplib", "list-deadletter-search")
    b.find_element(By.CSS_SELECTOR, "#result_list tbody tr th a").click()
    wait.until(ec.presence_of_element_located((By.ID, "django-jobs-summary")))
    fits = b.execute_script(FITS)
    assert fits["page"][0] <= fits["page"][1]
    summary = b.find_element(By.ID, "django-jobs-summary")
    first_fieldset = b.find_element(By.CSS_SELECTOR, "fieldset")
    assert summary.location["y"] < first_fieldset.location["y"]
    assert summary.location["y"] + summary.size["height"] < 1000 - 100  # seen without scrolling
    assert "attempts exhausted" in summary.text and "5 / 5" in summary.text
    assert "SMTPServerDisconnected" in summary.text
    # Its handler is not in this code: the page says so instead of offering the form.
    assert "No handler is registered" in summary.text
    assert not b.find_elements(By.ID, "django-jobs-replay-form")
    assert "(attempts_exhausted)" not in b.title
    b.save_screenshot(str(screenshots / "dead-letter-summary.png"))

    # Replaying many: a confirmation page first, counts per handler, then Yes.
    b.get(f"{base}/admin/django_jobs/deadletter/")
    b.find_element(By.ID, "action-toggle").click()
    Select(b.find_element(By.NAME, "action")).select_by_value("replay_selected")
    b.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    count = wait.until(ec.presence_of_element_located((By.ID, "django-jobs-replay-count")))
    fits = b.execute_script(FITS)
    assert fits["page"][0] <= fits["page"][1]
    b.save_screenshot(str(screenshots / "replay-confirmation.png"))
    assert "Replay 1 dead letter?" in count.text  # the other 12 have no handler here
    names = b.find_element(By.ID, "django-jobs-replay-names").text
    assert "shop.jobs.reserve_stock" in names
    assert "shop.jobs.send_confirmation_email_to_the_customer_after_checkout" in names
    assert "12 have no handler registered" in b.page_source
    b.find_element(By.ID, "django-jobs-replay-confirm").click()
    message = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".messagelist li")))
    assert message.text.startswith("1 replayed")

    fits = check("/admin/django_jobs/job/dashboard/", "dashboard-1280")
    svg = b.find_element(By.CSS_SELECTOR, "svg.django-jobs-chart")
    now_label = svg.find_element(By.XPATH, ".//*[local-name()='text'][.='now']")
    svg_box, label_box = svg.rect, now_label.rect
    assert label_box["x"] + label_box["width"] <= svg_box["x"] + svg_box["width"] + 0.5
    with capsys.disabled():
        print(f"\n[browser] screenshots in {screenshots}")


# A workflow as enqueue and settle leave it: a diamond with a wide middle (each state once),
# under a long name, written directly (docs/workflows.md, "How it is kept exact").
WORKFLOW = """
from datetime import timedelta
from django.utils import timezone
from django_jobs.models import (
    BLOCKED_UNTIL, CompletionMarker, DeadLetter, DeadReason, Dependency, Job, WorkflowStep, uuid7,
)
now = timezone.now()
name = "order-2026-12-01-ada.lovelace@example.com-" + "express-shipping-" * 6
charge = uuid7()
CompletionMarker.objects.create(
    job_id=charge, key="charge-" + name[:40], name="shop.jobs.charge_the_customers_card",
    queue="default", enqueued_at=now, completed_at=now,
)
middle = []
for i in range(12):
    job_id = uuid7()
    middle.append(job_id)
    if i == 0:
        DeadLetter.objects.create(
            id=job_id, name="shop.jobs.send_confirmation_email", queue="default", payload="{}",
            attempts=3, max_attempts=3, reason=DeadReason.FATAL, error="boom",
            enqueued_at=now, dead_at=now,
        )
    else:
        Job.objects.create(
            id=job_id, name="shop.jobs.reserve_stock_in_warehouse_%d" % i, queue="default",
            payload="{}", run_at=now + timedelta(minutes=i % 3), enqueued_at=now, max_attempts=3,
            locked_by="w:1:a#%d" % i if i % 4 == 1 else None,
            lease_expires_at=now + timedelta(minutes=5) if i % 4 == 1 else None,
        )
ship = uuid7()
Job.objects.create(
    id=ship, name="shop.jobs.ship_the_parcel", queue="default", payload="{}",
    run_at=BLOCKED_UNTIL, enqueued_at=now, max_attempts=3, waiting_for=len(middle),
)
steps = [(charge, "shop.jobs.charge_the_customers_card")]
steps += [(m, "shop.jobs.reserve_stock") for m in middle] + [(ship, "shop.jobs.ship_the_parcel")]
WorkflowStep.objects.bulk_create([
    WorkflowStep(job_id=j, workflow=name, name=n, created_at=now + timedelta(milliseconds=k))
    for k, (j, n) in enumerate(steps)
])
edges = [(m, charge, True) for m in middle] + [(ship, m, False) for m in middle]
Dependency.objects.bulk_create([
    Dependency(job_id=j, parent_key=str(p), parent_id=p, created_at=now,
               satisfied_at=now if done else None)
    for j, p, done in edges
])
print(name)
"""


def test_the_workflow_page_draws_its_graph_and_fits_1280_px(
    browser, live_server_url, example_env, screenshots, capsys
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    b, base = browser, live_server_url
    wait = WebDriverWait(b, 15)
    name = (
        manage(example_env, "shell", "-c", WORKFLOW).strip().splitlines()[-1]
    )  # after Django's note
    b.set_window_size(1280, 1000)
    b.get(f"{base}/admin/login/?next=/admin/")
    b.find_element(By.ID, "id_username").send_keys("admin")
    b.find_element(By.ID, "id_password").send_keys("admin")
    b.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait.until(ec.url_to_be(f"{base}/admin/"))

    # The list of workflows: the long name wraps, the page does not scroll sideways.
    b.get(f"{base}/admin/django_jobs/workflowstep/")
    page = b.execute_script(FITS)["page"]
    assert page[0] <= page[1], ("the workflow list scrolls sideways", page)
    row = b.find_element(By.CSS_SELECTOR, "tr.django-jobs-workflow")
    assert row.find_elements(By.TAG_NAME, "td")[0].text == "14"
    b.save_screenshot(str(screenshots / "workflows.png"))
    row.find_element(By.CSS_SELECTOR, "th a").click()
    svg = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "svg.django-jobs-graph")))
    assert b.find_element(By.ID, "django-jobs-workflow-name").text == name

    # The graph renders: a box per step, drawn with a size, each one a link.
    assert svg.size["width"] > 300 and svg.size["height"] > 300
    nodes = svg.find_elements(By.CSS_SELECTOR, "a.django-jobs-node")
    assert len(nodes) == 14
    states = sorted(n.get_attribute("data-state") for n in nodes)
    assert {"done", "dead", "running", "blocked", "waiting", "scheduled"} <= set(states)
    assert all(n.find_element(By.TAG_NAME, "rect").size["width"] > 100 for n in nodes)
    # Labels read as labels: the admin underlines every other link of the content.
    underline = "return getComputedStyle(arguments[0]).textDecorationLine"
    assert b.execute_script(underline, nodes[0]) == "none"
    assert len(svg.find_elements(By.CSS_SELECTOR, "path.django-jobs-edge")) == 24
    fits = b.execute_script(FITS)
    assert fits["page"][0] <= fits["page"][1], ("the workflow page scrolls sideways", fits)
    assert fits["sidebar"] > 200, "the navigation sidebar is open"
    box = b.find_element(By.CSS_SELECTOR, ".django-jobs-graph-box")
    assert box.rect["x"] + box.rect["width"] <= 1280
    b.save_screenshot(str(screenshots / "workflow.png"))
    if django.VERSION >= (6, 0):  # the example project sends a strict CSP there
        assert csp_violations(b) == []

    # A node leads to its row: the blocked step's job page, which lists what it waits for.
    blocked = next(n for n in nodes if n.get_attribute("data-state") == "blocked")
    b.execute_script("arguments[0].scrollIntoView({block: 'center', inline: 'center'})", blocked)
    blocked.find_element(By.TAG_NAME, "rect").click()
    wait.until(ec.url_contains("/admin/django_jobs/job/"))
    parents = b.find_element(By.CSS_SELECTOR, "ul.django-jobs-parents")
    assert len(parents.find_elements(By.TAG_NAME, "li")) == 12
    assert b.find_element(By.ID, "django-jobs-workflow-link").text.startswith("order-2026-12-01")
    fits = b.execute_script(FITS)
    assert fits["page"][0] <= fits["page"][1], ("the blocked job's page scrolls sideways", fits)
    b.save_screenshot(str(screenshots / "workflow-blocked-job.png"))
    with capsys.disabled():
        print(f"\n[browser] screenshots in {screenshots}")

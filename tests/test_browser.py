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
from pathlib import Path

import django
import pytest
from django.utils import timezone

from tests.conftest import POSTGRES, ROOT

pytestmark = [pytest.mark.browser, pytest.mark.slow]

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
        "host": os.environ.get("PGHOST", "127.0.0.1"), "port": os.environ.get("PGPORT", "5432"),
        "user": os.environ.get("PGUSER", "postgres"),
        "password": os.environ.get("PGPASSWORD") or None,
    }  # fmt: skip
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    env.update(EXAMPLE_DB="postgres", PGDATABASE=name)
    yield env
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def manage(env, *args, timeout=180):
    out = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=EXAMPLE, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
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
        cwd=EXAMPLE, env=example_env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
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
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000", f"--user-data-dir={tmp_path / 'chromium'}"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(5)
    yield driver
    driver.quit()


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
        for name, value in (
            ("gte_0", start.strftime("%Y-%m-%d")), ("gte_1", "00:00:00"),
            ("lte_0", end.strftime("%Y-%m-%d")), ("lte_1", "23:59:59"),
        ):  # fmt: skip
            field = form.find_element(By.NAME, f"dead_at__range__{name}")
            field.clear()
            field.send_keys(value)
        form.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        wait.until(ec.url_contains("dead_at__range__gte_0="))
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
    assert "is no longer made" in b.page_source
    order_id = json.loads(b.find_element(By.CSS_SELECTOR, "pre.django-jobs-json").text)["order_id"]
    letter_url = b.current_url
    b.save_screenshot(str(screenshots / "dead-letter.png"))

    # Put the cause right (the order's item), then replay.
    b.get(f"{base}/admin/shop/order/{order_id}/change/")
    item = b.find_element(By.ID, "id_item")
    item.clear()
    item.send_keys("widget-2")
    b.find_element(By.NAME, "_save").click()
    wait.until(ec.url_contains("/admin/shop/order/"))
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

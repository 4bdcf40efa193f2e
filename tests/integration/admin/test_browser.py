"""A real browser (Debian's headless Chromium) logs into the admin on a live server, finds the
Recovery page from the admin index's "Needs attention" panel, sees its charts, requeues a job
that ended expired with the admin action, and checks the result.

It saves screenshots of each step: under var/screenshots/ by default, so that a test run leaves
the working tree clean, and into docs/screenshots/ (the ones README.md shows, committed) with
`make screenshots`, which sets JOBQUEUE_SCREENSHOTS_DIR."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds
from jobqueue.maintenance import reaper
from jobqueue.models import Job, JobEvent
from tests.factories import JobAgentFactory, JobFactory, claimed_job
from tests.utils import ROOT

from .conftest import SECRET, expire_lease

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS = Path(os.environ.get("JOBQUEUE_SCREENSHOTS_DIR") or ROOT / "var" / "screenshots")


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert Path(CHROMEDRIVER).exists(), (
        "Debian's chromium-driver is missing: run scripts/ensure_chromium.sh as root "
        "(make test does) or apt-get install chromium chromium-driver"
    )
    profile = tempfile.mkdtemp(prefix="jobqueue-chromium-")
    options = webdriver.ChromeOptions()
    for flag in [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
    ]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def scene(django_user_model):
    """A small fleet with something for the operator to repair."""
    django_user_model.objects.create_superuser("olga", "olga@example.com", "pw-olga-browser")
    builder = JobAgentFactory(name="builder", lease_seconds=30, max_attempts=1)
    deployer = JobAgentFactory(name="deployer", workspace=builder.workspace, lease_seconds=60)
    dead, _ = claimed_job(job_agent=builder, dispatch_context={"password": SECRET},
                          external_id="build-1042")
    expire_lease(dead, seconds_ago=95)
    reaper.sweep()  # ends it as expired: its only attempt ran out
    for i in range(3):
        JobFactory(job_agent=deployer, dispatch_context={"password": SECRET},
                   external_id=f"deploy-{i}")
    claimed_job(job_agent=deployer, dispatch_context={"password": SECRET})
    stuck, _ = claimed_job(job_agent=deployer, dispatch_context={"password": SECRET})
    expire_lease(stuck, seconds_ago=40)
    # Something for the charts: jobs created over the last hours, finished in the last minutes.
    for i, status in enumerate([states.SUCCESSFUL] * 9 + [states.FAILURE] * 3):
        job, _ = lifecycle.create_job(workspace=deployer.workspace, job_agent=deployer)
        grant = lifecycle.claim_job(deployer, job.id)
        lifecycle.report_status(job.id, grant.claim_id, status)
        JobEvent.objects.filter(job_id=job.id).update(created_at=NowPlusSeconds(-60 * (i % 6)))
        JobEvent.objects.filter(job_id=job.id, kind=JobEvent.CREATED).update(
            created_at=NowPlusSeconds(-3600 * (2 + i))
        )
    return {"dead": dead, "stuck": stuck}


def wait_for(driver, css):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, 30).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def shot(driver, name):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    # Full page height, so the whole Recovery page is in the picture.
    height = driver.execute_script("return document.documentElement.scrollHeight")
    chrome = driver.execute_script("return window.outerHeight - window.innerHeight")
    driver.set_window_size(1400, max(800, min(height + chrome + 20, 2400)))
    assert driver.save_screenshot(str(SCREENSHOTS / name))


def test_operator_requeues_an_expired_job_from_the_recovery_page(live_server, browser, scene):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    dead = scene["dead"]
    browser.get(live_server.url + "/admin/login/?next=/admin/")
    wait_for(browser, "#id_username").send_keys("olga")
    browser.find_element(By.ID, "id_password").send_keys("pw-olga-browser")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()

    # The admin index leads with what needs attention, and links the Recovery page.
    panel = wait_for(browser, "#needs-attention")
    expired_row = browser.find_element(By.ID, "attention-expired-leases").text
    assert expired_row.endswith("1"), expired_row
    assert browser.find_element(By.ID, "attention-recently-expired").text.endswith("1")
    shot(browser, "admin-index.png")
    panel.find_element(By.CSS_SELECTOR, "h2 a").click()

    # The Recovery page: the stuck lease and the job that ended expired are both there.
    wait_for(browser, "#recently-expired")
    # The charts are drawn on the server: inline SVG, one bar per minute with jobs.
    bars = browser.find_elements(By.CSS_SELECTOR, "#finished-chart svg rect")
    assert sum(int(b.get_attribute("data-count")) for b in bars) == 13  # + the expired one
    assert browser.find_element(By.CSS_SELECTOR, "#finished-chart svg").size["height"] == 200
    assert len(browser.find_elements(By.CSS_SELECTOR, "#depth-chart svg circle")) == 24
    assert browser.find_element(By.TAG_NAME, "h1").text == "Recovery"
    expired_section = browser.find_element(By.ID, "recently-expired").text
    assert str(dead.id) in expired_section
    assert str(scene["stuck"].id) in browser.find_element(By.ID, "expired-leases").text
    assert SECRET not in browser.page_source
    shot(browser, "recovery.png")

    # To the job list, filtered on expired jobs; select the job and run the action.
    browser.find_element(By.ID, "expired-jobs-link").click()
    checkbox = wait_for(browser, f'input[name="_selected_action"][value="{dead.id}"]')
    checkbox.click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("requeue_jobs")
    shot(browser, "job-list-action.png")
    browser.find_element(By.CSS_SELECTOR, 'button[name="index"]').click()

    message = wait_for(browser, "ul.messagelist li.success")
    assert message.text == "Requeued 1 job(s)."
    dead.refresh_from_db()
    assert dead.status == states.QUEUED
    assert dead.max_attempts == 2  # one attempt used + the one it was created with
    event = JobEvent.objects.filter(job=dead).order_by("-id").first()
    assert event.kind == JobEvent.REQUEUED and event.actor == "operator:olga"

    # Its page shows the timeline, with the operator's requeue last; the secret never.
    browser.get(live_server.url + f"/admin/jobqueue/job/{dead.id}/change/")
    timeline = wait_for(browser, "table.jq-timeline").text
    assert "expired" in timeline and "operator:olga" in timeline
    assert SECRET not in browser.page_source
    shot(browser, "job-detail.png")

    # Back on the Recovery page, nothing has ended expired any more.
    browser.get(live_server.url + "/admin/jobqueue/job/recovery/")
    assert "(0)" in wait_for(browser, "#recently-expired").text
    assert Job.objects.filter(status=states.EXPIRED).count() == 0


def login(browser, live_server, username, password):
    from selenium.webdriver.common.by import By

    browser.get(live_server.url + "/admin/login/?next=/admin/")
    wait_for(browser, "#id_username").send_keys(username)
    browser.find_element(By.ID, "id_password").send_keys(password)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    # The page after the login, not the login page itself (which has #content too: waiting
    # for that let the next browser.get() race the login's POST and land on the login page).
    wait_for(browser, "#user-tools")


def test_a_running_jobs_page_follows_it_without_a_reload(live_server, browser,
                                                         django_user_model):
    """The live job page: a log line the agent writes after the page loaded appears (its
    secret redacted), then the successful report; the page then stops asking."""
    from jobqueue_client import AgentClient
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from agents import credentials

    django_user_model.objects.create_superuser("lea", "lea@example.com", "pw-lea-browser")
    agent = JobAgentFactory(name="builder", lease_seconds=60)
    _, token = credentials.create_agent_token(agent)
    job = JobFactory(job_agent=agent, dispatch_context={"password": SECRET})
    grant = lifecycle.claim_job(agent, job.id)
    client = AgentClient(live_server.url, str(agent.workspace_id), str(agent.id), token,
                         holder="ci-runner-7:4242")
    start = client.append_log(str(job.id), str(grant.claim_id), b"step 1: fetched\n", 0)

    login(browser, live_server, "lea", "pw-lea-browser")
    browser.get(live_server.url + f"/admin/jobqueue/job/{job.id}/change/")
    assert wait_for(browser, "#jq-live-state").get_attribute("data-state") == "live"
    logs_cell = browser.find_element(By.CSS_SELECTOR, ".field-logs_display .readonly")
    assert "step 1: fetched" in logs_cell.text and "step 2" not in logs_cell.text
    browser.execute_script("window.jqSamePage = true;")  # gone if the page reloads

    # The agent writes a line (with the secret the job's context holds) after the page loaded.
    client.append_log(str(job.id), str(grant.claim_id),
                      f"step 2: logging in with {SECRET}\n".encode(), start)
    cell = ".field-logs_display .readonly"
    WebDriverWait(browser, 30).until(
        lambda d: "step 2" in d.find_element(By.CSS_SELECTOR, cell).text)
    text = browser.find_element(By.CSS_SELECTOR, cell).text
    assert "step 2: logging in with [redacted]" in text
    assert SECRET not in browser.page_source
    assert browser.execute_script("return window.jqSamePage") is True
    shot(browser, "job-live.png")

    # The agent reports: the status changes on the page, and the page stops polling.
    client.report(str(job.id), str(grant.claim_id), states.SUCCESSFUL)
    WebDriverWait(browser, 30).until(
        lambda d: d.find_element(By.ID, "jq-live-state").get_attribute("data-state") == "final")
    assert browser.find_element(By.CSS_SELECTOR, ".field-status .readonly").text == "Successful"
    assert "1 / " in browser.find_element(By.CSS_SELECTOR, ".field-attempts .readonly").text
    assert "The job ended (successful)" in browser.find_element(By.ID, "jq-live-state").text
    assert browser.execute_script("return window.jqSamePage") is True
    assert SECRET not in browser.page_source

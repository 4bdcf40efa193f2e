"""The admin as deployed: DJANGO_DEBUG=0, `collectstatic` with whitenoise's manifest storage,
gunicorn with several worker processes, Django's own sessions and CSRF, and /metrics adding
up every worker's counters (prometheus-client multiprocess mode)."""

import re
import signal
import subprocess
import sys
import threading

import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from tests.utils import ROOT, subprocess_env, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

WORKERS = 2


def deployment_env(**extra) -> dict:
    return subprocess_env(
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY="deployment-test-key-0123456789abcdefghijklmnopqrstuvwxyz",
        **extra,
    )


@pytest.fixture(scope="module")
def static_root(tmp_path_factory):
    """`collectstatic` as a deployment runs it: manifest storage, compressed by whitenoise."""
    root = tmp_path_factory.mktemp("static")
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"],
        cwd=ROOT, env=deployment_env(DJANGO_STATIC_ROOT=root), check=True, timeout=300,
    )
    return root


@pytest.fixture
def deployed(tmp_path, static_root, django_user_model):
    django_user_model.objects.create_superuser("deploy-op", "op@example.com", "pw-deploy-1")
    prom_dir = tmp_path / "prometheus"
    prom_dir.mkdir()
    env = deployment_env(DJANGO_STATIC_ROOT=static_root, PROMETHEUS_MULTIPROC_DIR=prom_dir)
    log_path = tmp_path / "gunicorn.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "config" / "gunicorn.conf.py"),
         "--bind", "127.0.0.1:0",
         "--workers", str(WORKERS), "--graceful-timeout", "5"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    def running(what):
        assert proc.poll() is None, f"gunicorn exited before {what}:\n" + log_path.read_text()
        return True

    def healthy():
        try:
            return httpx.get(base + "/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        found = wait_for(lambda: running("listening") and re.search(
            r"Listening at: (http://127\.0\.0\.1:\d+)", log_path.read_text()), 60,
            "gunicorn's 'Listening at' line", interval=0.05)
        base = found.group(1)
        wait_for(lambda: running("answering") and healthy(), 60, "gunicorn to answer /healthz",
                 interval=0.05)
        yield {"base": base, "static_root": static_root, "prom_dir": prom_dir,
               "healthz_served": 1}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_admin_works_as_deployed(deployed):
    base = deployed["base"]
    manifest = deployed["static_root"] / "staticfiles.json"
    assert manifest.exists()
    with httpx.Client(base_url=base, timeout=10) as browser:
        login = browser.get("/admin/login/?next=/admin/jobqueue/job/recovery/")
        assert login.status_code == 200
        # Hashed static file names from the manifest, served by whitenoise, compressed.
        css = re.search(r'href="(/static/admin/css/base\.[0-9a-f]{12}\.css)"', login.text)
        assert css, login.text[:2000]
        static = browser.get(css.group(1), headers={"Accept-Encoding": "gzip"})
        assert static.status_code == 200 and static.headers["content-type"].startswith("text/css")
        assert static.headers.get("content-encoding") == "gzip"
        assert "max-age" in static.headers.get("cache-control", "")
        # Django's CSRF and sessions as shipped: a POST without the token is refused.
        assert browser.post("/admin/login/", data={"username": "x"}).status_code == 403
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text).group(1)
        done = browser.post(
            "/admin/login/?next=/admin/jobqueue/job/recovery/",
            data={"csrfmiddlewaretoken": token, "username": "deploy-op",
                  "password": "pw-deploy-1", "next": "/admin/jobqueue/job/recovery/"},
            headers={"Referer": base + "/admin/login/"},
        )
        assert done.status_code == 302 and done.headers["location"].endswith("/recovery/")
        recovery = browser.get("/admin/jobqueue/job/recovery/")
        assert recovery.status_code == 200 and "Jobs by status" in recovery.text
        # DEBUG is off: an unknown admin URL is a plain 404, no debug page.
        missing = browser.get("/admin/jobqueue/job/no-such-thing/change/")
        assert "Traceback" not in missing.text and "DEBUG = True" not in missing.text


def healthz_count(text: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name == "jobqueue_http_request_duration_seconds_count"
                    and sample.labels.get("route") == "healthz"
                    and sample.labels.get("status") == "200"):
                return sample.value
    return 0.0


def healthz_by_worker(prom_dir) -> dict[str, float]:
    """The /healthz answers each worker process counted, read from its own file."""
    counts = {}
    for path in prom_dir.glob("histogram_*.db"):
        merged = MultiProcessCollector.merge([str(path)], accumulate=True)
        n = sum(sample.value for family in merged for sample in family.samples
                if sample.name == "jobqueue_http_request_duration_seconds_count"
                and sample.labels.get("route") == "healthz"
                and sample.labels.get("status") == "200")
        if n:
            counts[path.stem] = n
    return counts


def test_metrics_add_up_across_worker_processes(deployed):
    base = deployed["base"]
    served = [deployed["healthz_served"]]
    lock = threading.Lock()

    def hit(n):
        for _ in range(n):
            # A new connection each time, so that any worker may take it.
            if httpx.get(base + "/healthz", timeout=10).status_code == 200:
                with lock:
                    served[0] += 1

    def burst():
        threads = [threading.Thread(target=hit, args=(10,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def every_worker_served():
        if len(healthz_by_worker(deployed["prom_dir"])) >= WORKERS:
            return True
        burst()
        return False

    # What is checked needs requests answered by every worker: more bursts until they were.
    burst()
    wait_for(every_worker_served, 120, f"each of {WORKERS} workers to answer /healthz")
    counted = healthz_by_worker(deployed["prom_dir"])
    assert sum(counted.values()) == served[0], (counted, served)
    # Whichever worker answers a scrape, it reports every worker's requests (the other
    # worker's count is more than 0, so one worker's own count would fall short).
    scrapes = [httpx.get(base + "/metrics", timeout=10) for _ in range(4)]
    assert all(s.status_code == 200 for s in scrapes)
    assert [healthz_count(s.text) for s in scrapes] == [float(served[0])] * 4, counted
    assert "jobqueue_database_up 1.0" in scrapes[0].text
    # Each worker writes its own files into the multiprocess directory.
    assert list(deployed["prom_dir"].glob("histogram_*.db"))

"""Throttles shared through Redis (CACHE_URL=redis://..., Django's built-in Redis cache):
two API replicas (real gunicorn processes) keep one fleet-wide limit per credential; a Redis
that is down degrades to no throttling, logged and counted, never to a 5xx or a refused
agent. Redis runs on this machine (127.0.0.1:6379); each test uses its own keys."""

import logging
import uuid

import httpx
import pytest
from django.core.cache import caches

from agents import throttling
from tests.e2e.harness import Stack, free_port
from tests.integration.ops.test_metrics import scrape, value

REDIS = "redis://127.0.0.1:6379/0"
RATES = {"agent": "40/h", "workspace": "20/h"}


def _redis_cache(url):
    return {"default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url,
        "KEY_PREFIX": f"jq-test-{uuid.uuid4().hex[:8]}",
        "OPTIONS": {"socket_connect_timeout": 0.25, "socket_timeout": 0.25},
    }}


@pytest.fixture(autouse=True)
def _fresh_throttle_state():
    throttling.reset_cache_state()
    yield
    throttling.reset_cache_state()


def _rates(settings, rates):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}


@pytest.mark.django_db
def test_one_limit_per_credential_in_redis(world, settings):
    settings.CACHES = _redis_cache(REDIS)
    _rates(settings, {"agent": "3/h", "workspace": "2/h"})
    agent = world.agent_caller()
    path = f"job-agents/{world.agent.id}/jobs"
    assert [agent.get(path).status_code for _ in range(4)] == [200, 200, 200, 429]
    # The counter is in Redis: another cache client (another process) sees it.
    keys = [k for k in caches["default"]._cache.get_client().keys("*") if b"throttle:agent" in k
            and settings.CACHES["default"]["KEY_PREFIX"].encode() in k]
    assert len(keys) == 1


@pytest.mark.django_db
def test_a_redis_outage_degrades_to_no_throttling_logged_and_counted(world, settings, caplog,
                                                                     client):
    settings.CACHES = _redis_cache(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens
    _rates(settings, {"agent": "2/h", "workspace": "2/h"})
    agent = world.agent_caller()
    path = f"job-agents/{world.agent.id}/jobs"
    before = value(scrape(client), "jobqueue_throttle_cache_failures_total")
    with caplog.at_level(logging.WARNING, logger="agents.throttling"):
        codes = [agent.get(path).status_code for _ in range(6)]
    assert codes == [200] * 6  # over the limit, and neither throttled nor failed
    assert caplog.text.count("throttle cache unavailable (ConnectionError)") == 1
    # One failed call, then the cache rests: the outage costs the other requests nothing.
    assert value(scrape(client), "jobqueue_throttle_cache_failures_total") == before + 1

    # Still down after the rest period: one more failed call, counted, not logged again.
    throttling._down_until = 1.0  # the rest period is over
    with caplog.at_level(logging.WARNING, logger="agents.throttling"):
        assert agent.get(path).status_code == 200
    assert caplog.text.count("throttle cache unavailable") == 1
    assert value(scrape(client), "jobqueue_throttle_cache_failures_total") == before + 2

    # Redis answers again: after the rest period, throttling resumes.
    settings.CACHES = _redis_cache(REDIS)
    throttling._down_until = 1.0  # the rest period is over
    with caplog.at_level(logging.WARNING, logger="agents.throttling"):
        codes = [agent.get(path).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    assert "throttle cache answers again" in caplog.text


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_two_replicas_share_one_fleet_wide_limit(tmp_path, settings):
    from tests.integration.api.conftest import make_world

    world = make_world()
    env = {"CACHE_URL": REDIS + "?key_prefix=jq-replicas-" + uuid.uuid4().hex[:8],
           "JOBQUEUE_THROTTLE_AGENT_RATE": RATES["agent"],
           "JOBQUEUE_THROTTLE_WORKSPACE_RATE": RATES["workspace"]}
    with Stack(tmp_path, server_env=env) as stack:
        other_port = free_port()
        stack.start_replica(other_port)
        urls = [stack.url, f"http://127.0.0.1:{other_port}"]
        path = f"/v1/workspaces/{world.workspace.id}/job-agents/{world.agent.id}/jobs"
        headers = {"Authorization": f"Bearer {world.token}"}
        codes = {url: [] for url in urls}
        with httpx.Client(timeout=10) as http:
            for i in range(60):
                url = urls[i % 2]
                codes[url].append(http.get(url + path, headers=headers).status_code)
    answered = [c for per in codes.values() for c in per]
    assert set(answered) == {200, 429}
    # 40 an hour for the agent across both replicas (2 workers each), not 40 per process.
    assert answered.count(200) == 40
    assert all(per.count(200) >= 10 for per in codes.values())

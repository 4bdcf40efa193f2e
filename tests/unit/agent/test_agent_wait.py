"""The agent's long-poll: it asks the server to hold its claims (wait_seconds), asks again at
once after a wait that ran its course, backs off against a server that answers early (no
long-poll, or at its cap), asks for less when the server's maximum is lower, and a stop
aborts a held claim at once. The in-memory API of test_agent_paths stands in for the server."""

import itertools
import threading
import time

import httpx
import pytest
from jobqueue_client import client as api

from tests.utils import wait_for

from . import test_agent_paths as paths
from .test_agent_paths import CLAIM_NEXT, Api, logged

start = paths.start  # the fixture, under its name


@pytest.fixture
def begin(start):
    return start


def claims(server):
    return server.requests(CLAIM_NEXT, "POST")


def held_for(seconds):
    """A hold that makes claim-next with wait_seconds take `seconds` (a server's wait)."""
    def hold(method, path, body):
        if CLAIM_NEXT.search(path) and (body or {}).get("wait_seconds"):
            time.sleep(seconds)
    return hold


def test_the_agent_asks_the_server_to_hold_its_claims(begin):
    server = Api()
    run = begin(server, wait_seconds=2)
    wait_for(lambda: claims(server), 10, "a claim")
    assert claims(server)[0][2] == {"wait_seconds": 2}
    server.add(["true"])
    wait_for(lambda: not server.jobs, 10, "the job to be claimed")
    assert run.stop() == 0


def test_a_batch_agent_holds_its_batch_claims_too(begin):
    server = Api()
    run = begin(server, wait_seconds=3, concurrency=4)
    wait_for(lambda: claims(server), 10, "a claim")
    assert claims(server)[0][2] == {"limit": 4, "wait_seconds": 3}
    assert run.stop() == 0


def test_after_a_full_wait_it_asks_again_at_once(begin):
    server = Api()
    server.holds.append(held_for(1.0))  # a wait of 1 s that ends empty (wait_seconds=1)
    run = begin(server, wait_seconds=1, idle_min=5, idle_max=5)
    wait_for(lambda: len(claims(server)) >= 3, 10, "three claims")  # no 5 s backoff between
    assert run.stop() == 0


def test_against_a_server_without_long_poll_it_backs_off(begin):
    server = Api()  # answers 204 at once whatever wait_seconds says
    asked = []
    server.holds.append(lambda method, path, body: CLAIM_NEXT.search(path)
                        and asked.append(time.monotonic()))
    run = begin(server, wait_seconds=50, idle_min=0.2, idle_max=0.4)
    wait_for(lambda: len(asked) >= 4, 10, "four claims")
    assert run.stop() == 0
    assert all((b or {}).get("wait_seconds") == 50 for _, _, b in claims(server))
    # Each early empty answer is followed by a backoff, not a tight loop: the first delay is
    # at least idle_min / 2 (equal jitter), the next ones at least idle_max / 2.
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    assert gaps[0] >= 0.1 and min(gaps[1:3]) >= 0.2, gaps


def test_a_lower_server_maximum_makes_it_ask_for_less(begin, caplog):
    server = Api()

    def refuse_long(method, path, body):
        if CLAIM_NEXT.search(path) and (body or {}).get("wait_seconds", 0) > 10:
            return (400, {"code": "validation_error", "detail": "too long",
                          "fields": {"wait_seconds": ["too long"]}})
        return None

    server.rules.append(refuse_long)
    run = begin(server, wait_seconds=40)
    logged(caplog, "event=claim_wait_refused")
    wait_for(lambda: any((b or {}).get("wait_seconds") == 10 for _, _, b in claims(server)),
             10, "a claim with wait_seconds 10")
    assert run.stop() == 0  # not an agent that gave up
    assert run.agent.wait_seconds == 10


def test_a_stop_aborts_a_held_claim_at_once(begin):
    server = Api()
    holding = threading.Event()
    server.holds.append(lambda method, path, body: CLAIM_NEXT.search(path) and holding.set())
    server.holds.append(held_for(20))
    run = begin(server, wait_seconds=20)
    assert holding.wait(10), "a held claim"
    stopped = time.monotonic()
    run.agent.request_stop()
    run.thread.join(5)
    assert not run.thread.is_alive() and time.monotonic() - stopped < 3
    assert run.agent.exit_code == 0


def test_an_aborted_client_waits_no_more_and_says_so():
    client = api.AgentClient("http://jq.test", "ws", "ag", "jqa_0123456789ab_s",
                             transport=httpx.MockTransport(lambda r: httpx.Response(204)))
    assert client.claim_next(wait_seconds=5) is None
    client.abort_wait()
    try:
        client.claim_next(wait_seconds=5)
    except api.TransportError as exc:
        assert exc.transient and "aborted" in exc.detail
    else:
        raise AssertionError("a wait after abort_wait")
    assert client.claim_next() is None  # the plain claim still works
    client.close()

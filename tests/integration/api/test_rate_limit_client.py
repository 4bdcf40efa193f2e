"""The producer's client library and command line on rate limits, against a live server:
ProducerClient's rate limit methods (keys of any printable characters, percent-encoded), its
create_job(rate_limit_key=), and `jobqueue rate-limits set|get|delete|list` and `jobqueue
jobs create --rate-limit-key` (text and --json)."""

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest
from jobqueue_client import ProducerClient, producer_cli
from jobqueue_client.errors import InvalidRequest, NotFound

from jobqueue.models import Job, RateLimit

pytestmark = pytest.mark.usefixtures("wakeups_stopped_after")

KEYS = ["partner", "a/b", "deploy prod", "50% off", ".", "..", "a/../b", "v1.2", "?x#y",
        "ключ"]


@pytest.fixture
def producer(live_world):
    with ProducerClient(live_world.base_url, str(live_world.workspace.id),
                        live_world.key) as client:
        yield client


def test_the_client_sets_reads_lists_and_deletes(live_world, producer):
    for n, key in enumerate(KEYS, start=1):
        made = producer.set_rate_limit(key, n, 60 * n)
        assert (made["key"], made["count"], made["period_seconds"]) == (key, n, 60 * n)
        assert producer.get_rate_limit(key) == made
    assert sorted(RateLimit.objects.values_list("key", flat=True)) == sorted(KEYS)
    listed = list(producer.list_rate_limits(page_size=3))
    assert sorted(item["key"] for item in listed) == sorted(KEYS)
    assert [item["key"] for item in listed] == [
        item["key"] for item in producer.list_rate_limits()]  # one order, page after page
    assert len(list(producer.list_rate_limits(limit=4))) == 4
    # A PUT again replaces the limit.
    assert producer.set_rate_limit("a/b", 7, 7)["count"] == 7
    assert producer.get_rate_limit("a/b")["period_seconds"] == 7
    with pytest.raises(InvalidRequest) as refused:
        producer.set_rate_limit("a/b", 0, 86_401)
    assert set(refused.value.fields) == {"count", "period_seconds"}
    with pytest.raises(InvalidRequest) as refused:
        producer.set_rate_limit("new\nline", 1, 1)
    assert set(refused.value.fields) == {"key"}
    for key in KEYS:
        producer.delete_rate_limit(key)
        with pytest.raises(NotFound):
            producer.get_rate_limit(key)
        with pytest.raises(NotFound):
            producer.delete_rate_limit(key)
    assert not RateLimit.objects.exists()
    assert list(producer.list_rate_limits()) == []


def test_create_job_sends_the_key(live_world, producer):
    job = producer.create_job(str(live_world.agent.id), rate_limit_key="a/b c%")
    assert job["rate_limit_key"] == "a/b c%"
    assert producer.get(job["id"])["rate_limit_key"] == "a/b c%"
    assert Job.objects.get(id=job["id"]).rate_limit_key == "a/b c%"
    flow = producer.create_flow([{"ref": "x", "job_agent_id": str(live_world.agent.id),
                                  "rate_limit_key": "flowed"}])
    assert flow["x"]["rate_limit_key"] == "flowed"


def _cli(live_world, *argv):
    out, err = io.StringIO(), io.StringIO()
    env = {"JOBQUEUE_URL": live_world.base_url,
           "JOBQUEUE_WORKSPACE": str(live_world.workspace.id),
           "JOBQUEUE_API_KEY": live_world.key}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        mp.delenv("JOBQUEUE_AGENT", raising=False)
        with redirect_stdout(out), redirect_stderr(err):
            code = producer_cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def test_the_command_line(live_world):
    code, out, err = _cli(live_world, "rate-limits", "set", "deploy prod/eu", "--count", 5,
                          "--period-seconds", 60)
    assert code == 0, err
    assert "deploy prod/eu" in out and "5 claims per 60 s" in out
    limit = RateLimit.objects.get()
    assert (limit.key, limit.count, limit.period_seconds) == ("deploy prod/eu", 5, 60)
    code, out, err = _cli(live_world, "rate-limits", "get", "deploy prod/eu", "--json")
    assert code == 0, err
    assert json.loads(out)["count"] == 5
    code, out, err = _cli(live_world, "rate-limits", "set", "50% off", "--count", 1,
                          "--period-seconds", 1)
    assert code == 0, err
    code, out, err = _cli(live_world, "rate-limits", "list")
    assert code == 0, err
    assert out.splitlines()[0].split() == ["KEY", "COUNT", "PERIOD_SECONDS", "UPDATED_AT"]
    assert {line.split("  ")[0] for line in out.splitlines()[1:]} == {"50% off",
                                                                      "deploy prod/eu"}
    code, out, err = _cli(live_world, "rate-limits", "list", "--json")
    assert sorted(item["key"] for item in json.loads(out)) == ["50% off", "deploy prod/eu"]
    code, out, err = _cli(live_world, "rate-limits", "set", "k", "--count", 100_001,
                          "--period-seconds", 60)
    assert code == 2 and "--count: Must be an integer from 1 to 100000." in err
    code, out, err = _cli(live_world, "rate-limits", "delete", "50% off")
    assert code == 0 and "deleted" in out, err
    code, out, err = _cli(live_world, "rate-limits", "get", "50% off")
    assert code == 3 and "the rate limit of '50% off' not found" in err
    code, out, err = _cli(live_world, "jobs", "create", "--agent", live_world.agent.id,
                          "--rate-limit-key", "deploy prod/eu", "--json")
    assert code == 0, err
    assert json.loads(out)["rate_limit_key"] == "deploy prod/eu"
    code, out, err = _cli(live_world, "jobs", "create", "--agent", live_world.agent.id,
                          "--rate-limit-key", "x" * 256)
    assert code == 2 and "--rate-limit-key:" in err

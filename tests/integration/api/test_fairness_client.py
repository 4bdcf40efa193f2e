"""The producer's client library and command line on fair shares, against a live server:
ProducerClient's fairness weight methods (keys of any printable characters,
percent-encoded), its create_job(fairness_key=) and a flow's jobs, and `jobqueue
fairness-keys set|get|delete|list` and `jobqueue jobs create --fairness-key` (text and
--json)."""

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest
from jobqueue_client import ProducerClient, producer_cli
from jobqueue_client.errors import InvalidRequest, NotFound

from jobqueue.models import FairnessKey, Job

pytestmark = pytest.mark.usefixtures("wakeups_stopped_after")

KEYS = ["tenant", "a/b", "tenant 7", "50% off", ".", "..", "a/../b", "v1.2", "?x#y", "ключ"]


@pytest.fixture
def producer(live_world):
    with ProducerClient(live_world.base_url, str(live_world.workspace.id),
                        live_world.key) as client:
        yield client


def test_the_client_sets_reads_lists_and_deletes(live_world, producer):
    for n, key in enumerate(KEYS, start=1):
        made = producer.set_fairness_weight(key, n)
        assert (made["key"], made["weight"]) == (key, n)
        assert producer.get_fairness_weight(key) == made
    assert sorted(FairnessKey.objects.values_list("key", flat=True)) == sorted(KEYS)
    listed = list(producer.list_fairness_keys(page_size=3))
    assert sorted(item["key"] for item in listed) == sorted(KEYS)
    assert [item["key"] for item in listed] == [
        item["key"] for item in producer.list_fairness_keys()]  # one order, page after page
    assert len(list(producer.list_fairness_keys(limit=4))) == 4
    # A PUT again replaces the weight.
    assert producer.set_fairness_weight("a/b", 100)["weight"] == 100
    assert producer.get_fairness_weight("a/b")["weight"] == 100
    with pytest.raises(InvalidRequest) as refused:
        producer.set_fairness_weight("a/b", 101)
    assert set(refused.value.fields) == {"weight"}
    with pytest.raises(InvalidRequest) as refused:
        producer.set_fairness_weight("new\nline", 1)
    assert set(refused.value.fields) == {"key"}
    for key in KEYS:
        producer.delete_fairness_weight(key)
        with pytest.raises(NotFound):
            producer.get_fairness_weight(key)
        with pytest.raises(NotFound):
            producer.delete_fairness_weight(key)
    assert not FairnessKey.objects.exists()
    assert list(producer.list_fairness_keys()) == []


def test_create_job_sends_the_key(live_world, producer):
    job = producer.create_job(str(live_world.agent.id), fairness_key="a/b c%")
    assert job["fairness_key"] == "a/b c%"
    assert producer.get(job["id"])["fairness_key"] == "a/b c%"
    assert Job.objects.get(id=job["id"]).fairness_key == "a/b c%"
    flow = producer.create_flow([{"ref": "x", "job_agent_id": str(live_world.agent.id),
                                  "fairness_key": "flowed"}])
    assert flow["x"]["fairness_key"] == "flowed"
    schedule = producer.create_schedule("fair", "0 3 * * *", {
        "job_agent_id": str(live_world.agent.id), "fairness_key": "scheduled"})
    assert schedule["job"]["fairness_key"] == "scheduled"
    assert producer.trigger_schedule(schedule["id"])["fairness_key"] == "scheduled"


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
    code, out, err = _cli(live_world, "fairness-keys", "set", "tenant eu/7", "--weight", 5)
    assert code == 0, err
    assert "tenant eu/7" in out and ["weight", "5"] in [line.split() for line in
                                                        out.splitlines()]
    row = FairnessKey.objects.get()
    assert (row.key, row.weight) == ("tenant eu/7", 5)
    code, out, err = _cli(live_world, "fairness-keys", "get", "tenant eu/7", "--json")
    assert code == 0, err
    assert json.loads(out)["weight"] == 5
    code, out, err = _cli(live_world, "fairness-keys", "set", "50% off", "--weight", 1)
    assert code == 0, err
    code, out, err = _cli(live_world, "fairness-keys", "list")
    assert code == 0, err
    assert out.splitlines()[0].split() == ["KEY", "WEIGHT", "UPDATED_AT"]
    assert {line.split("  ")[0] for line in out.splitlines()[1:]} == {"50% off",
                                                                      "tenant eu/7"}
    code, out, err = _cli(live_world, "fairness-keys", "list", "--json")
    assert sorted(item["key"] for item in json.loads(out)) == ["50% off", "tenant eu/7"]
    code, out, err = _cli(live_world, "fairness-keys", "set", "k", "--weight", 101)
    assert code == 2 and "--weight: Must be an integer from 1 to 100." in err
    code, out, err = _cli(live_world, "fairness-keys", "delete", "50% off")
    assert code == 0 and "deleted" in out, err
    code, out, err = _cli(live_world, "fairness-keys", "get", "50% off")
    assert code == 3 and "the weight of '50% off' not found" in err
    code, out, err = _cli(live_world, "jobs", "create", "--agent", live_world.agent.id,
                          "--fairness-key", "tenant eu/7", "--json")
    assert code == 0, err
    assert json.loads(out)["fairness_key"] == "tenant eu/7"
    code, out, err = _cli(live_world, "jobs", "create", "--agent", live_world.agent.id,
                          "--fairness-key", "x" * 256)
    assert code == 2 and "--fairness-key:" in err

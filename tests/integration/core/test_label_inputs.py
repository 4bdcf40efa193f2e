"""The lifecycle's own rules for labelled jobs and agents' labels, whoever calls it (the API's
serializers check the same first): each a clear InvalidInput naming its field, nothing made."""

import pytest

from jobqueue import lifecycle
from jobqueue.exceptions import InvalidInput
from jobqueue.lifecycle import inputs
from jobqueue.models import Job, JobLabelSet
from tests.factories import JobAgentFactory

pytestmark = pytest.mark.django_db


def _refused(call, field):
    with pytest.raises(InvalidInput) as refused:
        call()
    assert refused.value.context["field"] == field
    assert not Job.objects.exists()


def test_a_job_targets_exactly_one_of_an_agent_and_labels():
    agent = JobAgentFactory()
    ws = agent.workspace
    _refused(lambda: lifecycle.create_job(workspace=ws, job_agent=agent, labels=["gpu"]),
             "labels")
    _refused(lambda: lifecycle.create_job(workspace=ws), "job_agent_id")
    _refused(lambda: lifecycle.create_job(workspace=ws, labels=[]), "labels")
    _refused(lambda: lifecycle.create_flow(workspace=ws, jobs=[
        lifecycle.FlowJob(ref="a", job_agent=None)]), "jobs[0].job_agent_id")
    _refused(lambda: lifecycle.create_flow(workspace=ws, jobs=[
        lifecycle.FlowJob(ref="a", job_agent=agent, labels=["gpu"])]), "jobs[0].job_agent_id")
    _refused(lambda: lifecycle.create_flow(workspace=ws, jobs=[
        lifecycle.FlowJob(ref="a", job_agent=None, labels=["bad label"])]), "jobs[0].labels")
    assert not JobLabelSet.objects.exists()


def test_label_rules():
    assert inputs.job_labels(["b", "a", "b"]) == ["a", "b"]
    with pytest.raises(InvalidInput):
        inputs.job_labels([])
    with pytest.raises(InvalidInput):
        inputs.job_labels([f"l{i}" for i in range(17)])
    agent = JobAgentFactory()
    made = lifecycle.create_job(workspace=agent.workspace, labels=["gpu", "linux"]).job
    assert str(made.label_set) == "gpu,linux" and made.label_set.labels == ["gpu", "linux"]


def test_an_agent_changes_only_what_it_may():
    agent = JobAgentFactory()
    with pytest.raises(InvalidInput) as refused:
        lifecycle.update_job_agent(agent, name="renamed")
    assert refused.value.context["field"] == "name"
    changed = lifecycle.update_job_agent(agent, labels=["b", "a"], lease_seconds=None)
    agent.refresh_from_db()
    assert changed.labels == agent.labels == ["a", "b"] and agent.lease_seconds is None

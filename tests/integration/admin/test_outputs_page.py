"""The admin job page shows each attempt's log tail, latest first, without the secrets of
the job's dispatch_context even when the agent printed them."""

import pytest
from django.urls import reverse

from jobqueue import lifecycle
from jobqueue.admin import jobs as job_admin
from jobqueue.lifecycle import logs
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_the_job_page_shows_each_attempts_log_tail(op_client, agent, monkeypatch):
    job = JobFactory(job_agent=agent, dispatch_context={"env": {"TOKEN": "hunter2-secret"},
                                                        "list": ["tok-in-list"], "n": 5})
    grant = lifecycle.claim_job(agent, job.id)
    logs.append_log(job.id, grant.claim_id, b"first attempt <b>bold</b>\n")
    lifecycle.release_job(job.id, grant.claim_id)
    grant = lifecycle.claim_job(agent, job.id)
    monkeypatch.setattr(job_admin, "LOG_TAIL_BYTES", 40)
    logs.append_log(job.id, grant.claim_id,
                    b"x" * 100 + b" using hunter2-secret and tok-in-list, done\n")
    page = op_client.get(reverse("admin:jobqueue_job_change", args=[job.pk])).content.decode()
    assert "attempt 2 (144 bytes)" in page and "attempt 1 (26 bytes)" in page
    assert page.index("attempt 2 (144") < page.index("attempt 1 (")
    assert "…" in page  # the second attempt's log is cut to its tail
    assert "x" * 50 not in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page  # escaped, never rendered
    assert "hunter2-secret" not in page and "tok-in-list" not in page
    assert "[redacted]" in page


def test_a_secret_cut_by_the_tail_or_the_logs_end_is_not_shown(op_client, agent,
                                                                 monkeypatch):
    job = JobFactory(job_agent=agent, dispatch_context={"TOKEN": "hunter2-secret"})
    grant = lifecycle.claim_job(agent, job.id)
    monkeypatch.setattr(job_admin, "LOG_TAIL_BYTES", 20)
    # The tail's 20 bytes start inside the first secret; the log ends inside the second.
    logs.append_log(job.id, grant.claim_id, b"x" * 30 + b"hunter2-secret ok ... hunte")
    page = op_client.get(reverse("admin:jobqueue_job_change", args=[job.pk])).content.decode()
    log = page[page.index('<pre class="jq-log">'):]
    log = log[:log.index("</pre>")]
    assert log == '<pre class="jq-log">…[redacted] ok ... [redacted]'
    assert "-secret" not in page and "hunte" not in page


def test_a_job_without_a_log_says_so(op_client, agent):
    job = JobFactory(job_agent=agent)
    page = op_client.get(reverse("admin:jobqueue_job_change", args=[job.pk])).content.decode()
    assert "No log." in page and "No artifacts." in page


def test_the_job_page_lists_its_artifacts_by_attempt_and_state(op_client, agent,
                                                               own_artifact_storage):
    import io

    from jobqueue import states
    from jobqueue.lifecycle import artifacts

    job = JobFactory(job_agent=agent)
    grant = lifecycle.claim_job(agent, job.id)
    artifacts.upload_artifact(job.id, grant.claim_id, "stale.txt", io.BytesIO(b"1"))
    lifecycle.release_job(job.id, grant.claim_id)
    grant = lifecycle.claim_job(agent, job.id)
    artifacts.upload_artifact(job.id, grant.claim_id, "win.txt", io.BytesIO(b"22"))
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    page = op_client.get(reverse("admin:jobqueue_job_change", args=[job.pk])).content.decode()
    assert "<td>win.txt</td><td>2</td><td>published</td><td>2</td>" in page
    assert "<td>stale.txt</td><td>1</td><td>staged</td><td>1</td>" in page


def test_the_job_page_shows_its_effect_ledger(op_client, agent):
    from jobqueue.lifecycle import effects

    job = JobFactory(job_agent=agent)
    page = op_client.get(reverse("admin:jobqueue_job_change", args=[job.pk])).content.decode()
    assert "No effects." in page
    grant = lifecycle.claim_job(agent, job.id)
    charge = effects.begin_effect(job.id, grant.claim_id, "charge-card")
    effects.begin_effect(job.id, grant.claim_id, "email")
    effects.commit_effect(job.id, grant.claim_id, "email", {"id": "<m1>"})
    lifecycle.release_job(job.id, grant.claim_id)
    grant = lifecycle.claim_job(agent, job.id)
    assert effects.begin_effect(job.id, grant.claim_id, "charge-card").state == "unknown"
    page = op_client.get(reverse("admin:jobqueue_job_change", args=[job.pk])).content.decode()
    assert (f"<td>charge-card</td><td>{charge.effect_id}</td><td>begun, outcome unknown</td>"
            "<td>2 (after 1)</td><td>—</td><td><code>—</code></td>") in page
    assert ("<td>committed</td><td>1</td><td>1</td>"
            "<td><code>{&quot;id&quot;: &quot;&lt;m1&gt;&quot;}</code></td>") in page


def test_agent_text_echoing_a_secret_is_redacted_in_every_place_of_the_job_page(op_client,
                                                                                 agent):
    from jobqueue import states
    from jobqueue.db import NowPlusSeconds
    from jobqueue.models import Job

    job = JobFactory(job_agent=agent, max_attempts=3,
                     dispatch_context={"env": {"TOKEN": "hunter2-page-secret"}})
    grant = lifecycle.claim_job(agent, job.id)
    lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, retry=True,
                            message="attempt 1 printed hunter2-page-secret")
    Job.objects.filter(id=job.id).update(available_at=NowPlusSeconds(-1))  # backoff over
    grant = lifecycle.claim_job(agent, job.id)
    lifecycle.report_status(job.id, grant.claim_id, states.FAILURE,
                            message="ter2-page-secret (the output's tail) then hunter2-page-s",
                            result={"TOKEN": "hunter2-page-secret", "hunter2-page-secret": 1},
                            external_id="run-hunter2-page-secret")
    page = op_client.get(reverse("admin:jobqueue_job_change", args=[job.pk])).content.decode()
    assert "hunter2" not in page and "page-secret" not in page
    for shown in ("[redacted] (the output&#x27;s tail) then [redacted]",  # message
                  "&quot;TOKEN&quot;: &quot;[redacted]&quot;",  # result
                  "run-[redacted]",  # external id
                  "attempt 1 printed [redacted]"):  # attempts table, event detail
        assert shown in page, shown
    attempts = page[page.index('class="jq-attempts"'):]
    assert "attempt 1 printed [redacted]" in attempts[:attempts.index("</table>")]
    timeline = page[page.index('class="jq-timeline"'):]
    assert "message=attempt 1 printed [redacted]" in timeline


def test_an_effect_result_echoing_a_secret_is_redacted_on_the_job_page(op_client, agent):
    from jobqueue.lifecycle import effects

    job = JobFactory(job_agent=agent, dispatch_context={"card": "tok-hunter2-effect"})
    grant = lifecycle.claim_job(agent, job.id)
    effects.begin_effect(job.id, grant.claim_id, "charge-card")
    effects.commit_effect(job.id, grant.claim_id, "charge-card",
                          {"charged": "tok-hunter2-effect"})
    page = op_client.get(reverse("admin:jobqueue_job_change", args=[job.pk])).content.decode()
    assert "hunter2-effect" not in page
    assert "&quot;charged&quot;: &quot;[redacted]&quot;" in page

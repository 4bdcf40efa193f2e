"""The effect ledger from a job's command (docs/effects.md, "From the job's command"): a real
`jobqueue-agent` process runs a shell command that uses `jobqueue-effect` (which it finds on
its PATH and which holds neither token nor claim_id); the agent makes the calls with the
job's claim. The first attempt charges and commits, then begins an email and fails
(retryable) before its commit; the retry sees the charge `committed` (and does not charge
again) and the email `unknown` with the same effect_id, reconciles and commits it."""

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jobqueue import lifecycle, states
from jobqueue.models import Job, JobEffect, JobEvent

from .harness import ROOT, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SCRIPT = r"""
set -u
out="$EFFECT_LOG"
[ -z "${JOBQUEUE_TOKEN:-}" ] || echo "token leaked" >> "$out"
state=$(jobqueue-effect begin charge-card --print state) || exit 75
id=$(jobqueue-effect begin charge-card --print effect_id) || exit 75
echo "$JOB_ATTEMPT charge-card $state $id" >> "$out"
if [ "$state" = committed ]; then
  charge=$(jobqueue-effect begin charge-card --print result) || exit 75
else
  echo "CHARGED $id" >> "$out"                      # the outside call, keyed by $id
  charge="{\"charge\": \"ch_$id\"}"
  jobqueue-effect commit charge-card --result "$charge" > /dev/null || exit 75
fi
answer=$(jobqueue-effect begin email:receipt) || exit 75
echo "$JOB_ATTEMPT email:receipt $answer" >> "$out"
echo "SENT $JOB_ATTEMPT" >> "$out"
[ "$JOB_ATTEMPT" = 1 ] && exit 75                   # crashed before its commit
echo '"sent"' | jobqueue-effect commit email:receipt --result-file - > /dev/null || exit 75
printf '{"charge": %s}' "$charge" > "$JOB_RESULT_FILE"
"""


def test_a_commands_effects_are_done_once_across_attempts(stack, make_agent, tmp_path):
    agent, token = make_agent(lease_seconds=5, max_attempts=3)
    effect_log = tmp_path / "effects.log"
    job, _ = lifecycle.create_job(
        workspace=agent.workspace, job_agent=agent,
        job_agent_config={"command": ["sh", "-c", SCRIPT],
                          "env": {"EFFECT_LOG": str(effect_log)}},
        dispatch_context={}, max_attempts=3, retry_backoff_seconds=1)
    proc = stack.start_agent(agent, token, "A")
    wait_for(lambda: Job.objects.get(id=job.id).status in states.TERMINAL, 60,
             "the job to end", on_fail=lambda: stack.logs() + (
                 effect_log.read_text() if effect_log.exists() else ""))
    done = Job.objects.get(id=job.id)
    lines = effect_log.read_text().splitlines()
    assert (done.status, done.attempt) == (states.SUCCESSFUL, 2), lines
    rows = {r.key: r for r in JobEffect.objects.filter(job_id=job.id)}
    charge, email = str(rows["charge-card"].id), str(rows["email:receipt"].id)
    assert lines[0] == f"1 charge-card started {charge}"
    assert lines[1] == f"CHARGED {charge}"
    assert json.loads(lines[2].split(" ", 2)[2]) == {"state": "started", "effect_id": email,
                                                    "attempt": 1}
    assert lines[3:5] == ["SENT 1", f"2 charge-card committed {charge}"]
    # The retry reconciles the email: unknown, begun by attempt 1, the same effect_id.
    assert json.loads(lines[5].split(" ", 2)[2]) == {"state": "unknown", "effect_id": email,
                                                    "attempt": 1}
    assert lines[6:] == ["SENT 2"]
    assert sum(line.startswith("CHARGED") for line in lines) == 1  # charged once
    assert done.result == {"charge": {"charge": f"ch_{charge}"}}
    assert (rows["charge-card"].committed_attempt, rows["charge-card"].result) == (
        1, {"charge": f"ch_{charge}"})
    assert (rows["email:receipt"].attempt, rows["email:receipt"].earlier_attempt,
            rows["email:receipt"].committed_attempt, rows["email:receipt"].result) == (
        2, 1, 2, "sent")
    log = proc.output()
    assert "event=effect_begin" in log and "event=effect_commit" in log
    assert token not in log


class FakeStripe(ThreadingHTTPServer):
    """POST /v1/charges as Stripe keeps idempotency keys: the first request with a key
    makes a charge, a later one with the same key answers that charge. The first answer is
    lost (a 503 after the charge is made: the caller cannot know it happened)."""

    def __init__(self):
        self.charges: dict[str, str] = {}
        self.requests: list[tuple[str, str]] = []
        self.lose_first = True
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                key = self.headers.get("Idempotency-Key", "")
                server.requests.append((key, self.headers.get("Authorization", "")))
                charge = server.charges.setdefault(key, f"ch_{len(server.charges) + 1}")
                status, body = 200, {"id": charge, "object": "charge"}
                if server.lose_first:
                    server.lose_first = False
                    status, body = 503, {"error": {"message": "lost"}}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self):
        self.shutdown()
        self.server_close()


def docs_example() -> str:
    text = (ROOT / "docs" / "effects.md").read_text()
    start = text.index("```sh\n#!/bin/sh\n")
    return text[start + len("```sh\n"):text.index("```", start + 6)]


def test_the_docs_worked_example_charges_once(stack, make_agent):
    """docs/effects.md's shell example, as written: the first attempt's charge is made but
    its answer lost (exit 75); the retry hears `unknown`, sends the same Idempotency-Key and
    gets the first charge back, and commits it; a requeued job's attempt hears `committed`
    and calls nobody."""
    stripe = FakeStripe()
    try:
        agent, token = make_agent(lease_seconds=5, max_attempts=3)
        job, _ = lifecycle.create_job(
            workspace=agent.workspace, job_agent=agent,
            job_agent_config={"command": ["sh", "-c", docs_example()],
                              "env": {"STRIPE_API": stripe.url}},
            dispatch_context={"stripe_key": "sk_test_e2e"}, max_attempts=3,
            retry_backoff_seconds=1)
        stack.start_agent(agent, token, "A")
        ended = lambda: Job.objects.get(id=job.id).status in states.TERMINAL  # noqa: E731
        wait_for(ended, 60, "the job to end", on_fail=stack.logs)
        done = Job.objects.get(id=job.id)
        assert (done.status, done.attempt) == (states.SUCCESSFUL, 2), done.message
        effect = JobEffect.objects.get(job_id=job.id, key="charge-card")
        assert done.result == {"charge": "ch_1"} == effect.result
        assert (effect.earlier_attempt, effect.committed_attempt) == (1, 2)
        auth = "Basic " + base64.b64encode(b"sk_test_e2e:").decode()
        assert stripe.requests == [(str(effect.id), auth)] * 2  # one key, one charge
        assert stripe.charges == {str(effect.id): "ch_1"}
        lifecycle.requeue_job(job.id)
        wait_for(lambda: Job.objects.get(id=job.id).attempt == 3 and ended(), 60,
                 "the requeued job to end", on_fail=stack.logs)
        assert Job.objects.get(id=job.id).result == {"charge": "ch_1"}
        assert len(stripe.requests) == 2  # committed: nobody called
    finally:
        stripe.close()


STALE = r"""
out="$EFFECT_LOG"
echo "$JOB_ATTEMPT begin $(jobqueue-effect begin charge-card --print state)" >> "$out"
if [ "$JOB_ATTEMPT" = 1 ]; then
  trap '' TERM        # let the refused commit's status be written before the agent's SIGKILL
  touch "$EFFECT_LOG.ready"
  while [ ! -e "$EFFECT_LOG.go" ]; do sleep 0.05; done
  jobqueue-effect commit charge-card --result '"stale"' 2>> "$out.err"
  echo "1 commit exit $?" >> "$out"
  sleep 60
fi
jobqueue-effect commit charge-card --result '"fresh"' > /dev/null
echo "$JOB_ATTEMPT commit exit $?" >> "$out"
"""


def test_a_superseded_attempts_commit_is_refused_and_stops_it(stack, make_agent, tmp_path):
    """The job is requeued while its first attempt works: that attempt's commit, made by
    the agent with its old claim, is refused (exit 6, `409 claim_superseded`), the agent stops
    the command and publishes nothing; the next attempt hears `unknown` and commits."""
    agent, token = make_agent(lease_seconds=30, max_attempts=3)
    effect_log = tmp_path / "effects.log"
    job, _ = lifecycle.create_job(
        workspace=agent.workspace, job_agent=agent,
        job_agent_config={"command": ["sh", "-c", STALE],
                          "env": {"EFFECT_LOG": str(effect_log)}},
        dispatch_context={}, max_attempts=3)
    proc = stack.start_agent(agent, token, "A")
    wait_for(lambda: (tmp_path / "effects.log.ready").exists(), 30, "the first attempt's begin",
             on_fail=stack.logs)
    lifecycle.requeue_job(job.id)
    (tmp_path / "effects.log.go").touch()
    wait_for(lambda: Job.objects.get(id=job.id).status in states.TERMINAL, 60,
             "the job to end", on_fail=stack.logs)
    lines = effect_log.read_text().splitlines()
    assert lines == ["1 begin started", "1 commit exit 6", "2 begin unknown",
                     "2 commit exit 0"], lines
    assert "409 claim_superseded" in (tmp_path / "effects.log.err").read_text()
    done = Job.objects.get(id=job.id)
    assert (done.status, done.attempt) == (states.SUCCESSFUL, 2)
    effect = JobEffect.objects.get(job_id=job.id, key="charge-card")
    assert (effect.result, effect.committed_attempt, effect.earlier_attempt) == ("fresh", 2, 1)
    refused = JobEvent.objects.get(job_id=job.id, kind=JobEvent.STALE_WRITE_REFUSED)
    assert refused.detail["operation"] == "effect"
    log = proc.output()
    assert "event=lease_lost" in log and "via=effect" in log and "event=abandoned" in log

"""The effect ledger from a job's command (docs/effects.md, "From the job's command"): a real
`jobqueue-agent` process runs a shell command that uses `jobqueue-effect` (which it finds on
its PATH and which holds neither token nor claim_id); the agent makes the calls with the
job's claim. The first attempt charges and commits, then begins an email and fails
(retryable) before its commit; the retry sees the charge `committed` (and does not charge
again) and the email `unknown` with the same effect_id, reconciles and commits it."""

import json

import pytest

from jobqueue import lifecycle, states
from jobqueue.models import Job, JobEffect

from .harness import wait_for

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

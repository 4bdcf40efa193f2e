"""Signals for code that runs in the service's processes (producers' follow-up work).

`job_finished` is sent once per terminal transition (successful, failure, cancelled, expired),
after the transaction that made it commits, in the process that made it (an API worker, the
reaper, the admin, maintenance). Sender: `jobqueue.models.Job`; arguments: `job_id` (UUID),
`status` (the terminal status) and `actor` (who ended it: "agent:<id>", "reaper",
"operator:<username>", ... as written on the job's event; may be empty).

It is sent with `send_robust`: a receiver that raises is logged ("django.dispatch") and never
undoes the transition nor stops the other receivers. A receiver runs outside the transition's
transaction; what it writes (a follow-up job, say) is its own transaction. A process that dies
between the commit and the send loses that one signal: use webhooks or poll for a guarantee.
No argument carries dispatch_context; load the job (`Job.objects.get(id=job_id)`) if you need it.

    from django.dispatch import receiver
    from jobqueue import lifecycle, signals, states
    from jobqueue.models import Job

    @receiver(signals.job_finished)
    def load_after_extract(sender, job_id, status, **kwargs):
        job = Job.objects.select_related("job_agent", "workspace").get(id=job_id)
        if status == states.SUCCESSFUL and job.job_agent_config.get("step") == "extract":
            lifecycle.create_job(workspace=job.workspace, job_agent=job.job_agent,
                                 job_agent_config={"step": "load", "after": str(job.id)},
                                 idempotency_key=f"load-after-{job.id}")

`job_retrying` is sent once per retryable failure that queued its job again (`{"status":
"failure", "retry": true}` with attempts left, single or batch report; docs/clocks.md), after
its commit, the same way. Arguments: `job_id`, `attempt` (the attempt that failed),
`available_at` (when the job is claimable again, after its backoff; the database's clock) and
`actor`. A retry on the last attempt ends the job: that is a `job_finished` (failure), never
a `job_retrying`.
"""

from django.dispatch import Signal

job_finished = Signal()
job_retrying = Signal()

"""Maintenance services (River's maintenance/): each is a module with SERVICE, interval_seconds()
and service_run(idle_run_id=) -> (counts, run id, idle), which the loop calls (loop.py,
`run_maintenance`); each service's own command runs its run_once() (the artifact cleaner's
command calls lifecycle.artifacts.clean_artifacts).

    artifacts.py artifact clean-up (the artifact_cleaner: lifecycle.artifacts.clean_artifacts)
    groups.py    the group watcher: marks finished groups, writes group.finished deliveries
    pruner.py    retention: deletes finished jobs past their status's retention (prune_jobs)
    reaper.py    the reaper: one sweep (reap_claims), recorded in reaper_run
    webhooks.py  the webhook sender (signing, retries, outbound safety)
    records.py   MaintenanceRun rows: what each service did and when it last ran
    loop.py      one pass over every service, and the loop around it
"""

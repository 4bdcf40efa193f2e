"""Maintenance services (River's maintenance/): each is a module with SERVICE, interval_seconds()
and service_run(idle_run_id=) -> (counts, run id, idle), which the loop calls (loop.py,
`run_maintenance`); each service's own command runs its run_once() (a dict of counts, or a
result object that carries them).

    reaper.py           the reaper: one sweep (reap_claims), recorded in reaper_run
    schedules.py        fires the due cron schedules, each fire time once (fire_schedules)
    group_watcher.py    marks finished groups, writes group.finished deliveries (watch_groups)
    webhooks.py         the webhook sender: signing, retries, outbound safety (send_webhooks)
    pruner.py           retention: deletes finished jobs past their status's retention
                        (prune_jobs)
    artifact_cleaner.py artifact clean-up (clean_artifacts: lifecycle.artifacts)
    run_records.py      MaintenanceRun rows: what each service did and when it last ran
    loop.py             one pass over every service, and the loop around it
"""

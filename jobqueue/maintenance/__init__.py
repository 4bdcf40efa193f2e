"""Maintenance services: each runs once from its own module's `run_once()` (which returns its
counts and records the run), and all of them together from `run_maintenance` (loop.py).

    artifacts.py artifact clean-up (the artifact_cleaner: lifecycle.artifacts.clean_artifacts)
    groups.py    the group watcher: marks finished groups, writes group.finished deliveries
    pruner.py    retention: deletes finished jobs past their status's retention (prune_jobs)
    reaper.py    the reaper's sweep (jobqueue.reaper), recorded in reaper_run as before
    webhooks.py  the webhook sender (signing, retries, outbound safety)
    records.py   MaintenanceRun rows: what each service did and when it last ran
    loop.py      one pass over every service, and the loop around it
"""

"""Maintenance services: each runs once from its own module's `run_once()` (which returns its
counts and records the run), and all of them together from `run_maintenance` (loop.py).

    pruner.py    retention: deletes finished jobs past their status's retention (prune_jobs)
    reaper.py    the reaper's sweep (jobqueue.reaper), recorded in reaper_run as before
    records.py   MaintenanceRun rows: what each service did and when it last ran
    loop.py      one pass over every service, and the loop around it
"""

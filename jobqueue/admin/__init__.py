"""The operator's admin: see what is stuck and repair it through the lifecycle functions.

Every repair (requeue, cancel, mark failed, reap now) calls jobqueue.lifecycle or the
reaper (jobqueue.maintenance.reaper), never `queryset.update`; each writes a job event naming
the operator (`operator:<username>`) and an admin LogEntry, and needs the change permission.
Jobs, claims and events are read-only here: a job changes status only through those functions.

One module per page family: `jobs` (the job list and page, the repair actions; its timeline
is templates/admin/jobqueue/job/timeline.html), `groups` (the job list's group filter and the
cancel-groups confirmation), `recovery`
(the Recovery page and reap-now), `concurrency` (the Concurrency keys page, the job list's
key filters), `ratelimits` (the Rate limits page, the job list's rate limit key filters, the
limits themselves: add, change, delete through jobqueue.lifecycle.ratelimits), `fairness` (the
Fair shares page, the job list's fairness key filters, the weights themselves: add, change,
delete through jobqueue.lifecycle.fairness), `runs` (the
maintenance record), `schedules` (their last and next fires, pause and resume), `webhooks`
(endpoints, the delivery log, redeliver), `workspaces`; `common` holds what they share (the
database's clock, how a span of time reads). Job agents and their credentials are
administered by the edge (agents/admin.py): their health and tokens live there.
"""

from django.contrib import admin

from . import (  # noqa: F401 - each registers its ModelAdmin
    fairness,
    jobs,
    ratelimits,
    runs,
    schedules,
    webhooks,
    workspaces,
)

# The index leads with a "Needs attention" panel linking the Recovery page
# (templates/admin/jobqueue/index.html, jobqueue/templatetags/jobqueue_admin.py).
admin.site.index_template = "admin/jobqueue/index.html"

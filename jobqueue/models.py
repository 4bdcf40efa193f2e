"""The job queue's tables: the whole data model of the `jobqueue` app.

`job` is the queue and the state machine; `job_claim` holds the lease of each in-progress job
(heartbeats write only there); `job_event` is the append-only timeline; `reaper_run` records
each sweep. Table names follow the RFC so that the SQL in docs and tests reads as it does there.

In this order: who owns jobs (`workspace`, `job_agent`); the job and what hangs off it while
it runs (`job_group`, `job_claim`, `job_checkpoint`, `job_effect`, `job_event`); the
maintenance records (`reaper_run`, `maintenance_run`); webhooks (`webhook_endpoint`,
`webhook_delivery`, `webhook_attempt`); the job's outputs (`job_log`, `job_log_chunk`,
`job_artifact`).

Why one module and not a `models/` package, at some 700 lines: it is one concept, read as
one. Almost every table is a foreign key to `job`, and the invariants cross tables (invariant
2, docs/architecture.md: `in_progress` iff one `job_claim` row; a webhook delivery is for a job
or a group), so whoever checks one wants its neighbours in view.
It is Django's convention, where a reader looks first for an app's schema. And it is what
the migrations are made from: `makemigrations --check` compares jobqueue/migrations/ with these
classes, so a schema change is one diff here beside its migration. A file per class would
scatter the relations without making any table shorter: split it when it holds a second
concept, not because it grows.
"""

import uuid

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from . import claimrule, states


class Workspace(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        db_table = "workspace"
        ordering = ["name"]

    def __str__(self):
        return self.name


class JobAgent(models.Model):
    TYPE_HTTP_PULL = "http-pull"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="job_agents")
    name = models.CharField(max_length=200)
    type = models.CharField(max_length=32, default=TYPE_HTTP_PULL, editable=False)
    # None means "the service default" (settings.JOBQUEUE); bounds are checked on save paths.
    lease_seconds = models.PositiveIntegerField(null=True, blank=True)
    max_attempts = models.PositiveIntegerField(null=True, blank=True)
    # The max_runtime_seconds of its jobs that do not set their own (None: no limit).
    max_runtime_seconds = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    # Written at most every few seconds per process by the HTTP edge, never per heartbeat.
    last_seen_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Paused: claims hand out nothing (204 / empty), in-flight jobs go on. Set and cleared
    # only by jobqueue.lifecycle.pause (the database's clock); the claim statement reads it
    # under a share lock, so no claim starts after a pause has committed.
    paused_at = models.DateTimeField(null=True, blank=True, editable=False)
    paused_by = models.CharField(max_length=255, blank=True, default="", editable=False)
    paused_reason = models.CharField(max_length=500, blank=True, default="", editable=False)
    # Its labels (docs/api.md, "Labels"): a sorted list of distinct strings, set when it is
    # created or registered (lifecycle.inputs.labels).
    labels = models.JSONField(default=list, db_default=models.Value([], models.JSONField()),
                              blank=True)

    class Meta:
        db_table = "job_agent"
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="job_agent_name_unique"),
        ]

    def __str__(self):
        return self.name

    @property
    def effective_lease_seconds(self) -> int:
        from .conf import jobqueue_settings

        return self.lease_seconds or jobqueue_settings()["DEFAULT_LEASE_SECONDS"]

    @property
    def effective_max_attempts(self) -> int:
        from .conf import jobqueue_settings

        return self.max_attempts or jobqueue_settings()["DEFAULT_MAX_ATTEMPTS"]


# Claim order: priority (higher first), then claim_at (COALESCE(fair_at, available_at)), then
# created_at: the claim rule's (jobqueue/claimrule.py).
CLAIM_ORDER = claimrule.ORDER


class JobQuerySet(models.QuerySet):
    def claimable(self):
        """What the claim rule says a claim may take (jobqueue/claimrule.py): queued, due,
        not past its expires_at, by the database's clock."""
        return self.filter(claimrule.claimable())

    def overdue(self):
        """Pending or queued past its expires_at (the reaper ends them expired)."""
        return self.filter(status__in=[states.PENDING, states.QUEUED], expires_at__lte=Now())

    def in_claim_order(self):
        return self.alias(claim_at=claimrule.claim_at()).order_by(*CLAIM_ORDER)

    def lease_expired(self):
        """In progress, with a claim whose lease has expired (what the reaper takes)."""
        return self.filter(status=states.IN_PROGRESS, claim__claim_expires_at__lt=Now())

    def active(self):
        return self.filter(status__in=states.ACTIVE)

    def finished(self):
        return self.filter(status__in=states.TERMINAL)


class JobLabelSet(models.Model):
    """A label set that labelled jobs of a workspace target (docs/api.md, "Labels and
    routing"): one row per distinct set, written by the first create that targets it and
    never changed. A claim of an agent with labels finds the sets its labels include here
    (a table as small as the number of distinct sets, whatever the number of jobs) and then
    reads each set's queued jobs in claim order from job_label_claim_order_idx: jobs waiting
    for labels it does not have cost it nothing."""

    id = models.BigAutoField(primary_key=True)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+",
                                  db_index=False)
    # Sorted, distinct (lifecycle.inputs.labels); `key` is them joined by "," (no label
    # holds one), the set's identity in its workspace.
    labels = models.JSONField()
    key = models.CharField(max_length=1100)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        db_table = "job_label_set"
        constraints = [
            models.UniqueConstraint(fields=["workspace", "key"], name="job_label_set_unique"),
        ]

    def __str__(self):
        return self.key


class Job(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: the workspace indexes below lead with workspace_id (each index a
    # job update writes costs; see docs/performance.md).
    workspace = models.ForeignKey(
        Workspace, on_delete=models.CASCADE, related_name="jobs", db_index=False
    )
    # The agent the job targets; for a labelled job, the agent that claimed it last (None
    # until its first claim). A labelled job is routed by label_set, never by this.
    # Not indexed on its own on PostgreSQL (migration 0036): job_workspace_status_idx ends
    # with it, and an agent's readers name its workspace and statuses (lifecycle/records.py,
    # agent_jobs). SQLite keeps the index the foreign key had (the migration says why).
    job_agent = models.ForeignKey(JobAgent, on_delete=models.PROTECT, related_name="jobs",
                                  null=True, blank=True, db_index=False)
    # A labelled job's target (docs/api.md, "Labels and routing"): any agent of its workspace
    # whose labels include all of these may claim it. None for a job that targets one agent
    # (both None for such a job: no bytes in its row). Never changes once the job exists.
    labels = models.JSONField(null=True, blank=True, editable=False)
    label_set = models.ForeignKey(JobLabelSet, on_delete=models.PROTECT, related_name="+",
                                  null=True, blank=True, db_index=False, editable=False)
    status = models.CharField(max_length=16, choices=states.CHOICES, default=states.QUEUED)
    job_agent_config = models.JSONField(default=dict, blank=True)
    # The execution snapshot. May hold secrets: it leaves the service only in a claim response.
    dispatch_context = models.JSONField(default=dict, blank=True)
    result = models.JSONField(null=True, blank=True)
    message = models.TextField(blank=True, default="")
    external_id = models.CharField(max_length=255, blank=True, default="")
    # The producer's group (a run, a pipeline): None when the job belongs to none. Never
    # changes once the job exists. Its cancelled mark lives on JobGroup.
    group = models.CharField(max_length=200, null=True, blank=True, db_column="group_name")
    # A producer has waited for this job's end (GET jobs/{id}?wait_seconds): PostgreSQL's
    # report statements send their wake-up NOTIFY only for such jobs (every NOTIFY takes a
    # cluster-wide lock at commit). Set before the wait's first check; never cleared.
    watched = models.BooleanField(db_default=False, editable=False)
    # attempt counts claims; never goes down. max_attempts is the reaper's limit.
    attempt = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField()
    # What an operator requeue grants again: the attempts the job had when created.
    initial_max_attempts = models.PositiveIntegerField()
    priority = models.IntegerField(default=0)
    # The first retry's wait after a retryable failure (doubled per attempt, capped); None:
    # JOBQUEUE_RETRY_BACKOFF_SECONDS.
    retry_backoff_seconds = models.PositiveIntegerField(null=True, blank=True)
    # The clocks (docs/clocks.md): how long one attempt may run from its claim, heartbeats
    # or not (None: no limit), and when the whole job must be finished (None: never).
    max_runtime_seconds = models.PositiveIntegerField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    available_at = models.DateTimeField(db_default=Now())
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    # The producer's unique key (POST jobs unique_key, docs/api.md "Unique jobs and
    # debounce"): while a job of the workspace with it is live, a create with the same key
    # makes no other job. Not unique in the table (a finished job keeps it; `replace` beside
    # an in_progress one makes a second): creates with a key are serialized by the backend's
    # lock_unique_key.
    unique_key = models.CharField(max_length=255, null=True, blank=True)
    # The debounce cap (docs/api.md "Unique jobs and debounce"): the create that made a
    # debounced job with debounce_max_seconds sets it to its time + debounce_max_seconds, and
    # no later push (whatever that create's options) moves available_at past it. None: no
    # cap (a job made without debounce_max_seconds, and every plain job: written only by a
    # debounced create, never on the claim or report path). Internal: not in the API.
    debounce_until = models.DateTimeField(null=True, blank=True, editable=False)
    # The schedule whose fire made the job, and that fire's time (docs/api.md, "Schedules");
    # None for every other job. A plain id, not a foreign key: the job keeps it when its
    # schedule is deleted, and nothing on the claim or report path reads it.
    schedule_id = models.UUIDField(null=True, blank=True, editable=False)
    scheduled_for = models.DateTimeField(null=True, blank=True, editable=False)
    # Dependencies (POST jobs depends_on, POST flows; docs/api.md "Dependencies and flows"),
    # both false for a plain job, so that its claim and report pay nothing for them.
    # has_parents: the job was created with dependencies (JobDependency rows with it as the
    # child): it waits `pending` until they all succeed, and its claim carries `parents`.
    # has_dependents: some job depends on this one (set under this row's lock when the
    # dependent is created): the statements that end it settle its dependents
    # (jobqueue_settle_dependents, migration 0021; lifecycle/dependencies.py).
    has_parents = models.BooleanField(default=False, db_default=False, editable=False)
    has_dependents = models.BooleanField(default=False, db_default=False, editable=False)
    # Concurrency keys (docs/api.md, "Concurrency keys"): a job with concurrency_key is
    # claimable only while fewer than its concurrency_limit of the workspace's jobs with that
    # key are in progress. None for a plain job (no bytes in its row, no index entry).
    # concurrency_held: true while the key's slots keep it back (internal, never in the API):
    # the triggers of migration 0027 give a key's slots to its queued jobs in claim order
    # (migration 0027: jobqueue_concurrency_admit), and a claim passes over a held job without
    # reading it (the claim indexes leave it out). A plain SmallIntegerField (no CHECK: adding
    # a checked column scans the table under its lock); inputs.concurrency bounds it.
    concurrency_key = models.CharField(max_length=255, null=True, blank=True, editable=False)
    concurrency_limit = models.SmallIntegerField(null=True, blank=True, editable=False)
    concurrency_held = models.BooleanField(null=True, blank=True, editable=False)
    # Rate limits (docs/api.md, "Rate limits"): a job with rate_limit_key is claimable only
    # while fewer than its key's RateLimit.count jobs of the key were claimed in the last
    # period_seconds (a key without a RateLimit limits nothing). None for a plain job.
    # rate_held: true while the key's window keeps it back (internal, never in the API): the
    # triggers of migration 0029 give a key's free permits to its queued jobs in claim order
    # (jobqueue_rate_admit), and a claim passes over a held job without reading it.
    rate_limit_key = models.CharField(max_length=255, null=True, blank=True, editable=False)
    rate_held = models.BooleanField(null=True, blank=True, editable=False)
    # Fair shares (docs/api.md, "Fair shares"): a job with fairness_key takes its place in
    # claim order by fair_at, its key's virtual time (jobqueue/lifecycle/fairness.py: the
    # workspace's queue head, or its key's last job, plus FAIR_STEP / the key's weight), where
    # a job without one takes it by available_at: a claim orders by
    # COALESCE(fair_at, available_at) (claimrule.ORDER's claim_at). None for a plain job.
    fairness_key = models.CharField(max_length=255, null=True, blank=True, editable=False)
    fair_at = models.DateTimeField(null=True, blank=True, editable=False)
    # sha256 of the producer's request body, to tell a replay from a reuse of the key.
    idempotency_fingerprint = models.CharField(max_length=64, blank=True, default="")
    # The claim id of the latest claim. Kept on the job so that a retried terminal
    # report with the claim that finished it can be recognised; never shown to anyone.
    last_claim_id = models.UUIDField(null=True, blank=True, editable=False)
    # The latest claim's lease and holder, as its claim asked: with last_claim_id, attempt,
    # started_at and job_agent_id they are that claim's `claimed` event, which no claim
    # stores (jobqueue/timeline.py, claimed_event). The next claim writes the event row of
    # the claim it replaces, and an operator's transition that clears last_claim_id writes it
    # first. None: that claim's event is stored (a claim made before migration 0022), or no
    # claim. claim_holder is None for an empty holder (no bytes in the row).
    # A plain integer (no CHECK): adding a checked column scans the table under its lock.
    claim_lease_seconds = models.IntegerField(null=True, blank=True, editable=False)
    claim_holder = models.CharField(max_length=200, null=True, blank=True, editable=False)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    objects = JobQuerySet.as_manager()

    class Meta:
        db_table = "job"
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=sorted(states.ALL)), name="job_status_valid"
            ),
            models.CheckConstraint(
                condition=(
                    Q(status__in=sorted(states.TERMINAL), completed_at__isnull=False)
                    | (~Q(status__in=sorted(states.TERMINAL)) & Q(completed_at__isnull=True))
                ),
                name="job_completed_at_iff_terminal",
            ),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="job_max_attempts_min"),
            models.UniqueConstraint(
                fields=["workspace", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="job_idempotency_key_unique",
            ),
        ]
        # Every index on job costs each claim and report an entry per row version: each one
        # names its reader in benchmarks/readers.py (tests/integration/core/
        # test_job_indexes.py fails otherwise), whose `readers` scenario times the reader with
        # and without it (docs/performance.md).
        indexes = [
            # Serves claim-next and the queued poll: only claimable rows, in claim order.
            # A labelled job is routed by its label set, never by job_agent (the agent that
            # claimed it last): one requeued after a claim is here under that agent, and the
            # agent's claim passes over it (claimrule.own_jobs). Not made partial on
            # label_set: the release before reads it with its own statement during an
            # upgrade, and the index is not rebuilt.
            # A job its concurrency key holds back (concurrency_held) is not in it: a claim
            # never reads the jobs of a full key (migration 0028 rebuilt it so).
            # Its third column is the claim order's claim_at, COALESCE(fair_at, available_at):
            # a plain job's available_at (migration 0032 rebuilt it so).
            models.Index(
                "job_agent",
                models.F("priority").desc(),
                claimrule.claim_at(),
                "created_at",
                condition=Q(status=states.QUEUED, concurrency_held__isnull=True,
                            rate_held__isnull=True),
                name="job_claim_order_idx",
            ),
            # The same for labelled jobs, by label set (claimrule.labelled_jobs). Partial: a
            # job that targets one agent never enters it, nor do its updates.
            models.Index(
                "label_set",
                models.F("priority").desc(),
                claimrule.claim_at(),
                "created_at",
                condition=Q(status=states.QUEUED, label_set__isnull=False,
                            concurrency_held__isnull=True, rate_held__isnull=True),
                name="job_label_claim_order_idx",
            ),
            # Concurrency keys (migration 0027's triggers): a key's held jobs in claim order
            # (the next to be given a slot), and its slot holders (counted before slots are
            # given out). Partial: a job without a key never enters them, nor do its updates.
            models.Index(
                "workspace",
                "concurrency_key",
                models.F("priority").desc(),
                "available_at",
                "created_at",
                condition=Q(status=states.QUEUED, concurrency_held=True),
                name="job_concurrency_held_idx",
            ),
            models.Index(
                fields=["workspace", "concurrency_key"],
                condition=Q(concurrency_key__isnull=False, concurrency_held__isnull=True,
                            status__in=[states.QUEUED, states.IN_PROGRESS]),
                name="job_concurrency_live_idx",
            ),
            # Rate limits (migration 0029's triggers): a key's held jobs in claim order (the
            # next to be given a permit), its jobs by their latest claim (the window), and
            # its queued jobs given a permit (counted with the window before permits are
            # given out). Partial: a job without a key never enters them.
            models.Index(
                "workspace",
                "rate_limit_key",
                models.F("priority").desc(),
                "available_at",
                "created_at",
                condition=Q(status=states.QUEUED, rate_held=True),
                name="job_rate_held_idx",
            ),
            models.Index(
                fields=["workspace", "rate_limit_key", "started_at"],
                condition=Q(rate_limit_key__isnull=False, started_at__isnull=False),
                name="job_rate_window_idx",
            ),
            models.Index(
                fields=["workspace", "rate_limit_key"],
                condition=Q(rate_limit_key__isnull=False, rate_held__isnull=True,
                            status=states.QUEUED),
                name="job_rate_permit_idx",
            ),
            # Fair shares (jobqueue/lifecycle/fairness.py): a new fair job's place, after its
            # route's first due fair job (the virtual time) or its key's last queued job on
            # that route: a job of an agent by its agent, a labelled job by its label set.
            models.Index(
                fields=["job_agent", "fair_at"],
                condition=Q(status=states.QUEUED, fairness_key__isnull=False,
                            label_set__isnull=True),
                name="job_fair_agent_idx",
            ),
            models.Index(
                fields=["job_agent", "fairness_key", "fair_at"],
                condition=Q(status=states.QUEUED, fairness_key__isnull=False,
                            label_set__isnull=True),
                name="job_fair_agent_key_idx",
            ),
            models.Index(
                fields=["label_set", "fair_at"],
                condition=Q(status=states.QUEUED, fairness_key__isnull=False,
                            label_set__isnull=False),
                name="job_fair_set_idx",
            ),
            models.Index(
                fields=["label_set", "fairness_key", "fair_at"],
                condition=Q(status=states.QUEUED, fairness_key__isnull=False,
                            label_set__isnull=False),
                name="job_fair_set_key_idx",
            ),
            models.Index(fields=["workspace", "-created_at"], name="job_workspace_created_idx"),
            # The producers' list of one status (GET jobs?status=) and an agent's list of its
            # jobs (of one status, or of all: agent_jobs names them), one index for both: each
            # version of a job's row writes an entry in it (migration 0036).
            models.Index(fields=["workspace", "status", "job_agent"],
                         name="job_workspace_status_idx"),
            models.Index(
                fields=["workspace", "external_id"],
                condition=~Q(external_id=""),
                name="job_external_id_idx",
            ),
            # GET jobs?group=, a group's counts and its cancel. Partial: ungrouped jobs (and
            # their updates) stay out of it.
            models.Index(
                fields=["workspace", "group", "status"],
                condition=Q(group__isnull=False),
                name="job_group_idx",
            ),
            # A create with a unique_key finds the live jobs with it (lifecycle/create.py).
            # Partial: a job without a key never enters it, nor do its updates.
            models.Index(
                fields=["workspace", "unique_key"],
                condition=Q(unique_key__isnull=False),
                name="job_unique_key_idx",
            ),
            # A schedule's `buffer_one` counts its unclaimed jobs (lifecycle/schedules.py).
            # Partial: a job no schedule made never enters it, nor do its updates.
            models.Index(
                fields=["schedule_id", "status"],
                condition=Q(schedule_id__isnull=False),
                name="job_schedule_idx",
            ),
            # The reaper's sweep of jobs that expired before they ran. Partial: a job without
            # expires_at never enters it, and one leaves it when it is claimed.
            models.Index(
                fields=["expires_at"],
                condition=Q(expires_at__isnull=False, status__in=["pending", "queued"]),
                name="job_overdue_idx",
            ),
            # Serves retention (prune_jobs): finished jobs by status, oldest first. Partial: a
            # job enters it once, when it finishes.
            models.Index(
                fields=["status", "completed_at"],
                condition=Q(completed_at__isnull=False),
                name="job_finished_idx",
            ),
        ]

    def __str__(self):
        return f"job {self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in states.TERMINAL

    @property
    def effective_retry_backoff_seconds(self) -> int:
        from .conf import jobqueue_settings

        if self.retry_backoff_seconds is not None:
            return self.retry_backoff_seconds
        return jobqueue_settings()["RETRY_BACKOFF_SECONDS"]


class JobDependency(models.Model):
    """An edge of a job graph: `child` waits for `parent` to be successful (POST jobs
    depends_on, POST flows). Both jobs are of one workspace. Written once, with the child;
    never changed (whether the parent succeeded is the parent's status)."""

    pk = models.CompositePrimaryKey("child_id", "parent_id")
    child = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="parent_edges",
                              db_index=False)
    # Served by job_dependency_parent_idx: the dependents of a job that ends.
    parent = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="child_edges",
                               db_index=False)

    class Meta:
        db_table = "job_dependency"
        verbose_name_plural = "job dependencies"
        indexes = [models.Index(fields=["parent"], name="job_dependency_parent_idx")]

    def __str__(self):
        return f"{self.child_id} after {self.parent_id}"


class JobGroup(models.Model):
    """A group of jobs as a whole: written when its first job is created, and once more when
    it is cancelled. Its row is the lock that orders a group's cancel against the creates and
    requeues into it (jobqueue/lifecycle/groups.py): they hold it FOR SHARE, the cancel
    marks it with an UPDATE."""

    id = models.BigAutoField(primary_key=True)
    workspace = models.ForeignKey(
        Workspace, on_delete=models.CASCADE, related_name="job_groups", db_index=False
    )
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = models.CharField(max_length=200, blank=True, default="")
    cancel_reason = models.CharField(max_length=500, blank=True, default="")
    # When maintenance (the group watcher) last saw the group finished: no job of it pending,
    # queued or in progress. Null while it is live; a create or requeue into a finished group
    # sets it back to null, so the group finishes (and says so) again.
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "job_group"
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="job_group_name_unique"),
        ]
        indexes = [
            # The watcher's scan: live groups only.
            models.Index(fields=["id"], condition=Q(finished_at__isnull=True),
                         name="job_group_live_idx"),
        ]

    def __str__(self):
        return self.name


class JobClaimQuerySet(models.QuerySet):
    def expired(self):
        """Claims whose lease has expired and that the reaper has not taken yet."""
        return self.filter(claim_expires_at__lt=Now(), job__status=states.IN_PROGRESS)


class JobClaim(models.Model):
    """The lease of one in-progress job. Narrow on purpose: heartbeats update only this row.

    claim_expires_at is deliberately not indexed, so that a heartbeat is a heap-only (HOT)
    update; the table holds only in-flight jobs, which the reaper scans.
    """

    job = models.OneToOneField(
        Job, on_delete=models.CASCADE, primary_key=True, related_name="claim"
    )
    # Not indexed: one row per running job, so the few lookups by agent (agent health, an
    # agent's deletion) scan a small table, and every claim saves an index insert.
    job_agent = models.ForeignKey(
        JobAgent, on_delete=models.CASCADE, related_name="claims", db_index=False
    )
    claim_id = models.UUIDField(default=uuid.uuid4, editable=False)
    attempt = models.PositiveIntegerField()
    lease_seconds = models.PositiveIntegerField()
    claimed_at = models.DateTimeField(db_default=Now())
    claim_expires_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The agent process that holds the claim, as it named itself (e.g. host and pid). For
    # operators (the admin) only: no API answer shows it.
    holder = models.CharField(max_length=200, blank=True, default="", db_default="")
    # The agent's Idempotency-Key of the claim-next that made this claim: a retry with the
    # same key by the same agent gets this claim back. It lives (and ends) with the claim.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    # When a clock ends this attempt: the earlier of claimed_at + the job's
    # max_runtime_seconds and its expires_at (None: neither). The lease never runs past it
    # (claims and heartbeats cap claim_expires_at), so the reaper finds the attempt then.
    deadline_at = models.DateTimeField(null=True, blank=True)

    objects = JobClaimQuerySet.as_manager()

    class Meta:
        db_table = "job_claim"
        indexes = [
            # A keyed claim-next's replay lookup. Partial: claims without a key stay out, and
            # no column a heartbeat writes is indexed (heartbeats stay HOT updates).
            models.Index(
                fields=["job_agent", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="job_claim_idempotency_idx",
            ),
        ]

    def __str__(self):
        return f"claim on {self.job_id} (attempt {self.attempt})"


class JobCheckpoint(models.Model):
    """The latest checkpoint an attempt saved (a heartbeat or a progress report carrying
    `checkpoint`, with the current claim_id), handed to the claim of every later attempt.

    Its own table, so that a heartbeat still writes only claim-side rows (never `job`) and
    the claim's end (report, release, reap, cancel, requeue, any clock) needs no copy: the
    row outlives the claim. One row per job, replaced only by an attempt at least as recent
    as the one that wrote it. claim_id is never shown."""

    job = models.OneToOneField(
        Job, on_delete=models.CASCADE, primary_key=True, related_name="checkpoint"
    )
    claim_id = models.UUIDField()
    attempt = models.PositiveIntegerField()
    data = models.JSONField()
    saved_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "job_checkpoint"

    def __str__(self):
        return f"checkpoint of {self.job_id} (attempt {self.attempt})"


class JobEffect(models.Model):
    """One entry of a job's effect ledger: something outside the service that must happen
    at most once for the job (a card charged, an email sent), keyed by the agent's `key`.

    Begun by an attempt (POST .../effects/{key}/begin) before it acts, committed with its
    outcome (PUT .../effects/{key}) after. The row outlives claims, retries, reaps and
    requeues (it is the job's, not the attempt's); `id` is the effect_id an agent hands the
    outside system as its idempotency key, stable for the job and key. `attempt`/`claim_id`
    are the attempt that began it last; `earlier_attempt` the attempt that had begun it
    before that one took it over (None: it was the first), which is what its begin answers
    as `unknown`. claim_id is never shown."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="effects")
    key = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField()
    claim_id = models.UUIDField()
    earlier_attempt = models.PositiveIntegerField(null=True, blank=True)
    begun_at = models.DateTimeField(db_default=Now())
    result = models.JSONField(null=True, blank=True)
    committed_attempt = models.PositiveIntegerField(null=True, blank=True)
    committed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "job_effect"
        constraints = [
            models.UniqueConstraint(fields=["job", "key"], name="job_effect_job_key_uniq"),
        ]

    def __str__(self):
        return f"effect {self.key} of {self.job_id}"

    @property
    def committed(self) -> bool:
        return self.committed_at is not None


class JobEvent(models.Model):
    """Append-only timeline. `detail` never holds dispatch_context, results or tokens."""

    CREATED = "created"
    DISPATCHED = "dispatched"
    CLAIMED = "claimed"
    RELEASED = "released"
    REAPED = "reaped"
    EXPIRED = "expired"
    PROGRESS_REPORTED = "progress_reported"
    STATUS_REPORTED = "status_reported"
    CANCELLED = "cancelled"
    REQUEUED = "requeued"
    STALE_WRITE_REFUSED = "stale_write_refused"
    # A clock ended a running attempt (detail: clock max_runtime or expires_at, requeued).
    TIMED_OUT = "timed_out"
    # The job's expires_at passed while it was pending or queued: it ended expired.
    DEADLINE_PASSED = "deadline_passed"
    # A create with the job's unique_key replaced its dispatch_context (and priority and
    # available_at) or debounced it (detail: debounced) while it was unclaimed.
    REPLACED = "replaced"
    KINDS = [
        (CREATED, "created"),
        (DISPATCHED, "dispatched"),
        (CLAIMED, "claimed"),
        (RELEASED, "released"),
        (REAPED, "reaped (requeued)"),
        (EXPIRED, "expired"),
        (PROGRESS_REPORTED, "progress reported"),
        (STATUS_REPORTED, "status reported"),
        (CANCELLED, "cancelled"),
        (REQUEUED, "requeued"),
        (STALE_WRITE_REFUSED, "stale write refused"),
        (TIMED_OUT, "timed out"),
        (DEADLINE_PASSED, "deadline passed"),
        (REPLACED, "replaced"),
    ]

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=32, choices=KINDS)
    attempt = models.PositiveIntegerField(default=0)
    # Who did it, as jobqueue.actors writes it: "agent:<id>", "operator:<username>",
    # "producer:api_key:<id>", "reaper".
    actor = models.CharField(max_length=200, blank=True, default="")
    # The claim this event concerns, for audits of fencing (never exposed over the API).
    claim_id = models.UUIDField(null=True, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    # The claim's holder (the agent process) on the events of a claim that named one. Kept
    # out of `detail`: the public timeline (GET jobs/{id}) never shows it; the admin does.
    holder = models.CharField(max_length=200, blank=True, default="", db_default="")
    created_at = models.DateTimeField(db_default=Now())
    # Refused writes are recorded once per job, attempt, operation and code: `refusal` is
    # "<operation>:<code>" on those events (NULL on every other), `count` how many refusals
    # the event stands for and `last_at` the latest (NULL while there was one). A flood of
    # stale writes thus grows a counter, never the table.
    refusal = models.CharField(max_length=48, null=True, blank=True, editable=False)
    count = models.PositiveIntegerField(db_default=1, editable=False)
    last_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        db_table = "job_event"
        ordering = ["id"]
        constraints = [
            # Partial: the events every job writes never touch this index.
            models.UniqueConstraint(
                fields=["job", "attempt", "refusal"],
                condition=Q(refusal__isnull=False),
                name="job_event_refusal_once",
            ),
        ]
        indexes = [
            # Lost leases by time (agent health). Partial: the events every job writes
            # (claimed, status_reported) stay out of it.
            models.Index(
                fields=["kind", "-created_at"],
                condition=Q(kind__in=["reaped", "expired"]),
                name="job_event_lease_lost_idx",
            ),
        ]

    def __str__(self):
        return f"{self.kind} on {self.job_id}"


class ReaperRun(models.Model):
    """One sweep, or a stretch of idle sweeps of one looping reaper (`sweeps` counts them):
    a reaper looping every few seconds adds a row when it reaps something, not every pass."""

    id = models.BigAutoField(primary_key=True)
    started_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_seconds = models.FloatField(null=True, blank=True)
    batches = models.PositiveIntegerField(default=0)
    sweeps = models.PositiveIntegerField(default=1)
    requeued = models.PositiveIntegerField(default=0)
    expired = models.PositiveIntegerField(default=0)
    dry_run = models.BooleanField(default=False)
    error = models.TextField(blank=True, default="")
    host = models.CharField(max_length=255, blank=True, default="")
    pid = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        db_table = "reaper_run"
        ordering = ["-started_at"]

    def __str__(self):
        return f"reaper run {self.id}"


class MaintenanceRun(models.Model):
    """One run of a maintenance service (the pruner, ...), or a stretch of idle runs of one
    looping process (`runs` counts them), like ReaperRun for the reaper. `counts` is what the
    service's run_once returned (e.g. {"jobs": 120, "by_status": {...}})."""

    id = models.BigAutoField(primary_key=True)
    service = models.CharField(max_length=64)
    started_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_seconds = models.FloatField(null=True, blank=True)
    runs = models.PositiveIntegerField(default=1)
    counts = models.JSONField(default=dict, blank=True)
    dry_run = models.BooleanField(default=False)
    error = models.TextField(blank=True, default="")
    host = models.CharField(max_length=255, blank=True, default="")
    pid = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        db_table = "maintenance_run"
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["service", "-started_at"], name="maintenance_run_last_idx")]

    def __str__(self):
        return f"{self.service} run {self.id}"


class Schedule(models.Model):
    """A cron schedule of a workspace (docs/api.md, "Schedules"): maintenance's `schedules`
    service (maintenance/schedules.py) fires it at each fire time of `cron` in `timezone`,
    creating a job from `job` (the fields of POST jobs). `next_fire_at` is the next fire time
    not yet handled: a fire advances it with a conditional UPDATE (`WHERE next_fire_at =` the
    time it fires), and schedule_fire's unique row is the second guard, so each fire time is
    handled once whatever the number of maintenance loops. The counts are the fires by
    outcome, which /metrics reads."""

    OVERLAP_SKIP = "skip"
    OVERLAP_BUFFER_ONE = "buffer_one"
    OVERLAP_ALLOW = "allow"
    OVERLAPS = (OVERLAP_SKIP, OVERLAP_BUFFER_ONE, OVERLAP_ALLOW)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="schedules",
                                  db_index=False)
    name = models.CharField(max_length=200)
    cron = models.CharField(max_length=100)
    timezone = models.CharField(max_length=64, default="UTC")
    # The agent its jobs target; None when its `job` targets labels (job["labels"]).
    job_agent = models.ForeignKey(JobAgent, on_delete=models.PROTECT, related_name="schedules",
                                  null=True, blank=True)
    # The job each fire creates: the body of POST jobs but job_agent_id, as validated.
    job = models.JSONField(default=dict, blank=True)
    overlap = models.CharField(max_length=16, choices=[(o, o) for o in OVERLAPS],
                               default=OVERLAP_SKIP)
    catchup_window_seconds = models.PositiveIntegerField(default=60)
    paused_at = models.DateTimeField(null=True, blank=True)
    next_fire_at = models.DateTimeField(null=True, blank=True)
    last_fire_at = models.DateTimeField(null=True, blank=True)
    last_job_id = models.UUIDField(null=True, blank=True)
    fired = models.PositiveBigIntegerField(default=0)
    skipped = models.PositiveBigIntegerField(default=0)
    missed = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "schedule"
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="schedule_name_unique"),
            models.CheckConstraint(condition=Q(overlap__in=["skip", "buffer_one", "allow"]),
                                   name="schedule_overlap_valid"),
        ]
        indexes = [
            models.Index(fields=["workspace", "-created_at"], name="schedule_workspace_idx"),
            # The service's scan: the schedules that are due, oldest fire time first.
            models.Index(fields=["next_fire_at"], condition=Q(paused_at__isnull=True),
                         name="schedule_due_idx"),
        ]

    def __str__(self):
        return self.name


class RateLimit(models.Model):
    """A rate limit of a workspace's `rate_limit_key` (docs/api.md, "Rate limits"): a job with
    the key is claimed only while fewer than `count` of the key's jobs were claimed in the
    last `period_seconds` (on the database clock; a job counts by its latest claim). Set by
    PUT rate-limits/{key}; a key without one limits nothing."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+",
                                  db_index=False)
    key = models.CharField(max_length=255)
    count = models.PositiveIntegerField()
    period_seconds = models.PositiveIntegerField()
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "rate_limit"
        ordering = ["key"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "key"], name="rate_limit_key_unique"),
        ]

    def __str__(self):
        return f"{self.key}: {self.count} / {self.period_seconds}s"


class FairnessKey(models.Model):
    """A fairness key's weight in a workspace (docs/api.md, "Fair shares"): the claims of jobs
    with fairness keys are shared among the keys in proportion to their weights (1 to 100; a
    key without a row weighs 1). Set by PUT fairness-keys/{key}."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+",
                                  db_index=False)
    key = models.CharField(max_length=255)
    weight = models.PositiveSmallIntegerField(default=1)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "fairness_key"
        ordering = ["key"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "key"], name="fairness_key_unique"),
        ]

    def __str__(self):
        return f"{self.key}: weight {self.weight}"


class ScheduleFire(models.Model):
    """One fire time of a schedule, handled: `fired` (its job), `skipped` (the overlap
    policy, or the job could not be made: `detail` says why) or `missed` (past the catch-up
    window when maintenance got to it). A trigger (POST schedules/{id}/trigger) is a fire of
    its own, at the time it was asked, outside the unique constraint."""

    FIRED = "fired"
    SKIPPED = "skipped"
    MISSED = "missed"
    OUTCOMES = (FIRED, SKIPPED, MISSED)

    id = models.BigAutoField(primary_key=True)
    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="fires")
    fire_time = models.DateTimeField()
    trigger = models.BooleanField(default=False)
    outcome = models.CharField(max_length=16, choices=[(o, o) for o in OUTCOMES])
    job_id = models.UUIDField(null=True, blank=True)
    detail = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        db_table = "schedule_fire"
        ordering = ["-fire_time", "-id"]
        constraints = [
            # A fire time of the cron is fired at most once, whatever raced.
            models.UniqueConstraint(fields=["schedule", "fire_time"],
                                    condition=Q(trigger=False), name="schedule_fire_once"),
        ]

    def __str__(self):
        return f"{self.schedule_id} {self.fire_time} {self.outcome}"


class WebhookEndpoint(models.Model):
    """Where a workspace wants to hear of its jobs' completion. The secret signs every
    delivery; it is shown once, when the endpoint is created, and never again (not by the API,
    not in the admin): stored as is, because HMAC signing needs it."""

    JOB_FINISHED = "job.finished"
    GROUP_FINISHED = "group.finished"
    EVENTS = (JOB_FINISHED, GROUP_FINISHED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE,
                                  related_name="webhook_endpoints")
    url = models.CharField(max_length=2000)
    # The events it wants; empty: all of them.
    events = models.JSONField(default=list, blank=True)
    secret = models.CharField(max_length=128, editable=False)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        db_table = "webhook_endpoint"
        ordering = ["-created_at"]

    def __str__(self):
        return f"webhook {self.id}"

    def wants(self, event: str) -> bool:
        return not self.events or event in self.events


class WebhookDeliveryQuerySet(models.QuerySet):
    def due(self):
        return self.filter(status=WebhookDelivery.PENDING, next_attempt_at__lte=Now())


class WebhookDelivery(models.Model):
    """One event for one endpoint (the outbox row), written in the transaction of the
    transition it tells of; sent, and retried, by the webhook sender (maintenance)."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
    STATUSES = [(PENDING, "Pending"), (DELIVERED, "Delivered"), (FAILED, "Failed")]

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE,
                                 related_name="deliveries", db_index=False)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, null=True, blank=True,
                            related_name="webhook_deliveries")
    # A group.finished delivery's group (job is then null).
    group = models.ForeignKey(JobGroup, on_delete=models.CASCADE, null=True, blank=True,
                              related_name="webhook_deliveries", db_index=False)
    event = models.CharField(max_length=32, db_default=WebhookEndpoint.JOB_FINISHED)
    status = models.CharField(max_length=16, choices=STATUSES, db_default=PENDING)
    # The body, fixed when the row is written (in the transaction of the transition it tells
    # of), so that every try sends the same document; null only in rows written before
    # migration 0013, whose body the sender fixes at their first try.
    payload = models.JSONField(null=True, blank=True)
    attempts = models.PositiveIntegerField(db_default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    created_at = models.DateTimeField(db_default=Now())
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, db_default="")

    objects = WebhookDeliveryQuerySet.as_manager()

    class Meta:
        db_table = "webhook_delivery"
        verbose_name_plural = "webhook deliveries"  # not Django's "deliverys"
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["next_attempt_at"], condition=Q(status="pending"),
                         name="webhook_delivery_due_idx"),
            models.Index(fields=["endpoint", "-created_at"], name="webhook_delivery_recent_idx"),
            # The sender's fair share: each endpoint's oldest due deliveries.
            models.Index(fields=["endpoint", "next_attempt_at"], condition=Q(status="pending"),
                         name="webhook_endpoint_due_idx"),
            models.Index(fields=["group"], condition=Q(group__isnull=False),
                         name="webhook_delivery_group_idx"),
        ]

    def __str__(self):
        return f"delivery {self.id}"


class WebhookAttempt(models.Model):
    """One try of a delivery: when, how long, the answer's status code or the error."""

    id = models.BigAutoField(primary_key=True)
    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="tries")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField(db_default=Now())
    duration_seconds = models.FloatField(null=True, blank=True)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        db_table = "webhook_attempt"
        ordering = ["delivery", "started_at", "id"]

    def __str__(self):
        return f"try {self.number} of {self.delivery_id}"


class JobLog(models.Model):
    """One attempt's log: its length. The bytes are in JobLogChunk rows, one per accepted
    append, so an append is an insert and a one-row update, never a rewrite of the log."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="logs")
    attempt = models.PositiveIntegerField()
    length = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "job_log"
        ordering = ["job", "attempt"]
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt"], name="job_log_attempt_unique"),
        ]

    def __str__(self):
        return f"log of {self.job_id} (attempt {self.attempt}, {self.length} bytes)"


class JobLogChunk(models.Model):
    """Bytes [offset, end) of one attempt's log."""

    id = models.BigAutoField(primary_key=True)
    log = models.ForeignKey(JobLog, on_delete=models.CASCADE, related_name="chunks",
                            db_index=False)
    offset = models.PositiveBigIntegerField()
    end = models.PositiveBigIntegerField()
    data = models.BinaryField()

    class Meta:
        db_table = "job_log_chunk"
        constraints = [
            models.UniqueConstraint(fields=["log", "offset"], name="job_log_chunk_offset_unique"),
        ]

    def __str__(self):
        return f"bytes {self.offset}-{self.end} of log {self.log_id}"


class ArtifactFileDeletion(models.Model):
    """The file of a pruned job's artifact, still to be deleted from the artifact storage.

    Retention deletes a batch's artifact rows with their jobs and records their files here in
    the same transaction (lifecycle/prune.py); each is deleted from the storage once that
    transaction commits, and its row with it. A file the storage failed to delete then (an
    outage, S3's SlowDown) keeps its row, and the artifact cleaner (clean_artifacts) tries it
    again on each run: no pruned file is forgotten."""

    id = models.BigAutoField(primary_key=True)
    storage_key = models.CharField(max_length=500, db_index=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "artifact_file_deletion"

    def __str__(self):
        return f"file {self.storage_key} to delete"


class JobArtifact(models.Model):
    """A file an attempt uploaded. `uploading` while its bytes stream to storage, `staged`
    once complete (one per name per claim: a new upload of the name replaces it, and the old
    one becomes `replaced`). The claim's accepted `successful` report publishes its staged
    artifacts (published_at), in the report's own statement. Everything never published, or
    of a claim no longer live, is deleted by `clean_artifacts` (docs/outputs.md)."""

    UPLOADING, STAGED, REPLACED = "uploading", "staged", "replaced"
    STATES = [(UPLOADING, "uploading"), (STAGED, "staged"), (REPLACED, "replaced")]

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="artifacts")
    attempt = models.PositiveIntegerField()
    claim_id = models.UUIDField()
    name = models.CharField(max_length=200)
    state = models.CharField(max_length=16, choices=STATES, default=UPLOADING)
    storage_key = models.CharField(max_length=500)
    size = models.PositiveBigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True, default="")
    content_type = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())
    published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "job_artifact"
        ordering = ["job", "name"]
        constraints = [
            models.UniqueConstraint(fields=["job", "claim_id", "name"],
                                    condition=Q(state="staged"),
                                    name="job_artifact_staged_name_unique"),
        ]
        indexes = [
            models.Index(fields=["job", "claim_id"], name="job_artifact_claim_idx"),
            # What clean-up looks at: the rows never published.
            models.Index(fields=["id"], condition=Q(published_at__isnull=True),
                         name="job_artifact_unpublished_idx"),
        ]

    def __str__(self):
        return f"{self.name} of {self.job_id} (attempt {self.attempt}, {self.state})"

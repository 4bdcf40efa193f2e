# The claim order of fair shares (#29; 0031): the claim indexes rebuilt on
# COALESCE(fair_at, available_at) (a plain job's available_at: the same order, the same key
# size), and the four a fair job's creation reads (its route's first due fair job, its key's
# last on the route; a route is its agent, or a labelled job's label set). Built as 0028 and 0030 built theirs (CONCURRENTLY, each claim index beside the
# old one, then swapped). The release before orders its claims by available_at: upgrade its
# replicas before a job with a fairness key is created (its claims would take fair jobs in
# creation order, not by share).

from django.db import migrations, models
from django.db.models.functions import Coalesce

from jobqueue import indexes as _indexes

CLAIM_AT = Coalesce("fair_at", "available_at")

CLAIM = models.Index(
    models.F("job_agent"), models.OrderBy(models.F("priority"), descending=True),
    CLAIM_AT, models.F("created_at"),
    condition=models.Q(("concurrency_held__isnull", True), ("rate_held__isnull", True),
                       ("status", "queued")),
    name="job_claim_order_idx")
LABEL_CLAIM = models.Index(
    models.F("label_set"), models.OrderBy(models.F("priority"), descending=True),
    CLAIM_AT, models.F("created_at"),
    condition=models.Q(("concurrency_held__isnull", True), ("label_set__isnull", False),
                       ("rate_held__isnull", True), ("status", "queued")),
    name="job_label_claim_order_idx")
FAIR = dict(fairness_key__isnull=False, status="queued")
AGENT = models.Index(
    fields=["job_agent", "fair_at"],
    condition=models.Q(label_set__isnull=True, **FAIR), name="job_fair_agent_idx")
AGENT_KEY = models.Index(
    fields=["job_agent", "fairness_key", "fair_at"],
    condition=models.Q(label_set__isnull=True, **FAIR), name="job_fair_agent_key_idx")
SET = models.Index(
    fields=["label_set", "fair_at"],
    condition=models.Q(label_set__isnull=False, **FAIR), name="job_fair_set_idx")
SET_KEY = models.Index(
    fields=["label_set", "fairness_key", "fair_at"],
    condition=models.Q(label_set__isnull=False, **FAIR), name="job_fair_set_key_idx")

OLD_CLAIM = models.Index(
    models.F("job_agent"), models.OrderBy(models.F("priority"), descending=True),
    models.F("available_at"), models.F("created_at"),
    condition=models.Q(("concurrency_held__isnull", True), ("rate_held__isnull", True),
                       ("status", "queued")),
    name="job_claim_order_idx")
OLD_LABEL_CLAIM = models.Index(
    models.F("label_set"), models.OrderBy(models.F("priority"), descending=True),
    models.F("available_at"), models.F("created_at"),
    condition=models.Q(("concurrency_held__isnull", True), ("label_set__isnull", False),
                       ("rate_held__isnull", True), ("status", "queued")),
    name="job_label_claim_order_idx")

NEW = (AGENT, AGENT_KEY, SET, SET_KEY)


SWAPS = ((CLAIM, OLD_CLAIM), (LABEL_CLAIM, OLD_LABEL_CLAIM))


def forwards(apps, schema_editor):
    _indexes.rebuild(apps, schema_editor, SWAPS, NEW)


def backwards(apps, schema_editor):
    _indexes.unbuild(apps, schema_editor, SWAPS, NEW)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ("jobqueue", "0031_fair_shares"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards)],
            state_operations=[
                migrations.RemoveIndex(model_name="job", name="job_claim_order_idx"),
                migrations.RemoveIndex(model_name="job", name="job_label_claim_order_idx"),
                migrations.AddIndex(model_name="job", index=CLAIM),
                migrations.AddIndex(model_name="job", index=LABEL_CLAIM),
                *(migrations.AddIndex(model_name="job", index=index) for index in NEW),
            ],
        ),
    ]

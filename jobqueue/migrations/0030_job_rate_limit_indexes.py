# The indexes of rate limits (#29; 0029), built as 0028 built the concurrency keys': the claim
# indexes rebuilt without the jobs a rate limit holds back (a claim never reads them), and
# the three the triggers read (a key's held jobs in claim order, its jobs by their latest
# claim, its queued jobs given a permit). On PostgreSQL each built CONCURRENTLY, a claim index
# beside the old one under a new name, then swapped (0028's _swap). The release before reads
# job_claim_order_idx with its own statement, which does not say `rate_held IS NULL`:
# upgrade its replicas before a job with a rate limit key is created (docs/deploy.md).

from django.db import migrations, models

from jobqueue import indexes as _indexes

CLAIM = models.Index(
    models.F("job_agent"), models.OrderBy(models.F("priority"), descending=True),
    models.F("available_at"), models.F("created_at"),
    condition=models.Q(("concurrency_held__isnull", True), ("rate_held__isnull", True),
                       ("status", "queued")),
    name="job_claim_order_idx")
LABEL_CLAIM = models.Index(
    models.F("label_set"), models.OrderBy(models.F("priority"), descending=True),
    models.F("available_at"), models.F("created_at"),
    condition=models.Q(("concurrency_held__isnull", True), ("label_set__isnull", False),
                       ("rate_held__isnull", True), ("status", "queued")),
    name="job_label_claim_order_idx")
HELD = models.Index(
    models.F("workspace"), models.F("rate_limit_key"),
    models.OrderBy(models.F("priority"), descending=True), models.F("available_at"),
    models.F("created_at"),
    condition=models.Q(("rate_held", True), ("status", "queued")),
    name="job_rate_held_idx")
WINDOW = models.Index(
    fields=["workspace", "rate_limit_key", "started_at"],
    condition=models.Q(("rate_limit_key__isnull", False), ("started_at__isnull", False)),
    name="job_rate_window_idx")
PERMIT = models.Index(
    fields=["workspace", "rate_limit_key"],
    condition=models.Q(("rate_held__isnull", True), ("rate_limit_key__isnull", False),
                       ("status", "queued")),
    name="job_rate_permit_idx")

OLD_CLAIM = models.Index(
    models.F("job_agent"), models.OrderBy(models.F("priority"), descending=True),
    models.F("available_at"), models.F("created_at"),
    condition=models.Q(("concurrency_held__isnull", True), ("status", "queued")),
    name="job_claim_order_idx")
OLD_LABEL_CLAIM = models.Index(
    models.F("label_set"), models.OrderBy(models.F("priority"), descending=True),
    models.F("available_at"), models.F("created_at"),
    condition=models.Q(("concurrency_held__isnull", True), ("label_set__isnull", False),
                       ("status", "queued")),
    name="job_label_claim_order_idx")

NEW = (HELD, WINDOW, PERMIT)


SWAPS = ((CLAIM, OLD_CLAIM), (LABEL_CLAIM, OLD_LABEL_CLAIM))


def forwards(apps, schema_editor):
    _indexes.rebuild(apps, schema_editor, SWAPS, NEW)


def backwards(apps, schema_editor):
    _indexes.unbuild(apps, schema_editor, SWAPS, NEW)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ("jobqueue", "0029_rate_limits"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards)],
            state_operations=[
                migrations.RemoveIndex(model_name="job", name="job_claim_order_idx"),
                migrations.RemoveIndex(model_name="job", name="job_label_claim_order_idx"),
                migrations.AddIndex(model_name="job", index=CLAIM),
                migrations.AddIndex(model_name="job", index=LABEL_CLAIM),
                migrations.AddIndex(model_name="job", index=HELD),
                migrations.AddIndex(model_name="job", index=WINDOW),
                migrations.AddIndex(model_name="job", index=PERMIT),
            ],
        ),
    ]

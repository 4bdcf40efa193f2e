# The indexes of concurrency keys (#29; 0027): the claim indexes rebuilt without the jobs a
# key holds back (a claim never reads them, however many wait behind a full key), and the two
# the triggers read (a key's held jobs in claim order, its slot holders). On PostgreSQL each
# built CONCURRENTLY (a plain CREATE INDEX on `job` would hold every claim and report for the
# scan): a claim index is built beside the old one under a new name, the old one dropped,
# the new one renamed, so a claim always has one. A build that failed leaves an INVALID
# index behind: it is dropped first when `migrate` runs again. The release before reads
# job_claim_order_idx with its own statement, which does not say `concurrency_held IS NULL`:
# upgrade its replicas before a job with a concurrency key is created (docs/deploy.md).

from django.db import migrations, models

from jobqueue import indexes as _indexes

CLAIM = models.Index(
    models.F("job_agent"), models.OrderBy(models.F("priority"), descending=True),
    models.F("available_at"), models.F("created_at"),
    condition=models.Q(("concurrency_held__isnull", True), ("status", "queued")),
    name="job_claim_order_idx")
LABEL_CLAIM = models.Index(
    models.F("label_set"), models.OrderBy(models.F("priority"), descending=True),
    models.F("available_at"), models.F("created_at"),
    condition=models.Q(("concurrency_held__isnull", True), ("label_set__isnull", False),
                       ("status", "queued")),
    name="job_label_claim_order_idx")
HELD = models.Index(
    models.F("workspace"), models.F("concurrency_key"),
    models.OrderBy(models.F("priority"), descending=True), models.F("available_at"),
    models.F("created_at"),
    condition=models.Q(("concurrency_held", True), ("status", "queued")),
    name="job_concurrency_held_idx")
LIVE = models.Index(
    fields=["workspace", "concurrency_key"],
    condition=models.Q(("concurrency_held__isnull", True), ("concurrency_key__isnull", False),
                       ("status__in", ["queued", "in_progress"])),
    name="job_concurrency_live_idx")

OLD_CLAIM = models.Index(
    models.F("job_agent"), models.OrderBy(models.F("priority"), descending=True),
    models.F("available_at"), models.F("created_at"),
    condition=models.Q(("status", "queued")), name="job_claim_order_idx")
OLD_LABEL_CLAIM = models.Index(
    models.F("label_set"), models.OrderBy(models.F("priority"), descending=True),
    models.F("available_at"), models.F("created_at"),
    condition=models.Q(("label_set__isnull", False), ("status", "queued")),
    name="job_label_claim_order_idx")


SWAPS = ((CLAIM, OLD_CLAIM), (LABEL_CLAIM, OLD_LABEL_CLAIM))


def forwards(apps, schema_editor):
    _indexes.rebuild(apps, schema_editor, SWAPS, (HELD, LIVE))


def backwards(apps, schema_editor):
    _indexes.unbuild(apps, schema_editor, SWAPS, (HELD, LIVE))


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ("jobqueue", "0027_job_concurrency_keys"),
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
                migrations.AddIndex(model_name="job", index=LIVE),
            ],
        ),
    ]

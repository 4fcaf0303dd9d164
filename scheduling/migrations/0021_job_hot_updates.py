"""The jobs' table rewritten in place where it can be: each scheduling cycle rewrites the waiting jobs' reasons and
positions (thousands of rows), none of them indexed. On PostgreSQL its pages are filled to 60 %, so the new version
of a row usually fits beside the old one (a heap-only update: no new entry in any index, the old version pruned
from the page); at the default 100 % every rewritten row moved to another page and got a new entry in each of the
table's indexes. The index on `state` alone goes: the index on (state, submitted_at) serves the same lookups.
Rows written before this keep their packing until the table is rewritten (VACUUM FULL or pg_repack)."""

from django.db import migrations, models

FILLFACTOR_PCT = 60


def _fillfactor(pct: int):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            table = schema_editor.quote_name(apps.get_model("scheduling", "Job")._meta.db_table)
            schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {int(pct)})")

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0020_job_image_job_mounts"),
    ]

    operations = [
        migrations.RunPython(_fillfactor(FILLFACTOR_PCT), _fillfactor(100)),
        migrations.AlterField(
            model_name="job",
            name="state",
            field=models.CharField(
                choices=[
                    ("pending", "Pending"),
                    ("placed", "Placed"),
                    ("starting", "Starting"),
                    ("running", "Running"),
                    ("succeeded", "Succeeded"),
                    ("failed", "Failed"),
                    ("cancelled", "Cancelled"),
                    ("preempted", "Preempted"),
                    ("lost", "Lost"),
                ],
                default="pending",
                max_length=20,
            ),
        ),
    ]

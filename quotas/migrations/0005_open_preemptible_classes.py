# Existing deployments stay usable: every class that may be preempted stays open to every team. A class that is
# never preempted (e.g. critical) preempts everyone, so from now on only teams granted it, or whose default it is,
# may use it.

from django.db import migrations


def open_preemptible_classes(apps, schema_editor):
    PriorityClass = apps.get_model("quotas", "PriorityClass")
    PriorityClass.objects.filter(preemptible=True).update(open_to_all_teams=True)


class Migration(migrations.Migration):

    dependencies = [
        ('quotas', '0004_priority_class_grants'),
    ]

    operations = [
        migrations.RunPython(open_preemptible_classes, migrations.RunPython.noop),
    ]

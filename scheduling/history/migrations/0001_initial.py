from django.db import migrations, models



def make_partitioned(apps, schema_editor):
    """On PostgreSQL the two big tables are partitioned by day of `at` (scheduling.history.partitions)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in ("history_node_minute", "history_gpu_five_minute"):
        schema_editor.execute(f"ALTER TABLE {name} RENAME TO {name}_plain")
        schema_editor.execute(
            f"CREATE TABLE {name} (LIKE {name}_plain INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
            "INCLUDING INDEXES) PARTITION BY RANGE (at)"
        )
        schema_editor.execute(f"DROP TABLE {name}_plain")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='ClusterMinute',
            fields=[
                ('at', models.DateTimeField(primary_key=True, serialize=False)),
                ('pending_jobs', models.IntegerField()),
                ('running_jobs', models.IntegerField()),
                ('ready_nodes', models.IntegerField()),
                ('nodes', models.IntegerField()),
            ],
            options={
                'db_table': 'history_cluster_minute',
            },
        ),
        migrations.CreateModel(
            name='GpuFiveMinute',
            fields=[
                ('pk', models.CompositePrimaryKey('gpu_id', 'at', blank=True, editable=False, primary_key=True, serialize=False)),
                ('gpu_id', models.IntegerField()),
                ('at', models.DateTimeField(help_text='The start of the 5-minute window (UTC).')),
                ('node_id', models.IntegerField()),
                ('samples', models.PositiveSmallIntegerField(help_text='Minute samples summed into the window.')),
                ('util_pct_sum', models.FloatField(default=0)),
                ('memory_used_mib_max', models.BigIntegerField(null=True)),
                ('memory_allocated_mib', models.BigIntegerField(default=0)),
                ('temperature_c_max', models.SmallIntegerField(null=True)),
                ('power_w_sum', models.FloatField(default=0)),
                ('sm_clock_mhz_sum', models.FloatField(default=0)),
                ('ecc_uncorrected', models.IntegerField(help_text='Volatile uncorrected ECC errors, newest count.', null=True)),
            ],
            options={
                'db_table': 'history_gpu_five_minute',
            },
        ),
        migrations.CreateModel(
            name='ModelMinute',
            fields=[
                ('pk', models.CompositePrimaryKey('at', 'model_id', blank=True, editable=False, primary_key=True, serialize=False)),
                ('at', models.DateTimeField()),
                ('model_id', models.IntegerField()),
                ('gpus', models.IntegerField()),
                ('ready_gpus', models.IntegerField(help_text='On ready or draining nodes, not failed.')),
                ('allocated_milli', models.IntegerField()),
                ('used_milli', models.IntegerField(help_text='Utilisation summed over sampled cards: 2 cards at 50 % = 1000.')),
                ('free_gpus', models.IntegerField(help_text='Ready cards with nothing allocated.')),
                ('stranded_milli', models.IntegerField(help_text='Free capacity on partly allocated ready cards.')),
            ],
            options={
                'db_table': 'history_model_minute',
            },
        ),
        migrations.CreateModel(
            name='NodeMinute',
            fields=[
                ('pk', models.CompositePrimaryKey('node_id', 'at', blank=True, editable=False, primary_key=True, serialize=False)),
                ('node_id', models.IntegerField()),
                ('at', models.DateTimeField(help_text='The minute (UTC) the row covers, its start.')),
                ('state', models.CharField(max_length=20)),
                ('gpus', models.PositiveSmallIntegerField()),
                ('allocated_milli', models.IntegerField(help_text='Whole-GPU equivalents allocated, in thousandths.')),
                ('util_pct', models.FloatField(help_text='Mean SM utilisation of its sampled GPUs.', null=True)),
                ('memory_used_mib', models.BigIntegerField(null=True)),
                ('memory_allocated_mib', models.BigIntegerField()),
                ('memory_mib', models.BigIntegerField()),
                ('power_w', models.FloatField(null=True)),
                ('temperature_max_c', models.SmallIntegerField(null=True)),
            ],
            options={
                'db_table': 'history_node_minute',
            },
        ),
        migrations.CreateModel(
            name='TeamMinute',
            fields=[
                ('pk', models.CompositePrimaryKey('at', 'team_id', blank=True, editable=False, primary_key=True, serialize=False)),
                ('at', models.DateTimeField()),
                ('team_id', models.IntegerField()),
                ('guaranteed_milli', models.IntegerField()),
                ('limit_milli', models.IntegerField(help_text='Null: no limit.', null=True)),
                ('held_milli', models.IntegerField()),
                ('borrowed_milli', models.IntegerField()),
                ('fair_share_milli', models.IntegerField(null=True)),
                ('pending_jobs', models.IntegerField()),
                ('pending_milli', models.IntegerField(help_text='What its pending jobs ask for.')),
                ('running_jobs', models.IntegerField()),
            ],
            options={
                'db_table': 'history_team_minute',
            },
        ),
        migrations.CreateModel(
            name='UsageHour',
            fields=[
                ('pk', models.CompositePrimaryKey('hour', 'team_id', 'user_id', 'model_id', blank=True, editable=False, primary_key=True, serialize=False)),
                ('hour', models.DateTimeField()),
                ('team_id', models.IntegerField()),
                ('user_id', models.IntegerField()),
                ('model_id', models.IntegerField(help_text="0: the card's model is not known.")),
                ('gpu_seconds', models.FloatField(default=0, help_text='Whole-GPU equivalents held, times seconds.')),
                ('gpu_memory_gib_seconds', models.FloatField(default=0)),
                ('idle_gpu_seconds', models.FloatField(default=0, help_text='Of what was held, the part on cards under the idle threshold (minute samples).')),
            ],
            options={
                'db_table': 'history_usage_hour',
            },
        ),
        migrations.CreateModel(
            name='GpuEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('at', models.DateTimeField(db_index=True)),
                ('node_id', models.IntegerField()),
                ('gpu_id', models.IntegerField(null=True)),
                ('gpu_uuid', models.CharField(max_length=80)),
                ('kind', models.CharField(help_text='xid or ecc', max_length=10)),
                ('code', models.IntegerField(help_text='The XID number, or the ECC error count.')),
            ],
            options={
                'db_table': 'history_gpu_event',
                'indexes': [models.Index(fields=['gpu_id', 'at'], name='gpu_event_gpu_at')],
            },
        ),
        migrations.RunPython(make_partitioned, migrations.RunPython.noop),
    ]

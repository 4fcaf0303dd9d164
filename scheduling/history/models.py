"""Rollups the history pages read: sized for a real cluster, pruned after `TESSERA_HISTORY_RETENTION_DAYS`.

- `NodeMinute`: each node each minute (state, allocation, utilisation, memory, power, temperature).
- `NodeHour`: each node each hour, the sums of its minutes (what the utilisation heatmap reads: a week of a
  1,000-node cluster is 168,000 rows here, not 10 million).
- `GpuFiveMinute`: each GPU each 5 minutes, the mean of that window's minute samples (the DCGM set).
- `ModelMinute`: each GPU model each minute: ready / allocated / used / free, and free capacity stranded on
  partly used cards (fragmentation).
- `TeamMinute`: each team each minute: guarantee, limit, held, borrowed, what waits.
- `ClusterMinute`: the queue each minute.
- `UsageHour`: GPU-seconds per team, user and GPU model each hour, from the jobs' own records (as the usage API
  counts them), with the allocated GPU-seconds that sat idle.
- `WaitHour`: the jobs that started each hour, per team and wait bucket: how many and their summed wait from
  submit to start (the queue times' rollup: the mean is exact, the p95 comes from the buckets, within 10 %).
- `GpuEvent`: XID and ECC events, as they happen (rare: one row each).

The two big tables (node and GPU rows) are split into daily partitions on PostgreSQL, so pruning drops a day's
partition instead of deleting rows (`scheduling.history.partitions`). Rows name nodes, GPUs, teams and users by id
and hold no foreign keys: history outlives a node taken out of the inventory until it is pruned.

Units: `*_milli` are thousandths of a whole-GPU equivalent (a 0.25 slice is 250), as the engine counts.
"""

import math

from django.db import models


class NodeMinute(models.Model):
    pk = models.CompositePrimaryKey("node_id", "at")
    node_id = models.IntegerField()
    at = models.DateTimeField(help_text="The minute (UTC) the row covers, its start.")
    state = models.CharField(max_length=20)
    gpus = models.PositiveSmallIntegerField()
    allocated_milli = models.IntegerField(help_text="Whole-GPU equivalents allocated, in thousandths.")
    util_pct = models.FloatField(null=True, help_text="Mean SM utilisation of its sampled GPUs.")
    memory_used_mib = models.BigIntegerField(null=True)
    memory_allocated_mib = models.BigIntegerField()
    memory_mib = models.BigIntegerField()
    power_w = models.FloatField(null=True)
    temperature_max_c = models.SmallIntegerField(null=True)

    class Meta:
        db_table = "history_node_minute"

    def __str__(self) -> str:
        return f"node {self.node_id} at {self.at:%Y-%m-%d %H:%M}"


class NodeHour(models.Model):
    pk = models.CompositePrimaryKey("node_id", "hour")
    node_id = models.IntegerField()
    hour = models.DateTimeField(help_text="The hour (UTC) the row covers, its start.")
    minutes = models.PositiveSmallIntegerField(help_text="Minute rows summed into the hour.")
    gpus = models.PositiveSmallIntegerField(help_text="Cards on the node at its newest minute.")
    allocated_milli_sum = models.BigIntegerField(
        help_text="Allocated thousandths of GPUs, summed over minutes."
    )
    util_pct_sum = models.FloatField(
        default=0, help_text="Mean utilisation of its cards, summed over minutes."
    )
    util_minutes = models.PositiveSmallIntegerField(default=0, help_text="Minutes with a utilisation sample.")

    class Meta:
        db_table = "history_node_hour"

    def __str__(self) -> str:
        return f"node {self.node_id} at {self.hour:%Y-%m-%d %H}h"


class GpuFiveMinute(models.Model):
    pk = models.CompositePrimaryKey("gpu_id", "at")
    gpu_id = models.IntegerField()
    at = models.DateTimeField(help_text="The start of the 5-minute window (UTC).")
    node_id = models.IntegerField()
    samples = models.PositiveSmallIntegerField(help_text="Minute samples summed into the window.")
    util_pct_sum = models.FloatField(default=0)
    memory_used_mib_max = models.BigIntegerField(null=True)
    memory_allocated_mib = models.BigIntegerField(default=0)
    temperature_c_max = models.SmallIntegerField(null=True)
    power_w_sum = models.FloatField(default=0)
    sm_clock_mhz_sum = models.FloatField(default=0)
    ecc_uncorrected = models.IntegerField(
        null=True, help_text="Volatile uncorrected ECC errors, newest count."
    )

    class Meta:
        db_table = "history_gpu_five_minute"

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} at {self.at:%Y-%m-%d %H:%M}"


class ModelMinute(models.Model):
    pk = models.CompositePrimaryKey("at", "model_id")
    at = models.DateTimeField()
    model_id = models.IntegerField()
    gpus = models.IntegerField()
    ready_gpus = models.IntegerField(help_text="On ready or draining nodes, not failed.")
    allocated_milli = models.IntegerField()
    used_milli = models.IntegerField(
        help_text="Utilisation summed over sampled cards: 2 cards at 50 % = 1000."
    )
    free_gpus = models.IntegerField(help_text="Ready cards with nothing allocated.")
    stranded_milli = models.IntegerField(help_text="Free capacity on partly allocated ready cards.")

    class Meta:
        db_table = "history_model_minute"

    def __str__(self) -> str:
        return f"model {self.model_id} at {self.at:%Y-%m-%d %H:%M}"


class TeamMinute(models.Model):
    pk = models.CompositePrimaryKey("at", "team_id")
    at = models.DateTimeField()
    team_id = models.IntegerField()
    guaranteed_milli = models.IntegerField()
    limit_milli = models.IntegerField(null=True, help_text="Null: no limit.")
    held_milli = models.IntegerField()
    borrowed_milli = models.IntegerField()
    fair_share_milli = models.IntegerField(null=True)
    pending_jobs = models.IntegerField()
    pending_milli = models.IntegerField(help_text="What its pending jobs ask for.")
    running_jobs = models.IntegerField()

    class Meta:
        db_table = "history_team_minute"

    def __str__(self) -> str:
        return f"team {self.team_id} at {self.at:%Y-%m-%d %H:%M}"


class ClusterMinute(models.Model):
    at = models.DateTimeField(primary_key=True)
    pending_jobs = models.IntegerField()
    running_jobs = models.IntegerField()
    ready_nodes = models.IntegerField()
    nodes = models.IntegerField()

    class Meta:
        db_table = "history_cluster_minute"

    def __str__(self) -> str:
        return f"cluster at {self.at:%Y-%m-%d %H:%M}"


class UsageHour(models.Model):
    pk = models.CompositePrimaryKey("hour", "team_id", "user_id", "model_id")
    hour = models.DateTimeField()
    team_id = models.IntegerField()
    user_id = models.IntegerField()
    model_id = models.IntegerField(help_text="0: the card's model is not known.")
    gpu_seconds = models.FloatField(default=0, help_text="Whole-GPU equivalents held, times seconds.")
    gpu_memory_gib_seconds = models.FloatField(default=0)
    idle_gpu_seconds = models.FloatField(
        default=0, help_text="Of what was held, the part on cards under the idle threshold (minute samples)."
    )

    class Meta:
        db_table = "history_usage_hour"

    def __str__(self) -> str:
        return f"team {self.team_id} user {self.user_id} at {self.hour:%Y-%m-%d %H}h"


# Waits are counted in a fixed histogram: bucket 0 holds waits under a second, bucket b >= 1 those from
# WAIT_RATIO ** (b - 1) s up to WAIT_RATIO ** b s, through 30 days (bucket 155 ends at 30.2 days); the last one,
# WAIT_BUCKETS - 1, holds anything longer. Edges 10 % apart: a quantile read inside a bucket is within 10 %.
WAIT_RATIO = 1.1
WAIT_BUCKETS = math.ceil(math.log(30 * 86400) / math.log(WAIT_RATIO)) + 2


def wait_bucket(seconds: float) -> int:
    """The histogram bucket of a wait (s)."""
    if seconds < 1:
        return 0
    return min(WAIT_BUCKETS - 1, int(math.log(seconds) / math.log(WAIT_RATIO)) + 1)


def wait_bucket_edges(bucket: int) -> tuple[float, float | None]:
    """A bucket's lower and upper edge (s); None: the last bucket has no upper edge."""
    if bucket <= 0:
        return 0.0, 1.0
    upper = None if bucket >= WAIT_BUCKETS - 1 else WAIT_RATIO**bucket
    return WAIT_RATIO ** (bucket - 1), upper


def wait_quantile(counts: dict[int, int], q: float = 0.95) -> float | None:
    """The q-quantile (s) of the waits counted in `counts` (bucket -> jobs): the ceil(q n)-th smallest, placed
    inside its bucket by its rank there (geometrically: the edges are a ratio apart). None: no jobs."""
    n = sum(counts.values())
    if not n:
        return None
    rank, seen = max(1, math.ceil(q * n)), 0
    for bucket in sorted(counts):
        c = counts[bucket]
        if seen + c >= rank:
            low, high = wait_bucket_edges(bucket)
            if high is None:
                return low
            at = (rank - seen - 0.5) / c
            return low + (high - low) * at if bucket == 0 else low * (high / low) ** at
        seen += c
    return None  # pragma: no cover - the counts sum to n


WAIT_ROLLED_MARK = 0  # the team id of the row each hour rolled gets (no jobs): how far the roll has come


class WaitHour(models.Model):
    pk = models.CompositePrimaryKey("hour", "team_id", "bucket")
    hour = models.DateTimeField(help_text="The hour (UTC) the jobs started in, its start.")
    team_id = models.IntegerField(help_text="0: no team, the hour's mark that it was rolled (no jobs).")
    bucket = models.PositiveSmallIntegerField(help_text="The waits' bucket (wait_bucket: 10 % wide).")
    jobs = models.IntegerField(help_text="Jobs that started in the hour with a wait in the bucket.")
    wait_s_sum = models.FloatField(help_text="Their waits from submit to start, summed (s).")

    class Meta:
        db_table = "history_wait_hour"
        indexes = [models.Index(fields=["team_id", "hour"], name="wait_hour_team_hour")]

    def __str__(self) -> str:
        return f"team {self.team_id} at {self.hour:%Y-%m-%d %H}h, bucket {self.bucket}"


class GpuEvent(models.Model):
    at = models.DateTimeField(db_index=True)
    node_id = models.IntegerField()
    gpu_id = models.IntegerField(null=True)
    gpu_uuid = models.CharField(max_length=80)
    kind = models.CharField(max_length=10, help_text="xid or ecc")
    code = models.IntegerField(help_text="The XID number, or the ECC error count.")

    class Meta:
        db_table = "history_gpu_event"
        indexes = [models.Index(fields=["gpu_id", "at"], name="gpu_event_gpu_at")]

    def __str__(self) -> str:
        return f"{self.kind} {self.code} on {self.gpu_uuid} at {self.at:%Y-%m-%d %H:%M:%S}"

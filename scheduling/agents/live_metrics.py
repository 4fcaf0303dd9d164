"""The latest GPU sample of each node, as its agent last reported it.

Agents push a sample a second over their websocket; the agent consumer relays it to the browsers' streams and
keeps the newest one per node here: in Redis (one key per node, so every web process can answer the REST
cluster view), or in this process's memory when embedded (one process serves the agents and the API). Never in
the database: it is a gauge, not a record. A sample older than LIVE_METRICS_TTL_S is gone, so a silent node
shows no metrics rather than stale ones.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Iterable
from typing import Any

from asgiref.sync import sync_to_async

from scheduling.coordination import redis_client

log = logging.getLogger(__name__)

LIVE_METRICS_TTL_S = 30
# What a sample may carry per GPU, with its type; anything else an agent sends is dropped, and a value of the
# wrong type (or not finite) is kept as None.
GPU_FIELDS: dict[str, type] = {
    "index": int,
    "uuid": str,
    "util_pct": float,
    "mem_util_pct": float,
    "memory_used_mib": int,
    "memory_total_mib": int,
    "power_w": float,
    "temperature_c": int,
    "sm_clock_mhz": int,
    "ecc_uncorrected_volatile": int,
    "health": str,
}


def live_metrics_key(node_name: str) -> str:
    return f"tessera:live-metrics:{node_name}"


# Embedded mode: node name -> (expires at, monotonic s; the sample).
_local: dict[str, tuple[float, dict[str, Any]]] = {}


_INT_LIMIT = 2**53


def _as_str(value: Any) -> str | None:
    return value[:64] if type(value) is str else None


def _as_int(value: Any) -> int | None:
    kind = type(value)  # exact types, as JSON decodes them: a bool is neither
    if kind is int:
        return value if -_INT_LIMIT < value < _INT_LIMIT else None
    if kind is float and -_INT_LIMIT < value < _INT_LIMIT:  # NaN and the infinities fail the comparison
        return int(value)
    return None


def _as_float(value: Any) -> float | None:
    kind = type(value)
    if kind is float:
        return round(value, 2) if math.isfinite(value) else None
    if kind is int:
        try:
            return round(float(value), 2)
        except OverflowError:  # an int no float holds
            return None
    return None


_CONVERT = {str: _as_str, int: _as_int, float: _as_float}
_FIELD_CONVERTERS = tuple((name, _CONVERT[kind]) for name, kind in GPU_FIELDS.items())


def gpu_sample(raw: dict[str, Any]) -> dict[str, Any]:
    """One GPU of a sample, each field of GPU_FIELDS typed (None where missing, mistyped or not finite). At 1,000
    nodes this is 88,000 values a second through the agents' socket: per-type converters chosen once, where a
    generic check per value was a sixth of the socket's CPU (bench/agent_traffic.py)."""
    get = raw.get
    return {name: convert(get(name)) for name, convert in _FIELD_CONVERTERS}


# What a job's usage record reads of a sample (_usage_folded), and what ties a card to its jobs.
_USAGE_CONVERTERS = tuple(
    (name, convert)
    for name, convert in _FIELD_CONVERTERS
    if name in ("index", "uuid", "util_pct", "memory_used_mib")
)


def gpu_usage_sample(raw: dict[str, Any]) -> dict[str, Any]:
    """The fields of `gpu_sample` a job's usage needs, typed the same: for samples no browser is shown."""
    get = raw.get
    return {name: convert(get(name)) for name, convert in _USAGE_CONVERTERS}


def _store(node_name: str, sample: dict[str, Any]) -> None:
    r = redis_client()
    if r is None:
        _local[node_name] = (time.monotonic() + LIVE_METRICS_TTL_S, sample)
    else:
        r.set(live_metrics_key(node_name), json.dumps(sample), ex=LIVE_METRICS_TTL_S)


async def live_metrics_store(*, node_name: str, sampled_at: float | None, gpus: list[dict[str, Any]]) -> None:
    """Keep a node's newest sample. Best effort: a Redis outage costs the REST view its metrics, nothing else.
    Runs off the thread the consumers' database calls share, so a slow Redis never delays a heartbeat."""
    try:
        await sync_to_async(_store, thread_sensitive=False)(
            node_name, {"sampled_at": sampled_at, "gpus": gpus}
        )
    except Exception as exc:  # the relay to browsers must not stop because Redis is down
        log.warning("live metrics of %s not kept: %s", node_name, exc)


def _load(names: list[str]) -> dict[str, dict[str, Any]]:
    r = redis_client()
    if r is None:
        now = time.monotonic()
        return {n: kept[1] for n in names if (kept := _local.get(n)) and kept[0] > now}
    found = r.mget([live_metrics_key(n) for n in names]) if names else []
    return {n: json.loads(raw) for n, raw in zip(names, found, strict=True) if raw}


def live_metrics_for_nodes(*, node_names: Iterable[str]) -> dict[str, dict[int, dict[str, Any]]]:
    """node name -> GPU index -> that GPU's newest sample (with its `sampled_at`, Unix seconds)."""
    try:
        found = _load(list(node_names))
    except Exception as exc:
        log.warning("live metrics unavailable: %s", exc)
        return {}
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for name, sample in found.items():
        per_gpu = out.setdefault(name, {})
        for g in sample.get("gpus") or []:
            if isinstance(g.get("index"), int):
                per_gpu[g["index"]] = {**g, "sampled_at": sample.get("sampled_at")}
    return out


def live_utils_for_nodes(*, node_names: Iterable[str]) -> dict[str, list[float]]:
    """node name -> its GPUs' newest utilisation (percent), the cards that have one: what the cluster map's groups
    average, read without copying every card's sample (8,000 at 1,000 nodes)."""
    try:
        found = _load(list(node_names))
    except Exception as exc:
        log.warning("live metrics unavailable: %s", exc)
        return {}
    out: dict[str, list[float]] = {}
    for name, sample in found.items():
        by_index = {
            g.get("index"): g.get("util_pct")
            for g in sample.get("gpus") or []
            if isinstance(g.get("index"), int)
        }
        utils = [float(u) for u in by_index.values() if isinstance(u, int | float)]
        if utils:
            out[name] = utils
    return out


# --- Per job: utilisation now, since when it has been idle, and its peak GPU memory ----------------------------
# A job is idle while every card it holds is under IDLE_UTIL_PCT and their memory in use does not change; the
# portal shows it after IDLE_WARN_AFTER_S, and gives its cards back after its idle timeout (scheduling/cycle/idle.py). Kept
# JOB_USAGE_TTL_S after the last sample, so a finished job's page can still say what it used at its peak.
IDLE_UTIL_PCT = 5.0
IDLE_MEMORY_CHANGE_MIB = 64  # more than this between two samples is a change (NVML's figure jitters a little)
IDLE_WARN_AFTER_S = 600.0
JOB_USAGE_TTL_S = 7 * 24 * 3600


def job_usage_key(job_id: int) -> str:
    return f"tessera:job-usage:{job_id}"


_local_usage: dict[int, tuple[float, dict[str, Any]]] = {}


def _usage_load(job_ids: list[int]) -> dict[int, dict[str, Any]]:
    r = redis_client()
    if r is None:
        now = time.monotonic()
        return {j: kept[1] for j in job_ids if (kept := _local_usage.get(j)) and kept[0] > now}
    found = r.mget([job_usage_key(j) for j in job_ids]) if job_ids else []
    return {j: json.loads(raw) for j, raw in zip(job_ids, found, strict=True) if raw}


def _usage_note(job_id: int, at: float, gpus: list[dict[str, Any]], whole_cards: bool) -> None:
    usage = _usage_folded(_usage_load([job_id]).get(job_id), at, gpus, whole_cards)
    if usage is None:
        return
    r = redis_client()
    if r is None:
        _local_usage[job_id] = (time.monotonic() + JOB_USAGE_TTL_S, usage)
    else:
        r.set(job_usage_key(job_id), json.dumps(usage), ex=JOB_USAGE_TTL_S)


def _usage_folded(
    usage: dict[str, Any] | None, at: float, gpus: list[dict[str, Any]], whole_cards: bool
) -> dict[str, Any] | None:
    """A job's usage record with one more sample folded in (None: the sample says nothing of utilisation)."""
    utils = [g["util_pct"] for g in gpus if g.get("util_pct") is not None]
    if not utils:
        return None
    util = sum(utils) / len(utils)
    usage = usage or {"low_since": None, "peak_memory_mib": None}
    memory = [g["memory_used_mib"] for g in gpus if g.get("memory_used_mib") is not None]
    memory_mib = sum(memory) if memory else None
    # Idle: every card under IDLE_UTIL_PCT and its memory in use unchanged (a notebook loading data is not idle).
    moved = (
        memory_mib is not None
        and usage.get("memory_mib") is not None
        and abs(memory_mib - usage["memory_mib"]) > IDLE_MEMORY_CHANGE_MIB
    )
    if max(utils) < IDLE_UTIL_PCT and not moved:
        usage["low_since"] = usage.get("low_since") or at
    else:
        usage["low_since"] = None
    usage["memory_mib"] = memory_mib
    if whole_cards:
        used = [g["memory_used_mib"] for g in gpus if g.get("memory_used_mib") is not None]
        if used:
            usage["peak_memory_mib"] = max(max(used), usage.get("peak_memory_mib") or 0)
    usage.update({"util_pct": round(util, 1), "at": at})
    return usage


def _sample_keep(
    node_name: str,
    sample: dict[str, Any] | None,
    at: float,
    jobs: list[tuple[int, list[dict[str, Any]], bool]],
) -> None:
    """Embedded (no Redis): keep the sample (None: only its jobs' usage) and fold it into its jobs' usage in this
    process's memory."""
    if sample is not None:
        _store(node_name, sample)
    for job_id, gpus, whole_cards in jobs:
        _usage_note(job_id, at, gpus, whole_cards)


_Kept = tuple[str, dict[str, Any] | None, float, list[tuple[int, list[dict[str, Any]], bool]]]


def _samples_keep(batch: list[_Kept]) -> None:
    """Keep many nodes' samples and fold them into their jobs' usage records: two Redis round trips for the
    whole batch (each node's newest sample; each job's record read once, every sample of it folded in order)."""
    r = redis_client()
    if r is None:
        for kept in batch:
            _sample_keep(*kept)
        return
    job_ids = list(dict.fromkeys(job_id for *_, jobs in batch for job_id, _, _ in jobs))
    pipe = r.pipeline(transaction=False)
    newest: dict[str, dict[str, Any]] = {}
    for node_name, sample, _, _ in batch:
        if sample is not None:
            newest[node_name] = sample  # a node's later sample replaces its earlier one: one write each
    for node_name, sample in newest.items():
        pipe.set(live_metrics_key(node_name), json.dumps(sample), ex=LIVE_METRICS_TTL_S)
    if job_ids:
        pipe.mget([job_usage_key(j) for j in job_ids])
    replies = pipe.execute()
    if not job_ids:
        return
    usage: dict[int, dict[str, Any] | None] = {
        j: json.loads(raw) if raw else None for j, raw in zip(job_ids, replies[-1], strict=True)
    }
    changed: set[int] = set()
    for _, _, at, jobs in batch:
        for job_id, gpus, whole_cards in jobs:
            folded = _usage_folded(usage[job_id], at, gpus, whole_cards)
            if folded is not None:
                usage[job_id] = folded
                changed.add(job_id)
    pipe = r.pipeline(transaction=False)
    for job_id in changed:
        pipe.set(job_usage_key(job_id), json.dumps(usage[job_id]), ex=JOB_USAGE_TTL_S)
    pipe.execute()


class _SampleBatch:
    """Samples waiting to be kept, written together every SAMPLE_FLUSH_S by one task of the running event loop:
    one thread hop and two Redis round trips a flush for every node of the process, where one of each per sample
    was most of the agents' socket's CPU at 1,000 nodes (bench/cluster_scale.py)."""

    def __init__(self) -> None:
        self.waiting: list[_Kept] = []
        self.task: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def add(self, kept: _Kept) -> None:
        self.waiting.append(kept)
        loop = asyncio.get_running_loop()
        # A flusher of another (ended) loop never runs again: this loop's takes over what waits.
        if self.task is None or self.task.done() or self.loop is not loop:
            self.loop, self.task = loop, loop.create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        await asyncio.sleep(SAMPLE_FLUSH_S)
        batch, self.waiting = self.waiting, []
        try:
            await sync_to_async(_samples_keep, thread_sensitive=False)(batch)
        except Exception as exc:  # the relay to browsers must not stop because Redis is down
            log.warning("live metrics of %d nodes not kept: %s", len({b[0] for b in batch}), exc)


SAMPLE_FLUSH_S = 0.25
_batch = _SampleBatch()


async def node_sample_keep(
    *,
    node_name: str,
    sampled_at: float | None,
    gpus: list[dict[str, Any]],
    jobs: list[tuple[int, list[dict[str, Any]], bool]],
    live: bool = True,
) -> None:
    """Keep a node's newest sample (`live`; False: an older sample of a batch, folded into its jobs' usage only)
    and fold it into each of its jobs' usage records (job id, the job's cards, whether it holds them alone). With
    Redis it is written within SAMPLE_FLUSH_S, batched with the other nodes' samples (_SampleBatch); embedded, at
    once."""
    kept = (node_name, {"sampled_at": sampled_at, "gpus": gpus} if live else None, time.time(), jobs)
    if redis_client() is None:
        _sample_keep(*kept)
        return
    _batch.add(kept)


async def job_usage_note(*, job_id: int, gpus: list[dict[str, Any]], whole_cards: bool) -> None:
    """Fold one sample of the cards a job holds into its usage record. `whole_cards`: the job is the only holder
    of those cards, so their memory in use is its own (on a shared card NVML cannot tell whose it is)."""
    try:
        await sync_to_async(_usage_note, thread_sensitive=False)(job_id, time.time(), gpus, whole_cards)
    except Exception as exc:
        log.warning("usage of job %s not kept: %s", job_id, exc)


def job_usage(*, job_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """job id -> {"util_pct": mean utilisation of its cards now, "idle_s": seconds every card has been under
    IDLE_UTIL_PCT (0 when busy), "idle_warning": idle for IDLE_WARN_AFTER_S or more, "peak_memory_mib": its
    peak on whole cards (None on shared cards), "fresh": sampled within LIVE_METRICS_TTL_S}."""
    try:
        found = _usage_load(list(job_ids))
    except Exception as exc:
        log.warning("job usage unavailable: %s", exc)
        return {}
    now = time.time()
    out = {}
    for job_id, usage in found.items():
        low_since = usage.get("low_since")
        idle_s = max(0.0, now - low_since) if low_since else 0.0
        out[job_id] = {
            "util_pct": usage.get("util_pct"),
            "idle_s": idle_s,
            "idle_warning": idle_s >= IDLE_WARN_AFTER_S,
            "peak_memory_mib": usage.get("peak_memory_mib"),
            "fresh": now - float(usage.get("at") or 0) <= LIVE_METRICS_TTL_S,
        }
    return out

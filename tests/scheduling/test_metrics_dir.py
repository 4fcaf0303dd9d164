"""Containers sharing one metrics volume (scheduling/observability/metrics_dir.py): a directory each, its counters
kept across restarts, the directories of containers that are gone folded into an archive, and /metrics summing
them all, never down. Real processes hold
the locks, as the containers' pid-1 processes do."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scheduling.observability.metrics_dir import SharedDirCollector, claim, prune_gone

REPO = Path(__file__).resolve().parents[2]
ENTRY = [sys.executable, "-m", "scheduling.observability.metrics_dir", "--"]


# Counts one request as a container's pid 1 does (every container writes counter_1.db), says where it writes, then
# lives (holding its directory's lock) until its stdin closes.
COUNT_AND_WAIT = (
    "import os, sys; from prometheus_client import Counter, values; "
    "values.ValueClass = values.MultiProcessValue(lambda: 1); "
    "Counter('tessera_test_requests', 'x').inc(); "
    "print(os.environ['PROMETHEUS_MULTIPROC_DIR'], flush=True); sys.stdin.read()"
)


def _summed(shared: Path) -> float:
    registry = CollectorRegistry()
    registry.register(SharedDirCollector(shared))
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        if family.name == "tessera_test_requests":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return 0.0


def _running(shared: Path, name: str) -> subprocess.Popen:
    env = {**os.environ, "TESSERA_METRICS_SHARED_DIR": str(shared), "TESSERA_METRICS_NAME": name}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    p = subprocess.Popen(
        [*ENTRY, sys.executable, "-c", COUNT_AND_WAIT],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout.readline().strip() == str(shared / name)
    return p


def _stop(p: subprocess.Popen) -> None:
    p.stdin.close()
    p.wait(timeout=30)


def test_each_container_writes_its_own_directory_and_metrics_sums_them_all(tmp_path):
    web, worker = _running(tmp_path, "web-1"), _running(tmp_path, "worker-1")
    try:
        assert sorted(p.name for p in tmp_path.iterdir()) == ["web-1", "worker-1"]
        assert (tmp_path / "web-1" / "counter_1.db").exists() and (
            tmp_path / "worker-1" / "counter_1.db"
        ).exists()
        assert _summed(tmp_path) == 2
    finally:
        _stop(web)
        _stop(worker)


def test_a_restarted_container_counts_on_from_its_last_run_never_down(tmp_path):
    _stop(_running(tmp_path, "web-1"))  # its previous run counted one request, as pid 1
    assert _summed(tmp_path) == 1
    (tmp_path / "web-1" / "gauge_livesum_1.db").write_bytes(b"")  # a gauge of the last run's process
    web = _running(tmp_path, "web-1")  # restarted: pid 1 again, the same file name
    try:
        # A sum that went back to 1 would read to Prometheus as a reset, and the total as new increase.
        assert _summed(tmp_path) == 2
        assert not (tmp_path / "web-1" / "gauge_livesum_1.db").exists()
    finally:
        _stop(web)


def test_a_starting_container_removes_the_directories_of_gone_ones_and_keeps_the_live_ones(tmp_path):
    live = _running(tmp_path, "worker-live")
    gone = _running(tmp_path, "web-old")
    _stop(gone)  # its container was removed: nobody holds its lock any more
    old_unowned = tmp_path / "from-before-owner-files"
    old_unowned.mkdir()
    os.utime(old_unowned, (time.time() - 3600, time.time() - 3600))
    try:
        assert sorted(prune_gone(tmp_path, keep="web-new")) == ["from-before-owner-files", "web-old"]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["_archive", "worker-live"]
        assert _summed(tmp_path) == 2, (
            "the gone container's count is kept in the archive: the sum never drops"
        )
        assert prune_gone(tmp_path, keep="web-new") == [] and _summed(tmp_path) == 2
    finally:
        _stop(live)


def test_two_live_containers_with_one_name_are_refused(tmp_path):
    first = _running(tmp_path, "web-1")
    try:
        try:
            claim(tmp_path, name="web-1", attempts=3)
        except RuntimeError as exc:
            assert "another running container" in str(exc)
        else:
            raise AssertionError("a second claim of a held directory succeeded")
    finally:
        _stop(first)


def test_without_a_shared_dir_the_entrypoint_only_runs_the_command(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TESSERA_METRICS_SHARED_DIR", "PROMETHEUS_MULTIPROC_DIR")
    }
    out = subprocess.run(
        [
            *ENTRY,
            sys.executable,
            "-c",
            "import os; print(os.environ.get('PROMETHEUS_MULTIPROC_DIR', 'unset'))",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (out.returncode, out.stdout.strip()) == (0, "unset"), out.stderr

"""The event counters' files when several containers share one metrics volume: a directory per container, and
/metrics summing them all, so that every counter only ever grows.

prometheus-client's multiprocess mode names each process's file by its pid. Containers have pid namespaces of
their own, so web's daphne and the worker's Celery are both pid 1: sharing one directory they would write the same
`counter_1.db`. So the image's entrypoint (`python -m scheduling.observability.metrics_dir -- CMD...`) gives each
container, when TESSERA_METRICS_SHARED_DIR is set, `PROMETHEUS_MULTIPROC_DIR=<shared>/<hostname>`, and holds an
exclusive flock on its `.owner` file for as long as the container's process lives (the descriptor is inherited
across exec). A restarted container keeps its counters' files (its new pid 1 counts on from them: a sum that
dropped would read to Prometheus as a reset, and the rest of the total as new increase) and drops only its gauges'.
A starting container folds the counters of containers that are gone (nobody holds their lock) into `_archive/`
and removes their directories, so the volume does not collect a directory for every container ever started and
the sums never go down. `/metrics` then sums `<shared>/*/*.db` (`SharedDirCollector`).

Health checks run with `docker exec` never pass through the entrypoint: without PROMETHEUS_MULTIPROC_DIR their
counters live in memory and write nothing to the volume.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

SHARED_DIR_ENV = "TESSERA_METRICS_SHARED_DIR"
NAME_ENV = "TESSERA_METRICS_NAME"
OWNER = ".owner"
ARCHIVE = "_archive"  # the summed counters of containers that are gone
# Files whose values only grow (their samples summed across files); a gauge's value is its process's alone.
_COUNTING = ("counter_", "histogram_", "summary_")
# A directory without an owner file younger than this may be a container between its mkdir and its lock.
_UNOWNED_GRACE_S = 60.0


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _fold_into_archive(shared: Path, gone: Path) -> None:
    """Add a gone container's counting samples to the archive's, one file per kind, under the archive's lock."""
    archive = shared / ARCHIVE
    archive.mkdir(exist_ok=True)
    lock = os.open(archive / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for path in sorted(gone.glob("*.db")):
            kind = path.name.split("_", 1)[0]
            if not path.name.startswith(_COUNTING):
                continue
            into = MmapedDict(str(archive / f"{kind}_0.db"))
            try:
                for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(str(path)):
                    before, _ = into.read_value(key)
                    into.write_value(key, before + value, timestamp)
            finally:
                into.close()
    finally:
        os.close(lock)


def prune_gone(shared: Path, *, keep: str) -> list[str]:
    """Remove the directories of containers no longer running (their owner lock is free), their counters kept in
    the archive; the names removed."""
    removed = []
    for d in sorted(p for p in shared.iterdir() if p.is_dir() and p.name not in (keep, ARCHIVE)):
        owner = d / OWNER
        try:
            fd = os.open(owner, os.O_RDWR)
        except FileNotFoundError:
            if time.time() - d.stat().st_mtime > _UNOWNED_GRACE_S:
                _remove(d)  # written before owner files, or by a process that died before locking
                removed.append(d.name)
            continue
        try:
            if _try_lock(fd):
                _fold_into_archive(shared, d)
                _remove(d)  # removed while we hold its lock: an owner arriving now sees its inode gone
                removed.append(d.name)
        finally:
            os.close(fd)
    return removed


def claim(shared: Path, *, name: str, attempts: int = 50) -> tuple[Path, int]:
    """This container's directory under `shared`, locked (the returned descriptor holds the lock), its gauges'
    files removed and its counters' kept."""
    shared.mkdir(parents=True, exist_ok=True)
    prune_gone(shared, keep=name)
    own = shared / name
    for _ in range(attempts):
        own.mkdir(exist_ok=True)
        try:
            fd = os.open(own / OWNER, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            continue  # pruned between our mkdir and open
        if not _try_lock(fd):
            os.close(fd)
            time.sleep(0.1)  # another container's prune holds it for a moment, or a live twin (below)
            continue
        try:
            same = os.stat(own / OWNER).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # a prune removed it while we waited: take the new one
            os.close(fd)
            continue
        for path in own.iterdir():
            if path.name != OWNER and not path.name.startswith(_COUNTING):
                _remove(path)  # gauges are their process's own; counters count on from the last run
        return own, fd
    raise RuntimeError(
        f"{own} stays locked: another running container writes its metrics there (two containers with the "
        f"hostname {name!r}? set {NAME_ENV} to tell them apart)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The image's entrypoint: claim this container's metrics directory (when the shared one is set), then exec
    the command, which keeps the lock for its lifetime."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m scheduling.observability.metrics_dir -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    shared = os.environ.get(SHARED_DIR_ENV)
    if shared:
        own, fd = claim(Path(shared), name=os.environ.get(NAME_ENV) or socket.gethostname())
        os.set_inheritable(fd, True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(own)
    os.execvp(args[0], args)
    return 127  # not reached: execvp raises when it cannot run the command


class SharedDirCollector(Collector):
    """The event counters of every container sharing `shared` (one subdirectory each), summed."""

    def __init__(self, shared: str | Path) -> None:
        self.shared = Path(shared)

    def collect(self) -> Iterator:
        for _ in range(3):
            files = sorted(str(p) for p in self.shared.glob("*/*.db"))
            try:
                return iter(MultiProcessCollector.merge(files, accumulate=True))
            except FileNotFoundError:
                continue  # a gone container's directory was pruned while we read: read again
        return iter(MultiProcessCollector.merge(sorted(str(p) for p in self.shared.glob("*/*.db"))))


if __name__ == "__main__":
    sys.exit(main())

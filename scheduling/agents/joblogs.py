"""Where the portal keeps job logs that agents ship: one append-only file per job and stream.

Agents send log chunks with their job status reports; whoever receives them calls `log_append`. The API reads
through `log_read` and `log_tail`, so the storage can change (object store, database) behind these functions.
Files live under settings.TESSERA_LOG_DIR (default: var/logs)/<job_id>/<stream>.log. They are tenant data: each
file is the portal's alone (0600) in directories only the portal may enter (0700), so a job running on the same
host as the portal, under any other uid, reads no team's output.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

STREAMS = ("stdout", "stderr")
MAX_READ_BYTES = 1024 * 1024


def _log_dir() -> Path:
    configured = getattr(settings, "TESSERA_LOG_DIR", None)
    return Path(configured) if configured else Path(settings.VAR_DIR) / "logs"


def log_path(*, job_id: int, stream: str) -> Path:
    if stream not in STREAMS:
        raise ValueError(f"stream must be one of {', '.join(STREAMS)}")
    return _log_dir() / str(int(job_id)) / f"{stream}.log"


PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


_private_roots: set[Path] = set()  # log roots this process has made the portal's alone


def _job_dir(job_id: int) -> Path:
    """The job's log directory, made the portal's alone. The log root is made 0700 once per process, whoever
    made it (an image's 0755, logs kept from before they were private): nothing under it is reachable then."""
    root = _log_dir()
    if root not in _private_roots:
        root.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        root.chmod(PRIVATE_DIR)
        _private_roots.add(root)
    path = root / str(int(job_id))
    path.mkdir(mode=PRIVATE_DIR, exist_ok=True)
    return path


def _open_private(path: Path, flags: int):
    """A file of the job's log directory, created 0600 whatever the process's umask."""
    fd = os.open(path, flags | os.O_CREAT, PRIVATE_FILE)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, PRIVATE_FILE)  # made before logs were private
    except OSError:
        os.close(fd)
        raise
    return fd


def log_append(*, job_id: int, stream: str, data: bytes | str, offset: int | None = None) -> int:
    """Append a chunk; returns the new size. With `offset` (where the agent says the chunk starts), a chunk
    already stored (a resend after a reconnect) is skipped and an overlapping one is trimmed."""
    path = log_path(job_id=job_id, stream=stream)
    _job_dir(job_id)
    chunk = data.encode() if isinstance(data, str) else data
    with os.fdopen(_open_private(path, os.O_WRONLY | os.O_APPEND), "ab") as out:
        out.seek(0, os.SEEK_END)
        size = out.tell()
        if offset is not None:
            if offset + len(chunk) <= size:
                return size
            if offset < size:
                chunk = chunk[size - offset :]
        out.write(chunk)
        return size + len(chunk)


def log_marker_write(*, job_id: int, stream: str, name: str, text: str) -> None:
    """A small private file beside the job's log (`<stream>.<name>`), e.g. where an attempt's log starts."""
    path = log_path(job_id=job_id, stream=stream).with_suffix(f".{name}")
    _job_dir(job_id)
    with os.fdopen(_open_private(path, os.O_WRONLY | os.O_TRUNC), "w") as out:
        out.write(text)


def log_size(*, job_id: int, stream: str) -> int:
    try:
        return log_path(job_id=job_id, stream=stream).stat().st_size
    except FileNotFoundError:
        return 0


def log_read(
    *, job_id: int, stream: str, offset: int = 0, limit_bytes: int = MAX_READ_BYTES
) -> tuple[bytes, int]:
    """Bytes from offset (at most limit_bytes) and the log's current size."""
    path = log_path(job_id=job_id, stream=stream)
    try:
        with open(path, "rb") as log:
            size = os.fstat(log.fileno()).st_size
            log.seek(min(max(0, offset), size))
            return log.read(max(0, min(limit_bytes, MAX_READ_BYTES))), size
    except FileNotFoundError:
        return b"", 0


def log_tail(*, job_id: int, stream: str, lines: int = 100, max_bytes: int = 256 * 1024) -> tuple[bytes, int]:
    """The last `lines` lines (reading at most max_bytes from the end) and the log's size."""
    path = log_path(job_id=job_id, stream=stream)
    try:
        with open(path, "rb") as log:
            size = os.fstat(log.fileno()).st_size
            start = max(0, size - max_bytes)
            log.seek(start)
            data = log.read()
    except FileNotFoundError:
        return b"", 0
    parts = data.split(b"\n")
    if start > 0:
        parts = parts[1:]  # the first piece may be half a line
    trailing = parts and parts[-1] == b""
    body = parts[:-1] if trailing else parts
    kept = body[-lines:] if lines > 0 else []
    return b"\n".join(kept) + (b"\n" if trailing and kept else b""), size

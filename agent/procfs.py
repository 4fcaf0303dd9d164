"""Reading /proc: process identity (start time, command line), group and session, liveness."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    pgrp: int
    session: int
    start_ticks: int


def read_stat(pid: int, proc_root: Path = PROC) -> ProcStat | None:
    try:
        raw = (proc_root / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    try:
        return ProcStat(pid, fields[0], int(fields[2]), int(fields[3]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def read_cmdline(pid: int, proc_root: Path = PROC) -> list[str] | None:
    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]


def is_same_process(pid: int, start_ticks: int | None, proc_root: Path = PROC) -> bool:
    """True while `pid` is alive (not a zombie) and is the process that started at start_ticks."""
    st = read_stat(pid, proc_root)
    if st is None or st.state in ("Z", "X"):
        return False
    return start_ticks is None or st.start_ticks == start_ticks


def group_members(pgid: int, proc_root: Path = PROC) -> list[int]:
    """Live processes whose process group is pgid (a job's stragglers after its first process ended)."""
    members = []
    for entry in proc_root.iterdir():
        if entry.name.isdigit():
            st = read_stat(int(entry.name), proc_root)
            if st is not None and st.pgrp == pgid and st.state not in ("Z", "X"):
                members.append(st.pid)
    return members


def find_by_env(marker: str, proc_root: Path = PROC) -> list[int]:
    """Pids whose environment holds the exact `NAME=value` marker (only our own processes are readable)."""
    needle = marker.encode()
    found = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def listening_inodes(port: int, proc_root: Path = PROC) -> set[int]:
    """The inodes of the TCP sockets listening on `port` on this host (IPv4 and IPv6), from /proc/net/tcp*."""
    inodes: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc_root / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":  # 0A: LISTEN
                continue
            try:
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(int(fields[9]))
            except (IndexError, ValueError):
                continue
    return inodes


def holds_socket(pids: list[int], inodes: set[int], proc_root: Path = PROC) -> bool | None:
    """Whether one of these processes holds one of these sockets; None when their descriptors cannot be read (a
    job of another user, where the reader is not root)."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    readable = False
    for pid in pids:
        fd_dir = proc_root / str(pid) / "fd"
        try:
            fds = list(fd_dir.iterdir())
        except PermissionError:
            continue
        except OSError:
            continue
        readable = True
        for fd in fds:
            try:
                if str(fd.readlink()) in wanted:
                    return True
            except OSError:
                continue
    return False if readable or not pids else None

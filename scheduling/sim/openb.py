"""Loaders for the openb trace (Alibaba cluster-trace-gpu-v2023): the GPU node list and the pod lists.

Rows are validated as they are read; a malformed row raises `TraceError` naming the file, the row and the column.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
# The minimal pod columns; the full lists add gpu_spec, qos, phase and timestamps (multigpu20 has only these five).
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
MAX_GPU_MILLI = 1000


class TraceError(ValueError):
    """A trace file that cannot be read as the openb format; the message names file, row and column."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # share of ONE GPU for num_gpu == 1; whole GPUs (1000) when num_gpu > 1
    gpu_spec: tuple[str, ...] = ()  # allowed GPU models; empty = any
    qos: str = ""
    creation_time_s: int | None = None
    deletion_time_s: int | None = None
    scheduled_time_s: int | None = None

    @property
    def gpu_milli_total(self) -> int:
        """GPU asked for in milli-GPU: the slice, or 1000 per whole GPU."""
        return self.num_gpu * self.gpu_milli

    @property
    def class_key(self) -> tuple[int, int, int, tuple[str, ...]]:
        """The pod class of the published fragmentation measure: (cpu_milli, gpu_milli, num_gpu, gpu_spec)."""
        return (self.cpu_milli, self.gpu_milli, self.num_gpu, self.gpu_spec)


def _int(path: Path, row_no: int, column: str, raw: str | None, *, minimum: int = 0) -> int:
    if raw is None or raw.strip() == "":
        raise TraceError(f"{path}: row {row_no}: column '{column}' is empty")
    try:
        value = int(raw.strip())
    except ValueError:
        try:
            as_float = float(raw.strip())
        except ValueError:
            raise TraceError(f"{path}: row {row_no}: column '{column}' is not a number: {raw!r}") from None
        if not as_float.is_integer():
            raise TraceError(f"{path}: row {row_no}: column '{column}' is not an integer: {raw!r}") from None
        value = int(as_float)
    if value < minimum:
        raise TraceError(f"{path}: row {row_no}: column '{column}' must be >= {minimum}, got {value}")
    return value


def _optional_int(path: Path, row_no: int, column: str, raw: str | None) -> int | None:
    if raw is None or raw.strip() == "":
        return None
    return _int(path, row_no, column, raw)


def _rows(path: Path, required: tuple[str, ...]):
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [column for column in required if column not in header]
        if missing:
            raise TraceError(
                f"{path}: header lacks column(s) {', '.join(missing)} (found: {', '.join(header)})"
            )
        # Row numbers count the header as row 1, as a spreadsheet would show them.
        for row_no, row in enumerate(reader, start=2):
            if None in row:
                raise TraceError(f"{path}: row {row_no}: more fields than the header has columns")
            short = [column for column in required if row.get(column) is None]
            if short:
                raise TraceError(f"{path}: row {row_no}: column '{short[0]}' is missing (row too short)")
            yield row_no, row


def load_nodes(path: str | Path) -> list[TraceNode]:
    """The node list: one `TraceNode` per row, in file order."""
    path = Path(path)
    nodes: list[TraceNode] = []
    seen: set[str] = set()
    for row_no, row in _rows(path, NODE_COLUMNS):
        name = row["sn"].strip()
        if not name:
            raise TraceError(f"{path}: row {row_no}: column 'sn' is empty")
        if name in seen:
            raise TraceError(f"{path}: row {row_no}: column 'sn' repeats node {name!r}")
        seen.add(name)
        gpus = _int(path, row_no, "gpu", row["gpu"])
        model = row["model"].strip()
        if gpus > 0 and not model:
            raise TraceError(f"{path}: row {row_no}: column 'model' is empty for a node with {gpus} GPUs")
        nodes.append(
            TraceNode(
                name=name,
                cpu_milli=_int(path, row_no, "cpu_milli", row["cpu_milli"]),
                memory_mib=_int(path, row_no, "memory_mib", row["memory_mib"]),
                gpus=gpus,
                model=model,
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes


def load_pods(path: str | Path) -> list[TracePod]:
    """A pod list: one `TracePod` per row, in file order. Optional columns may be absent (multigpu20)."""
    path = Path(path)
    pods: list[TracePod] = []
    for row_no, row in _rows(path, POD_COLUMNS):
        name = row["name"].strip()
        if not name:
            raise TraceError(f"{path}: row {row_no}: column 'name' is empty")
        num_gpu = _int(path, row_no, "num_gpu", row["num_gpu"])
        gpu_milli = _int(path, row_no, "gpu_milli", row["gpu_milli"])
        if gpu_milli > MAX_GPU_MILLI:
            raise TraceError(
                f"{path}: row {row_no}: column 'gpu_milli' must be <= {MAX_GPU_MILLI}, got {gpu_milli}"
            )
        if num_gpu > 0 and gpu_milli == 0:
            raise TraceError(
                f"{path}: row {row_no}: column 'gpu_milli' is 0 for a pod asking {num_gpu} GPU(s)"
            )
        if num_gpu > 1 and gpu_milli != MAX_GPU_MILLI:
            raise TraceError(
                f"{path}: row {row_no}: column 'gpu_milli' must be {MAX_GPU_MILLI} for a pod of {num_gpu} GPUs"
            )
        if num_gpu == 0:
            gpu_milli = 0
        spec_raw = (row.get("gpu_spec") or "").strip()
        gpu_spec = tuple(sorted(part.strip() for part in spec_raw.split("|") if part.strip()))
        pods.append(
            TracePod(
                name=name,
                cpu_milli=_int(path, row_no, "cpu_milli", row["cpu_milli"]),
                memory_mib=_int(path, row_no, "memory_mib", row["memory_mib"]),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                gpu_spec=gpu_spec,
                qos=(row.get("qos") or "").strip(),
                creation_time_s=_optional_int(path, row_no, "creation_time", row.get("creation_time")),
                deletion_time_s=_optional_int(path, row_no, "deletion_time", row.get("deletion_time")),
                scheduled_time_s=_optional_int(path, row_no, "scheduled_time", row.get("scheduled_time")),
            )
        )
    if not pods:
        raise TraceError(f"{path}: no pods")
    return pods

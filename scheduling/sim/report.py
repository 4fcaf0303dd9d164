"""Reports of simulated runs: JSON, CSV and PNG plots (matplotlib, Agg backend, no display needed).

`python -m scheduling.sim.report docs` regenerates the images docs/simulator.md links (docs/img/).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from scheduling.sim.des import SimResult
from scheduling.sim.metrics import job_rows, series_rows
from scheduling.sim.runs import run_scenario

# One colour per policy, in order, readable in print and by colour-blind readers (Okabe-Ito).
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def plots_available() -> bool:
    """Whether matplotlib is installed (the `sim` extra): without it reports are JSON and CSV only."""
    return importlib.util.find_spec("matplotlib") is not None


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_json(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    return path


def write_csv(path: Path, rows: Sequence[Mapping[str, object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        if not rows:
            fh.write("")
            return path
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _hours(result: SimResult) -> bool:
    return result.end_s - result.start_s <= 14 * 86400


def _binned(result: SimResult, value, bins: int = 240) -> tuple[list[float], list[float], str]:
    """Time-weighted averages of a step series over equal bins: one point per bin, so instants between a
    completion and the next cycle do not draw as spikes. Returns (bin centres, averages, axis label)."""
    series = result.series
    start, end = result.start_s, max(result.end_s, result.start_s + 1e-9)
    width = (end - start) / bins
    sums = [0.0] * bins
    for k, p in enumerate(series):
        t0 = max(start, p.time_s)
        t1 = min(end, series[k + 1].time_s if k + 1 < len(series) else end)
        v = value(p)
        while t1 > t0:
            b = min(bins - 1, int((t0 - start) / width))
            edge = min(t1, start + (b + 1) * width)
            sums[b] += v * (edge - t0)
            t0 = edge if edge > t0 else t1
    scale, label = (3600, "time (h)") if _hours(result) else (86400, "time (days)")
    xs = [(start + (b + 0.5) * width) / scale for b in range(bins)]
    return xs, [x / width for x in sums], label


def plot_utilization(results: Mapping[str, SimResult], path: Path, *, title: str = "") -> Path:
    """Utilization (solid) and allocation (dashed) over time, one colour per policy (averages over short bins)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=90)
    label = "time"
    for i, (name, r) in enumerate(results.items()):
        cap = max(1, r.capacity_milli)
        c = COLOURS[i % len(COLOURS)]
        xs, used, label = _binned(r, lambda p, cap=cap: 100 * p.used_milli / cap)
        _, alloc, _ = _binned(r, lambda p, cap=cap: 100 * p.allocated_milli / cap)
        ax.plot(xs, used, color=c, label=f"{name}: utilization")
        ax.plot(xs, alloc, color=c, ls="--", lw=1, label=f"{name}: allocation")
    ax.set_xlabel(label)
    ax.set_ylabel("% of GPU capacity")
    ax.set_ylim(0, 105)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title or "GPU utilization and allocation over time", fontsize=10)
    return _save(fig, path)


def plot_queue(results: Mapping[str, SimResult], path: Path, *, title: str = "") -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=90)
    label = "time"
    for i, (name, r) in enumerate(results.items()):
        xs, queue, label = _binned(r, lambda p: p.queue_len)
        ax.plot(xs, queue, color=COLOURS[i % len(COLOURS)], label=name)
    ax.set_xlabel(label)
    ax.set_ylabel("jobs waiting (average)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "Queue length over time", fontsize=10)
    return _save(fig, path)


def plot_wait_by_team(results: Mapping[str, SimResult], path: Path, *, title: str = "") -> Path:
    """Box plots of queue wait per team, policies side by side (minutes)."""
    plt = _plt()
    teams = sorted({r.spec.team for res in results.values() for r in res.jobs})
    n = max(1, len(results))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(teams) * n / 2 + 2), 3.6), dpi=90)
    width = 0.8 / n
    for i, (name, res) in enumerate(results.items()):
        data = []
        for team in teams:
            waits = [r.wait_s / 60 for r in res.jobs if r.spec.team == team and r.wait_s is not None]
            data.append(waits or [0.0])
        pos = [k + (i - (n - 1) / 2) * width for k in range(len(teams))]
        bp = ax.boxplot(
            data,
            positions=pos,
            widths=width * 0.9,
            patch_artist=True,
            showfliers=True,
            medianprops={"color": "black"},
        )
        c = COLOURS[i % len(COLOURS)]
        for box in bp["boxes"]:
            box.set(facecolor=c, alpha=0.5)
        for flier in bp["fliers"]:
            flier.set(marker=".", markersize=3, markeredgecolor=c)
        ax.plot([], [], color=c, lw=6, alpha=0.5, label=name)
    ax.set_xticks(range(len(teams)))
    ax.set_xticklabels(teams, fontsize=8)
    ax.set_ylabel("queue wait (min)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    ax.set_title(title or "Queue wait per team", fontsize=10)
    return _save(fig, path)


def plot_alloc_vs_arrival(static_results: Mapping[str, Mapping], path: Path, *, title: str = "") -> Path:
    """Static packing: allocation % against arrival % per policy, from `tessera simulate static --json` output."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4), dpi=90)
    ax.plot([0, 130], [0, 130], color="grey", lw=0.8, ls=":", label="everything allocated")
    for i, (name, data) in enumerate(static_results.items()):
        curve = {int(k): float(v) for k, v in data.get("alloc_curve", {}).items()}
        xs = sorted(curve)
        label = name
        if "unallocated_pct_at_100" in data:
            label = f"{name} ({float(data['unallocated_pct_at_100']):.2f}% unallocated at 100%)"
        ax.plot(xs, [curve[x] for x in xs], color=COLOURS[i % len(COLOURS)], lw=1.4, label=label)
    ax.axvline(100, color="grey", lw=0.6)
    ax.set_xlim(60, 130)
    ax.set_ylim(60, 100)
    ax.set_xlabel("arrived GPU requests (% of capacity)")
    ax.set_ylabel("allocated GPU (% of capacity)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title or "Static packing: allocation vs arrival", fontsize=10)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=fig.dpi)
    _plt().close(fig)
    return path


def load_static_results(paths: Sequence[Path]) -> dict[str, dict]:
    """Static JSON outputs keyed by policy; a file may hold one result or a list/mapping of them."""
    out: dict[str, dict] = {}
    for p in paths:
        data = json.loads(Path(p).read_text())
        items = (
            data if isinstance(data, list) else data.get("results", [data]) if isinstance(data, dict) else []
        )
        if isinstance(items, dict):
            items = list(items.values())
        for item in items:
            if isinstance(item, dict) and "alloc_curve" in item:
                out[str(item.get("policy", Path(p).stem))] = item
    return out


def write_run_report(
    out_dir: Path, name: str, results: Mapping[str, SimResult], summary: Mapping, *, plots: bool = True
) -> list[Path]:
    """The JSON summary, per-policy CSVs (jobs, time series) and the three dynamic plots under out_dir/name/."""
    base = out_dir / name
    files = [write_json(base / "summary.json", summary)]
    for policy, r in results.items():
        files.append(write_csv(base / f"{policy}-jobs.csv", job_rows(r)))
        files.append(write_csv(base / f"{policy}-series.csv", series_rows(r)))
    if plots and not plots_available():
        print("no plots: matplotlib is not installed (pip install 'tessera[sim]')", file=sys.stderr)
    elif plots:
        files.append(
            plot_utilization(results, base / "utilization.png", title=f"{name}: utilization over time")
        )
        files.append(plot_queue(results, base / "queue.png", title=f"{name}: queue length"))
        files.append(
            plot_wait_by_team(results, base / "wait-by-team.png", title=f"{name}: queue wait per team")
        )
    return files


def docs_images(out_dir: Path = DOCS_IMG, static_json: Sequence[Path] = ()) -> list[Path]:
    """The images docs/simulator.md links: the seed case's plots, and the static curves when given their JSON."""
    scenario, results, _ = run_scenario("seed-case", progress=False)
    files = [
        plot_utilization(
            results, out_dir / "seed-case-utilization.png", title="seed case: utilization over the day"
        ),
        plot_queue(results, out_dir / "seed-case-queue.png", title="seed case: queue length"),
        plot_wait_by_team(
            results, out_dir / "seed-case-wait-by-team.png", title="seed case: queue wait per team"
        ),
    ]
    if static_json:
        files.append(
            plot_alloc_vs_arrival(
                load_static_results(static_json),
                out_dir / "openb-default-alloc-vs-arrival.png",
                title="openb default: allocation vs arrival (mean of seeds)",
            )
        )
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduling.sim.report", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("docs", help="regenerate the images docs/simulator.md links")
    d.add_argument("--out", type=Path, default=DOCS_IMG)
    d.add_argument("--static", type=Path, nargs="*", default=[], help="static --json outputs to plot")
    s = sub.add_parser("static", help="plot allocation vs arrival from static --json outputs")
    s.add_argument("files", type=Path, nargs="+")
    s.add_argument("--out", type=Path, default=Path("reports/alloc-vs-arrival.png"))
    args = parser.parse_args(argv)
    if args.command == "docs":
        files = docs_images(args.out, args.static)
    else:
        files = [plot_alloc_vs_arrival(load_static_results(args.files), args.out)]
    for f in files:
        print(f, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

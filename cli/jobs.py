"""Your jobs: `tessera queue` (squeue), `ls`, `show` with its events, `cancel` (scancel) and `logs`, --follow
included."""

from __future__ import annotations

import argparse
import base64
import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any

from cli.client import ApiError, Client, ExitCode
from cli.output import (
    ago,
    command_parser,
    human_duration,
    mib,
    print_json,
    request_text,
    run_command,
    shorten,
    table,
    until,
)


def queue(argv: Sequence[str]) -> int:
    parser = command_parser("queue", "Pending jobs in the scheduler's order (other teams' jobs anonymous).")
    parser.add_argument("--team", "-A")
    parser.add_argument(
        "--limit", "-n", type=int, default=100, help="at most this many entries (default 100)"
    )
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        rows = Client.from_config().get_all("/api/v1/queue/", limit=args.limit, team=args.team)
        if args.json:
            print_json(rows)
            return ExitCode.OK
        print(
            table(
                [
                    [
                        r["position"],
                        r["id"] if r["mine"] else "-",
                        r["team"],
                        r["user"] or "-",
                        shorten(r["name"], 24) if r["mine"] else "(other team)",
                        r["priority"],
                        request_text(r["request"]),
                        human_duration(r["wait_s"]),
                        until(r["estimated_start_at"]),
                        shorten(
                            r["pending_reason"]
                            or r.get("pending_reason_general")
                            or r["pending_reason_code"],
                            60,
                        ),
                    ]
                    for r in rows
                ],
                ["POS", "JOBID", "TEAM", "USER", "NAME", "PRIO", "REQUEST", "WAIT", "START", "REASON"],
            )
        )
        return ExitCode.OK

    return run_command(handle, args)


def ls(argv: Sequence[str]) -> int:
    parser = command_parser("ls", "Your teams' jobs, newest first.")
    parser.add_argument("--state", "-s", action="append", help="repeatable: pending, running, ...")
    parser.add_argument("--team", "-A")
    parser.add_argument("--user", "-u")
    parser.add_argument("--mine", action="store_true", help="only jobs you submitted")
    parser.add_argument("--limit", "-n", type=int, default=50)
    parser.add_argument(
        "--array", type=int, metavar="ID", help="the tasks of this array (else one line per array)"
    )
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        rows = Client.from_config().get_all(
            "/api/v1/jobs/",
            limit=args.limit,
            state=args.state,
            team=args.team,
            user=args.user,
            mine="true" if args.mine else None,
            array=args.array,
        )
        if args.json:
            print_json(rows)
            return ExitCode.OK
        print(
            table(
                [
                    [
                        _job_label(r),
                        shorten(r["name"], 24),
                        r["team"],
                        r["user"],
                        _state_words(r),
                        request_text(r["request"]),
                        r["priority"],
                        ago(r["submitted_at"]),
                        r["queue_position"] or "-",
                        shorten(r["pending_reason"], 50)
                        if r["state"] == "pending"
                        else _node_words(r.get("node_condition")) or _idle_words(r.get("idle_reclaim_at")),
                    ]
                    for r in rows
                ],
                ["JOBID", "NAME", "TEAM", "USER", "STATE", "REQUEST", "PRIO", "SUBMITTED", "POS", "REASON"],
            )
        )
        return ExitCode.OK

    return run_command(handle, args)


def _job_label(job: dict[str, Any]) -> str:
    """A job's id as Slurm writes an array's: 123_7 for task 7 of array 123, 123_[0-999%50] for its line."""
    array = job.get("array")
    if not array:
        return str(job["id"])
    if array["counts"] is not None:
        return f"{array['id']}_[{array['tasks']}]"
    return f"{array['id']}_{array['task_id']}"


def _state_words(job: dict[str, Any]) -> str:
    """A job's state; an array's line counts its tasks by state: "12 running, 30 pending"."""
    array = job.get("array")
    if not array or array["counts"] is None:
        return job["state"]
    return ", ".join(f"{n} {state}" for state, n in sorted(array["counts"].items(), key=lambda kv: -kv[1]))


def _node_words(condition: dict | None) -> str:
    """A job's silent node, in a few words for a table row."""
    if not condition:
        return ""
    if condition["code"] == "releasing":
        return f"releasing GPUs on {condition['node']} (node silent)"
    return f"node {condition['node']} not responding since {condition['since'][11:16]} UTC"


def _idle_words(reclaim_at: str | None) -> str:
    """A job warned that its GPUs sit idle, in a few words for a table row."""
    if not reclaim_at:
        return ""
    return f"idle: GPUs given back at {reclaim_at[11:16]} UTC unless used"


def show(argv: Sequence[str]) -> int:
    parser = command_parser("show", "One job in detail, with its events.")
    parser.add_argument("job_id", type=int)
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        client = Client.from_config()
        job = client.job(args.job_id)
        events = client.events(args.job_id)
        if args.json:
            print_json({**job, "events": events})
            return ExitCode.OK
        checkpoint_s = job["request"].get("checkpoint_interval_s")
        fields = [
            ("Job", f"{job['id']} {job['name']}"),
            ("Team / user", f"{job['team']} / {job['user']}"),
            ("State", job["state"] + (" (borrowed capacity)" if job["borrowed"] else "")),
            ("Request", request_text(job["request"])),
            (
                "Priority",
                f"{job['priority']} ({job['priority_value']})"
                + ("" if job["preemptible"] else ", not preemptible"),
            ),
            ("Checkpoints", f"every {human_duration(checkpoint_s)}" if checkpoint_s else "none declared"),
            ("Command", job["command"]),
            ("Submitted", f"{job['submitted_at']} ({ago(job['submitted_at'])})"),
        ]
        if job.get("image"):
            mounts = job.get("mounts") or []
            fields.insert(
                fields.index(("Command", job["command"])),
                ("Image", job["image"] + (f" with {', '.join(mounts)}" if mounts else "")),
            )
        array = job.get("array")
        if array:
            fields.insert(1, ("Array", _array_words(array)))
        if job["state"] == "pending":
            fields += [
                ("Queue position", job["queue_position"] or "-"),
                (
                    "Estimated start",
                    f"{job['estimated_start_at']} ({until(job['estimated_start_at'])})"
                    if job["estimated_start_at"]
                    else "not known yet (give the job a runtime limit, -t, for an estimate)"
                    if not job["request"].get("max_runtime_s")
                    else "not known yet",
                ),
                ("Why pending", f"[{job['pending_reason_code']}] {job['pending_reason']}"),
            ]
        condition = job.get("node_condition")
        if condition:
            label = "Releasing" if condition["code"] == "releasing" else "Node"
            fields.append((label, condition["message"]))
        if job["started_at"]:
            fields.append(("Started", job["started_at"]))
        if job["finished_at"]:
            exited = f", exit code {job['exit_code']}" if job["exit_code"] is not None else ""
            fields.append(("Finished", f"{job['finished_at']} ({job['state']}{exited})"))
        for sl in job.get("slices", []):
            fields.append(
                (
                    "GPU",
                    f"{sl['node']}/gpu{sl['gpu_index']} {sl['gpu_model']} {mib(sl['memory_mib'])} {sl['compute_pct']}%",
                )
            )
        width = max(len(k) for k, _ in fields)
        for key, value in fields:
            print(f"{key.ljust(width)}  {value}")
        print("\nEvents:")
        print(
            table(
                [
                    [
                        e["at"][:19].replace("T", " "),
                        f"{e['from_state'] or '-'} -> {e['to_state'] or '-'}",
                        e["code"],
                        e["actor"] or e["actor_kind"],
                        (e["message"] or "").replace("\n", " "),
                    ]
                    for e in events
                ],
                ["AT", "STATE", "CODE", "BY", "MESSAGE"],
                wrap_last=_message_width(events),
            )
        )
        return ExitCode.OK

    return run_command(handle, args)


def _array_words(array: dict[str, Any]) -> str:
    at_once = f", at most {array['max_running']} at once" if array["max_running"] else ""
    tasks = f"{array['task_count']:,} tasks ({array['tasks']}){at_once}"
    if array["counts"] is None:
        return f"task {array['task_id']} of array {array['id']}: {tasks}"
    counts = ", ".join(
        f"{n:,} {state}" for state, n in sorted(array["counts"].items(), key=lambda kv: -kv[1])
    )
    return f"{tasks}: {counts} (tessera ls --array {array['id']})"


def _message_width(events: list[dict[str, Any]]) -> int:
    """What is left of the terminal (80 columns when not one) for the events' messages, at least 40."""
    used = 19 + 2  # AT
    used += (
        max([len("STATE")] + [len(f"{e['from_state'] or '-'} -> {e['to_state'] or '-'}") for e in events]) + 2
    )
    used += max([len("CODE")] + [len(e["code"] or "") for e in events]) + 2
    used += max([len("BY")] + [len(str(e["actor"] or e["actor_kind"])) for e in events]) + 2
    return max(40, shutil.get_terminal_size((100, 24)).columns - used)


def cancel(argv: Sequence[str]) -> int:
    parser = command_parser("cancel", "Cancel jobs (scancel); an array's id cancels all of its tasks.")
    parser.add_argument("job_ids", type=int, nargs="+")
    parser.add_argument(
        "--tasks", metavar="INDEXES", help="only these tasks of the array (e.g. 3-7 or 1,4,9); one array id"
    )
    args = parser.parse_args(argv)
    if args.tasks is not None and len(args.job_ids) != 1:
        parser.error("--tasks names the tasks of one array: give one job id")

    def handle(args: argparse.Namespace) -> int:
        client = Client.from_config()
        worst = ExitCode.OK
        results = []
        for job_id in args.job_ids:
            try:
                job = client.cancel(job_id, tasks=args.tasks)
                results.append({"id": job_id, "state": job["state"]})
                if not args.json:
                    array = job.get("array")
                    if args.tasks is not None:
                        print(f"Cancelled tasks {args.tasks} of array {job_id}: {_state_words(job)}.")
                    elif array and array["counts"] is not None:
                        print(f"Cancelled array {job_id}: {_state_words(job)}.")
                    else:
                        print(f"Cancelled job {job_id}.")
            except ApiError as exc:
                results.append({"id": job_id, "error": {"code": exc.code, "message": exc.message}})
                if not args.json:
                    if f"job {job_id} " in exc.message.lower():  # "Job 7 is already cancelled."
                        print(f"tessera cancel: {exc.message}", file=sys.stderr)
                    else:
                        print(f"tessera cancel: job {job_id}: {exc}", file=sys.stderr)
                worst = worst or exc.exit_code
        if args.json:
            print_json(results)
        return worst

    return run_command(handle, args)


def logs(argv: Sequence[str]) -> int:
    parser = command_parser("logs", "A job's output.")
    parser.add_argument("job_id", type=int)
    parser.add_argument("--stderr", action="store_true", help="the error stream instead of stdout")
    parser.add_argument("--tail", "-n", type=int, default=None, help="last N lines (default: all)")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between polls with --follow")
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        client = Client.from_config()
        stream = "stderr" if args.stderr else "stdout"
        if args.json and not args.follow:
            print_json(
                client.logs(
                    args.job_id, stream=stream, tail=args.tail, offset=0 if args.tail is None else None
                )
            )
            return ExitCode.OK
        # The bytes exactly as the job wrote them (binary output too), not a text rendering of them.
        out = sys.stdout.buffer

        def read(**where: int | None) -> dict:
            body = client.logs(args.job_id, stream=stream, encoding="base64", **where)
            out.write(base64.b64decode(body["data"]))
            out.flush()
            return body

        if args.follow:
            _wait_until_started(client, args.job_id, args.interval)
        body = read(tail=args.tail) if args.tail is not None else read(offset=0)
        offset = body["next_offset"]
        # Without --tail, read the whole log page by page; with --follow, keep going until the job is done.
        while (args.tail is None and offset < body["size"]) or (args.follow and not body["complete"]):
            if offset >= body["size"]:
                time.sleep(args.interval)
            body = read(offset=offset)
            offset = body["next_offset"]
        if args.follow:
            # The job finished: print what arrived between the last poll and the end.
            body = read(offset=offset)
        if stream == "stdout":
            _say_why_it_failed(client, args.job_id, stdout_empty=body["size"] == 0)
        return ExitCode.OK

    return run_command(handle, args)


# A job in these states has not started yet (or is on its way back to the queue): `logs -f` waits, saying why.
_NOT_STARTED = ("pending", "placed", "starting", "preempted", "lost")
FAILED_STDERR_LINES = 20


def _wait_until_started(client: Client, job_id: int, interval: float) -> None:
    """Until the job runs (or ends), say on stderr where it waits and why, again each time that changes:
    'pending: position 3, <reason>'."""
    said = None
    while True:
        job = client.job(job_id)
        if job["state"] not in _NOT_STARTED:
            if said is not None:
                print(f"{job['state']}: its output follows", file=sys.stderr, flush=True)
            return
        if job["state"] == "pending":
            reason = job.get("pending_reason") or job.get("pending_reason_code") or "waiting for a cycle"
            line = f"pending: position {job.get('queue_position') or '-'}, {reason}"
        else:
            line = f"{job['state']}: waiting for it to start"
        if line != said:
            print(line, file=sys.stderr, flush=True)
            said = line
        time.sleep(interval)


def _say_why_it_failed(client: Client, job_id: int, *, stdout_empty: bool) -> None:
    """A failed job's reason is often on stderr only (`jupyter: not found`): print its last lines on stderr, from
    the stored log, else from the tail its agent sent with its final report."""
    job = client.job(job_id)
    if job["state"] != "failed":
        return
    lines = client.logs(job_id, stream="stderr", tail=FAILED_STDERR_LINES).get("text", "").splitlines()
    if not lines:
        for event in reversed(client.events(job_id)):
            tail = ((event.get("data") or {}).get("log_tail") or {}).get("stderr")
            if tail:
                lines = [str(line) for line in tail][-FAILED_STDERR_LINES:]
                break
    exit_code = f", exit code {job['exit_code']}" if job.get("exit_code") is not None else ""
    if not lines:
        if stdout_empty:
            print(
                f"tessera logs: job {job_id} failed{exit_code}; stdout and stderr are empty.", file=sys.stderr
            )
        return
    head = "stdout is empty; stderr has:" if stdout_empty else "its stderr ends with:"
    print(f"tessera logs: job {job_id} failed{exit_code}; {head}", file=sys.stderr)
    for line in lines:
        print(f"  {line}", file=sys.stderr)


def open_session(argv: Sequence[str]) -> int:
    parser = command_parser(
        "open", "Where to open a job's web port (a notebook, a dashboard) in the browser."
    )
    parser.add_argument("job_id", type=int)
    parser.add_argument("name", nargs="?", help="which of its ports (default: its first)")
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        client = Client.from_config()
        job = client.job(args.job_id)
        ports = job.get("ports") or []
        if not ports:
            print(
                f"Job {args.job_id} serves no web ports (submit it with --port name:port).", file=sys.stderr
            )
            return ExitCode.NOT_FOUND
        port = next((p for p in ports if p["name"] == args.name), None) if args.name else ports[0]
        if port is None:
            names = ", ".join(p["name"] for p in ports)
            print(f"Job {args.job_id} has no port {args.name!r}; it serves {names}.", file=sys.stderr)
            return ExitCode.NOT_FOUND
        url = f"{client.url}{port['path']}"
        if args.json:
            print_json({**port, "url": url})
            return ExitCode.OK
        print(url)
        notes = {
            "starting": f"{port['name']} is starting: the link answers once its server is up.",
            "waiting": f"job {args.job_id} is {job['state']}: the link answers once it runs.",
            "ended": f"job {args.job_id} has ended ({job['state']}): the link no longer answers.",
        }
        if port["state"] in notes:
            print(notes[port["state"]], file=sys.stderr)
        return ExitCode.OK

    return run_command(handle, args)

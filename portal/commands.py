"""The `tessera` subcommands that talk to the API: login, submit, queue, ls, show, cancel, logs, usage, nodes,
top, whoami. Human tables by default, --json for scripts; exit codes are portal.client.ExitCode."""

from __future__ import annotations

import argparse
import base64
import getpass
import json
import os
import re
import select
import shlex
import shutil
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from portal.client import DEFAULT_URL, ApiError, Client, ExitCode, config_load, config_save
from portal.submit_flags import SUBMIT_FLAGS

# -- output helpers ----------------------------------------------------------------------------------------


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def table(rows: list[list[Any]], headers: list[str], *, wrap_last: int | None = None) -> str:
    """A plain aligned table, like squeue's. `wrap_last`: the last column's text is wrapped at so many characters,
    its further lines under it (whole messages, never cut)."""
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    if wrap_last:
        wrapped = []
        for row in cells:
            lines = textwrap.wrap(row[-1], wrap_last, break_on_hyphens=False) or [""]
            wrapped.append([*row[:-1], lines[0]])
            wrapped += [[""] * (len(row) - 1) + [line] for line in lines[1:]]
        cells = wrapped
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(max(0, seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            rest = seconds % size
            sub = {"d": ("h", 3600), "h": ("m", 60), "m": ("s", 1)}[unit]
            return (
                f"{seconds // size}{unit}{rest // sub[1]}{sub[0]}"
                if rest // sub[1]
                else f"{seconds // size}{unit}"
            )
    return f"{seconds}s"


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _until(value: str | None) -> str:
    moment = _parse_time(value)
    if moment is None:
        return "-"
    return f"in {human_duration((moment - datetime.now(UTC)).total_seconds())}"


def _ago(value: str | None) -> str:
    moment = _parse_time(value)
    if moment is None:
        return "-"
    return f"{human_duration((datetime.now(UTC) - moment).total_seconds())} ago"


def mib(value: int | None) -> str:
    if not value:
        return "0"
    return f"{value / 1024:g}GiB" if value % 1024 == 0 or value >= 10240 else f"{value}MiB"


def request_text(request: dict[str, Any]) -> str:
    """'2xGPU nvlink', '10GiB/25%', '1xGPU x4 nodes'."""
    if request.get("gpus"):
        text = f"{request['gpus']}xGPU"
        if request.get("nodes", 1) > 1:
            text += f" x{request['nodes']}n"
        if request.get("topology") not in (None, "none"):
            text += f" {request['topology']}"
    else:
        parts = []
        if request.get("gpu_memory_mib"):
            parts.append(mib(request["gpu_memory_mib"]))
        if request.get("compute_pct"):
            parts.append(f"{request['compute_pct']}%")
        text = "/".join(parts) or "-"
    if request.get("gpu_models"):
        text += f" [{','.join(request['gpu_models'])}]"
    return text


def _shorten(text: str | None, width: int) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


SHELL_LINE, ARGV = "shell line", "argv"


# Programs that run a script: a job running `python train.py` is named after train.py, not python.
_RUNNER = re.compile(r"(python|pypy)[0-9.]*|bash|sh|zsh|node|Rscript|julia|perl|ruby")
# Programs that start another (`torchrun ... train.py`, `uv run python train.py`): named after what they start.
_LAUNCHERS = frozenset(
    {"torchrun", "deepspeed", "accelerate", "uv", "env", "srun", "mpirun", "nohup", "time"}
)
_SCRIPT = re.compile(r".*/.*|.+\.(py|sh|bash|R|r|jl|js|mjs|rb|pl|ipynb)")
_SHELL_OPERATORS = frozenset({"&&", "||", ";", "|", "&"})


def default_job_name(command: str) -> str:
    """The name a job gets when it names none: the script it runs, else its program. `python train.py --lr 1`
    -> train.py; `python -m pkg.train` -> pkg.train; `torchrun --nproc-per-node 8 train.py` -> train.py;
    `python train.py && echo done` (a shell line) -> train.py; `./run.sh` -> run.sh; `nvidia-smi` -> nvidia-smi."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):  # FOO=1 python x.py
        words = words[1:]
    if not words:
        return "job"
    program = words[0].rstrip("/").split("/")[-1] or "job"
    rest: list[str] = []
    for word in words[1:]:
        if word in _SHELL_OPERATORS:
            break
        rest.append(word)
    if _RUNNER.fullmatch(program):
        for i, word in enumerate(rest):
            if word in ("-m", "-c"):
                return rest[i + 1] if word == "-m" and i + 1 < len(rest) else program
            if not word.startswith("-"):
                return word.rstrip("/").split("/")[-1] or program
    elif program in _LAUNCHERS:
        for i, word in enumerate(rest):
            if _RUNNER.fullmatch(word.split("/")[-1]):
                return default_job_name(shlex.join(rest[i:]))
            if not word.startswith("-") and "=" not in word and _SCRIPT.fullmatch(word):
                return word.rstrip("/").split("/")[-1] or program
    return program


def command_line(words: list[str]) -> tuple[str, str]:
    """The job's command line from the words after `--`, and which form they are. Several words are a program
    and its arguments, quoted so the shell runs exactly them; a single word holding whitespace is a shell line
    (what `tessera submit -- "python train.py"` means), kept as written."""
    if len(words) == 1 and any(c.isspace() for c in words[0]):
        return words[0], SHELL_LINE
    return shlex.join(words), ARGV


# -- commands ----------------------------------------------------------------------------------------------


def _parser(name: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"tessera {name}", description=description)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _run(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return handler(args)
    except ApiError as exc:
        if getattr(args, "json", False):
            _print_json(
                {"error": {"code": exc.code, "message": exc.message, "field": exc.field, "limit": exc.limit}}
            )
        else:
            print(f"tessera: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return ExitCode.OK


def login(argv: Sequence[str]) -> int:
    parser = _parser("login", "Get a personal API token and store it in the config file.")
    parser.add_argument(
        "--url", default=None, help=f"the portal's address (default: saved, else {DEFAULT_URL})"
    )
    parser.add_argument("--username", "-u", help="default: $USER")
    parser.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    parser.add_argument("--token", help="store this existing token instead of logging in with a password")
    parser.add_argument("--name", default=None, help="a name for the token (default: tessera CLI on <host>)")
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        saved = config_load()
        url = (args.url or saved.get("url") or DEFAULT_URL).rstrip("/")
        token = args.token
        if not token:
            username = args.username or os.environ.get("USER") or input("Username: ")
            if args.password_stdin:
                password = sys.stdin.readline().rstrip("\n")
            else:
                password = getpass.getpass(f"Password for {username} at {url}: ")
            name = args.name or f"tessera CLI on {os.uname().nodename}"
            token = Client(url=url).login(username=username, password=password, name=name)["token"]
        me = Client(url=url, token=token).whoami()
        path = config_save({"url": url, "token": token, "username": me["username"]})
        if args.json:
            _print_json({"url": url, "username": me["username"], "config": str(path)})
        else:
            teams = ", ".join(t["team"] for t in me["teams"]) or "no teams"
            print(f"Logged in to {url} as {me['username']} ({teams}). Token saved in {path}.")
        return ExitCode.OK

    return _run(handle, args)


def whoami(argv: Sequence[str]) -> int:
    args = _parser("whoami", "Who the saved token belongs to.").parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        client = Client.from_config()
        me = client.whoami()
        mine = {t["team"] for t in me["teams"]}
        details = {t["slug"]: t for t in client.get_all("/api/v1/teams/", limit=1000) if t["slug"] in mine}
        if args.json:
            _print_json(
                {**me, "team_details": [details[t["team"]] for t in me["teams"] if t["team"] in details]}
            )
            return ExitCode.OK
        print(me["username"] + (" (staff)" if me["is_staff"] else ""))
        for t in me["teams"]:
            print(f"  {t['team']}  {t['role']}")
            team = details.get(t["team"])
            if team is not None:
                for line in _team_lines(team):
                    print(f"    {line}")
        return ExitCode.OK

    return _run(handle, args)


def _gpus(value: float | None) -> str:
    return "no limit" if value is None else f"{value:g}"


def _team_lines(team: dict[str, Any]) -> list[str]:
    """A team's quotas (guaranteed / limit per GPU model), what it holds now, and its priority classes."""
    usage = team.get("usage") or {}
    lines = [
        f"held now: {usage.get('gpus', 0):g} GPUs, {mib(usage.get('gpu_memory_mib'))} GPU memory; "
        f"{usage.get('running_jobs', 0)} running, {usage.get('pending_jobs', 0)} pending"
    ]
    for q in team.get("quotas") or []:
        lines.append(
            f"quota {q['gpu_model'] or 'any model'}: {q['guaranteed_gpus']:g} GPUs guaranteed, "
            f"limit {_gpus(q['limit_gpus'])}"
            + (
                f"; GPU memory limit {mib(q['limit_gpu_memory_mib'])}"
                if q.get("limit_gpu_memory_mib")
                else ""
            )
        )
    if not team.get("quotas"):
        lines.append("quota: none (it runs on what others do not use)")
    classes = [
        pc["name"]
        + (" (not preemptible)" if not pc["preemptible"] else "")
        + (f" (at most {pc['limit_gpus']:g} GPUs)" if pc.get("limit_gpus") is not None else "")
        for pc in team.get("priority_classes") or []
    ]
    default = team.get("default_priority_class")
    lines.append(
        f"priority classes: {', '.join(classes) or 'none'}" + (f"; default {default}" if default else "")
    )
    return lines


def _read_spec_file(path: str) -> tuple[dict[str, Any], list[str]]:
    """A YAML/JSON spec, or a script whose `#TESSERA <flags>` lines act like sbatch's `#SBATCH`."""
    import yaml

    text = Path(path).read_text()
    if Path(path).suffix.lower() in (".yaml", ".yml", ".json"):
        data = yaml.safe_load(text)
        if not isinstance(data, dict):
            raise ValueError(f"{path} is not a mapping of spec fields")
        return data, []
    flags: list[str] = []
    for line in text.splitlines():
        if line.startswith("#TESSERA"):
            flags += shlex.split(line[len("#TESSERA") :])
    return {"command": f"bash {shlex.quote(str(Path(path).resolve()))}", "name": Path(path).stem}, flags


def submit(argv: Sequence[str]) -> int:
    parser = _parser("submit", "Submit a job from a spec file, a script with #TESSERA lines, or flags.")
    parser.add_argument("file", nargs="?", help="job spec (.yaml/.json) or a script; flags override it")
    for flags, field, text in SUBMIT_FLAGS:
        kwargs: dict[str, Any] = {"dest": field, "help": text}
        if field == "gpu_models":
            kwargs["action"] = "append"
        parser.add_argument(*flags, **kwargs)
    parser.add_argument("--env", "-e", action="append", default=[], metavar="NAME=VALUE", help="repeatable")
    parser.add_argument("--no-preempt", action="store_true", help="ask not to be preempted")
    parser.add_argument(
        "--idempotency-key", help="retries with the same key submit once (default: a fresh key)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the spec that would be sent")
    parser.epilog = (
        "Give the command after --. Separate words run as a program and its arguments: "
        "tessera submit -G 1 -t 2h -- python train.py --lr 3e-4. One quoted word holding spaces is a shell line, "
        "run with /bin/sh -c (pipes, &&, $VARIABLES): tessera submit -G 1 -- 'python prep.py && python train.py'."
    )
    argv = list(argv)
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    if argv and not argv[0].startswith("-") and Path(argv[0]).is_file():
        try:
            _, file_flags = _read_spec_file(argv[0])
        except (OSError, ValueError) as exc:
            print(f"tessera submit: {exc}", file=sys.stderr)
            return ExitCode.USAGE
        argv = [argv[0], *file_flags, *argv[1:]]  # flags on the command line win over the file's
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        spec: dict[str, Any] = {}
        if args.file:
            try:
                spec, _ = _read_spec_file(args.file)
            except (OSError, ValueError) as exc:
                print(f"tessera submit: cannot read {args.file}: {exc}", file=sys.stderr)
                return ExitCode.USAGE
        for _, field, _ in SUBMIT_FLAGS:
            value = getattr(args, field)
            if value is not None:
                spec[field] = value
        for field in ("gpus", "compute_pct", "nodes"):
            if isinstance(spec.get(field), str) and spec[field].isdigit():
                spec[field] = int(spec[field])
        if args.env:
            env = dict(spec.get("env") or {})
            for item in args.env:
                name, sep, value = item.partition("=")
                if not sep:
                    print(f"tessera submit: --env takes NAME=VALUE (got {item!r})", file=sys.stderr)
                    return ExitCode.USAGE
                env[name] = value
            spec["env"] = env
        if args.no_preempt:
            spec["preemptible"] = False
        if command:
            spec["command"], form = command_line(command)
            if form == SHELL_LINE and not args.json:
                print(
                    f"tessera submit: {command[0]!r} is one word with spaces: run as a shell line",
                    file=sys.stderr,
                )
        if "command" not in spec:
            print("tessera submit: give a spec file or a command after --", file=sys.stderr)
            return ExitCode.USAGE
        spec.setdefault("name", default_job_name(str(spec["command"])) if spec["command"] else "job")
        if args.dry_run:
            _print_json(spec)
            return ExitCode.OK
        client = Client.from_config()
        try:
            job = client.submit(spec, idempotency_key=args.idempotency_key)
        except ApiError as exc:
            raise _team_hint(client, exc) from None
        if args.json:
            _print_json(job)
        else:
            print(f"Submitted job {job['id']} ({job['name']}) to {job['team']}: {job['state']}")
            if job.get("pending_reason"):
                print(f"  {job['pending_reason']}")
        return ExitCode.OK

    return _run(handle, args)


def _team_hint(client: Client, exc: ApiError) -> ApiError:
    """'Name the team' from the API, for a member of several teams, says how on the command line."""
    if exc.field != "team" or not exc.message.startswith("Name the team: you belong to several"):
        return exc
    try:
        teams = [t["team"] for t in client.whoami()["teams"]]
    except ApiError:
        return exc
    exc.message = f"Name the team: pass -A <team> (your teams: {', '.join(teams)})."
    return exc


def queue(argv: Sequence[str]) -> int:
    parser = _parser("queue", "Pending jobs in the scheduler's order (other teams' jobs anonymous).")
    parser.add_argument("--team", "-A")
    parser.add_argument(
        "--limit", "-n", type=int, default=100, help="at most this many entries (default 100)"
    )
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        rows = Client.from_config().get_all("/api/v1/queue/", limit=args.limit, team=args.team)
        if args.json:
            _print_json(rows)
            return ExitCode.OK
        print(
            table(
                [
                    [
                        r["position"],
                        r["id"] if r["mine"] else "-",
                        r["team"],
                        r["user"] or "-",
                        _shorten(r["name"], 24) if r["mine"] else "(other team)",
                        r["priority"],
                        request_text(r["request"]),
                        human_duration(r["wait_s"]),
                        _until(r["estimated_start_at"]),
                        _shorten(r["pending_reason"] or r["pending_reason_code"], 60),
                    ]
                    for r in rows
                ],
                ["POS", "JOBID", "TEAM", "USER", "NAME", "PRIO", "REQUEST", "WAIT", "START", "REASON"],
            )
        )
        return ExitCode.OK

    return _run(handle, args)


def ls(argv: Sequence[str]) -> int:
    parser = _parser("ls", "Your teams' jobs, newest first.")
    parser.add_argument("--state", "-s", action="append", help="repeatable: pending, running, ...")
    parser.add_argument("--team", "-A")
    parser.add_argument("--user", "-u")
    parser.add_argument("--mine", action="store_true", help="only jobs you submitted")
    parser.add_argument("--limit", "-n", type=int, default=50)
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        rows = Client.from_config().get_all(
            "/api/v1/jobs/",
            limit=args.limit,
            state=args.state,
            team=args.team,
            user=args.user,
            mine="true" if args.mine else None,
        )
        if args.json:
            _print_json(rows)
            return ExitCode.OK
        print(
            table(
                [
                    [
                        r["id"],
                        _shorten(r["name"], 24),
                        r["team"],
                        r["user"],
                        r["state"],
                        request_text(r["request"]),
                        r["priority"],
                        _ago(r["submitted_at"]),
                        r["queue_position"] or "-",
                        _shorten(r["pending_reason"], 50) if r["state"] == "pending" else "",
                    ]
                    for r in rows
                ],
                ["JOBID", "NAME", "TEAM", "USER", "STATE", "REQUEST", "PRIO", "SUBMITTED", "POS", "REASON"],
            )
        )
        return ExitCode.OK

    return _run(handle, args)


def show(argv: Sequence[str]) -> int:
    parser = _parser("show", "One job in detail, with its events.")
    parser.add_argument("job_id", type=int)
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        client = Client.from_config()
        job = client.job(args.job_id)
        events = client.events(args.job_id)
        if args.json:
            _print_json({**job, "events": events})
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
            ("Submitted", f"{job['submitted_at']} ({_ago(job['submitted_at'])})"),
        ]
        if job["state"] == "pending":
            fields += [
                ("Queue position", job["queue_position"] or "-"),
                (
                    "Estimated start",
                    f"{job['estimated_start_at'] or '-'} ({_until(job['estimated_start_at'])})",
                ),
                ("Why pending", f"[{job['pending_reason_code']}] {job['pending_reason']}"),
            ]
        if job["started_at"]:
            fields.append(("Started", job["started_at"]))
        if job["finished_at"]:
            fields.append(("Finished", f"{job['finished_at']} exit code {job['exit_code']}"))
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

    return _run(handle, args)


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
    parser = _parser("cancel", "Cancel jobs (scancel).")
    parser.add_argument("job_ids", type=int, nargs="+")
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        client = Client.from_config()
        worst = ExitCode.OK
        results = []
        for job_id in args.job_ids:
            try:
                job = client.cancel(job_id)
                results.append({"id": job_id, "state": job["state"]})
                if not args.json:
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
            _print_json(results)
        return worst

    return _run(handle, args)


def logs(argv: Sequence[str]) -> int:
    parser = _parser("logs", "A job's output.")
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
            _print_json(
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

    return _run(handle, args)


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


def usage(argv: Sequence[str]) -> int:
    parser = _parser("usage", "GPU-hours (whole-GPU equivalents) by team, user and/or day (sacct-like).")
    parser.add_argument("--since", help="date or date-time (default: 30 days ago)")
    parser.add_argument("--until", help="date or date-time (default: now)")
    parser.add_argument("--by", default="team,user", help="comma list of team, user, day (default team,user)")
    parser.add_argument("--team", "-A")
    parser.add_argument("--user", "-u")
    parser.add_argument("--csv", action="store_true", help="CSV as the server renders it")
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        client = Client.from_config()
        # "team, user" as people type it; the API takes the list written without spaces.
        groups = [g.strip() for g in args.by.split(",") if g.strip()]
        params = {
            "since": args.since,
            "until": args.until,
            "group_by": ",".join(groups),
            "team": args.team,
            "user": args.user,
        }
        if args.csv:
            params["format"] = "csv"
            response = client.request("GET", "/api/v1/usage/", params={k: v for k, v in params.items() if v})
            sys.stdout.write(response.text)
            return ExitCode.OK
        rows = client.get("/api/v1/usage/", **params)
        if args.json:
            _print_json(rows)
            return ExitCode.OK
        print(
            table(
                [
                    [
                        *(r.get(g) for g in groups),
                        f"{r['gpu_hours']:.2f}",
                        f"{r['gpu_memory_gib_hours']:.1f}",
                        r["jobs"],
                    ]
                    for r in rows
                ],
                [*(g.upper() for g in groups), "GPU_HOURS", "GPU_MEM_GIB_HOURS", "JOBS"],
            )
        )
        total = sum(r["gpu_hours"] for r in rows)
        print(f"\nTotal: {total:.2f} GPU-hours")
        return ExitCode.OK

    return _run(handle, args)


def _gpu_bar(gpu: dict[str, Any], width: int = 10) -> str:
    share = max(
        gpu["allocated_memory_mib"] / gpu["memory_mib"] if gpu["memory_mib"] else 0,
        gpu["allocated_compute_pct"] / max(1, gpu["compute_capacity_pct"]),
    )
    filled = round(min(1.0, share) * width)
    mark = "#" if any(s["mine"] for s in gpu["slices"]) else "="
    return "[" + mark * filled + "." * (width - filled) + "]"


def nodes(argv: Sequence[str]) -> int:
    parser = _parser("nodes", "Nodes and their GPUs (sinfo-like); '#' marks GPUs your teams use.")
    parser.add_argument("--state")
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        rows = Client.from_config().get_all("/api/v1/cluster/nodes/", limit=10_000, state=args.state)
        if args.json:
            _print_json(rows)
            return ExitCode.OK
        print(_nodes_table(rows))
        return ExitCode.OK

    return _run(handle, args)


def _nodes_table(rows: list[dict[str, Any]]) -> str:
    out = []
    for n in rows:
        gpus = n["gpus"]
        models = sorted({g["model"] for g in gpus})
        used = sum(1 for g in gpus if g["allocated_memory_mib"] or g["allocated_compute_pct"])
        conditions = n.get("conditions") or {}
        out.append(
            [
                n["name"],
                n["state"],
                ",".join(models) or "-",
                f"{used}/{len(gpus)}",
                _live_util(gpus),
                " ".join(_gpu_bar(g, 4) for g in gpus),
                conditions.get("connection_reason", "-"),
                _shorten(conditions.get("last_error"), 60) or "-",
            ]
        )
    return table(
        out,
        ["NODE", "STATE", "MODEL", "USED", "UTIL", "GPUS (memory/compute allocated)", "AGENT", "LAST ERROR"],
    )


def _live_util(gpus: list[dict[str, Any]]) -> str:
    """Mean SM utilisation of the node's GPUs as its agent last measured it; '-' when no fresh sample."""
    utils = [g["metrics"]["util_pct"] for g in gpus if (g.get("metrics") or {}).get("util_pct") is not None]
    return f"{sum(utils) / len(utils):.0f}%" if utils else "-"


def _top_frame(client: Client) -> str:
    cluster = client.get("/api/v1/cluster/")
    node_rows = client.get_all("/api/v1/cluster/nodes/", limit=2000)
    queue = client.get("/api/v1/queue/", page_size=10)
    now = datetime.now(UTC).strftime("%H:%M:%S")
    lines = [
        f"tessera top  {now}   nodes {sum(cluster['nodes'].values())} "
        + " ".join(f"{k}:{v}" for k, v in sorted(cluster["nodes"].items()))
        + f"   GPUs {cluster['allocated_gpus']:.2f}/{cluster['gpus']} allocated"
        + f"   running {cluster['running_jobs']}  pending {cluster['pending_jobs']}",
        "",
        table(
            [
                [
                    m["model"],
                    m["gpus"],
                    m["ready_gpus"],
                    f"{m['allocated_gpus']:.2f}",
                    m["free_whole_gpus"],
                    f"{100 * m['allocated_memory_mib'] / max(1, m['memory_mib']):.0f}%",
                ]
                for m in cluster["models"]
            ],
            ["MODEL", "GPUS", "READY", "ALLOCATED", "FREE_WHOLE", "MEM_ALLOC"],
        ),
        "",
        table(
            [
                [
                    t["team"],
                    t["guaranteed_gpus"],
                    t["fair_share_gpus"],
                    f"{t['allocated_gpus']:.2f}",
                    f"{t['borrowed_gpus']:.2f}",
                    t["running_jobs"],
                    t["pending_jobs"],
                ]
                for t in cluster["teams"]
            ],
            ["TEAM", "GUARANTEED", "FAIR_SHARE", "ALLOCATED", "BORROWED", "RUNNING", "PENDING"],
        ),
        "",
        _nodes_table(node_rows),
        "",
        f"Queue (first {len(queue['results'])} of {queue['count']}):",
        table(
            [
                [
                    r["position"],
                    r["team"],
                    _shorten(r["name"], 20) if r["mine"] else "(other team)",
                    request_text(r["request"]),
                    human_duration(r["wait_s"]),
                    _shorten(r["pending_reason"] or r["pending_reason_code"], 50),
                ]
                for r in queue["results"]
            ],
            ["POS", "TEAM", "NAME", "REQUEST", "WAIT", "REASON"],
        ),
    ]
    return "\n".join(lines)


def top(argv: Sequence[str]) -> int:
    parser = _parser("top", "A live view of the cluster; q or Ctrl-C quits.")
    parser.add_argument("--once", action="store_true", help="print one frame and exit (scripts, tests)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        client = Client.from_config()
        if args.json:
            _print_json(
                {
                    "cluster": client.get("/api/v1/cluster/"),
                    "nodes": client.get_all("/api/v1/cluster/nodes/", limit=2000),
                    "queue": client.get("/api/v1/queue/", page_size=10)["results"],
                }
            )
            return ExitCode.OK
        if args.once or not sys.stdin.isatty():
            print(_top_frame(client))
            return ExitCode.OK
        return _top_live(client, args.interval)

    return _run(handle, args)


def _top_live(client: Client, interval: float) -> int:
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        sys.stdout.write("\x1b[?25l")  # hide the cursor
        while True:
            frame = _top_frame(client)
            sys.stdout.write("\x1b[H\x1b[2J" + frame + "\n\n(q to quit)\n")
            sys.stdout.flush()
            ready, _, _ = select.select([sys.stdin], [], [], interval)
            if ready and sys.stdin.read(1).lower() == "q":
                return ExitCode.OK
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        sys.stdout.write("\x1b[?25h\n")
        sys.stdout.flush()

"""Who you are and what you have used: `tessera login`, `whoami` (teams, quotas, priority classes) and `usage`
(GPU-hours, sacct)."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from cli.client import DEFAULT_URL, Client, ExitCode, config_load, config_save
from cli.output import command_parser, mib, print_json, run_command, table
from cli.sso import sso_token


def login(argv: Sequence[str]) -> int:
    parser = command_parser("login", "Get a personal API token and store it in the config file.")
    parser.add_argument(
        "--url", default=None, help=f"the portal's address (default: saved, else {DEFAULT_URL})"
    )
    parser.add_argument("--username", "-u", help="default: $USER")
    parser.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    parser.add_argument("--token", help="store this existing token instead of logging in with a password")
    parser.add_argument(
        "--sso",
        action="store_true",
        help="sign in with the site's single sign-on, in a browser (a device code)",
    )
    parser.add_argument("--name", default=None, help="a name for the token (default: tessera CLI on <host>)")
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        saved = config_load()
        url = (args.url or saved.get("url") or DEFAULT_URL).rstrip("/")
        token = args.token
        if not token and args.sso:
            token = sso_token(url=url, name=args.name or f"tessera CLI on {os.uname().nodename}")
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
            print_json({"url": url, "username": me["username"], "config": str(path)})
        else:
            teams = ", ".join(t["team"] for t in me["teams"]) or "no teams"
            print(f"Logged in to {url} as {me['username']} ({teams}). Token saved in {path}.")
        return ExitCode.OK

    return run_command(handle, args)


def whoami(argv: Sequence[str]) -> int:
    args = command_parser("whoami", "Who the saved token belongs to.").parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        client = Client.from_config()
        me = client.whoami()
        mine = {t["team"] for t in me["teams"]}
        details = {t["slug"]: t for t in client.get_all("/api/v1/teams/", limit=1000) if t["slug"] in mine}
        if args.json:
            print_json(
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

    return run_command(handle, args)


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


def _moment(raw: str) -> datetime | None:
    """A day (midnight UTC) or an RFC 3339 date-time, as the API reads them; None when it is neither (the server
    then names the problem)."""
    try:
        moment = datetime.fromisoformat(raw.replace("z", "Z"))
    except ValueError:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def usage_window(since: str | None, until: str | None) -> tuple[str, str]:
    """`since` and `until` as sent: the defaults made explicit (until now, since 30 days before until)."""
    now = datetime.now(UTC).replace(microsecond=0)
    until = until or now.strftime("%Y-%m-%dT%H:%M:%SZ")
    if since is None:
        end = _moment(until)
        since = (end - timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ") if end is not None else None
    return since, until


def _shown(raw: str | None) -> str:
    moment = _moment(raw or "")
    if moment is None:
        return raw or "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def usage(argv: Sequence[str]) -> int:
    parser = command_parser(
        "usage", "GPU-hours (whole-GPU equivalents) by team, user and/or day (sacct-like)."
    )
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
        # The window is sent whole, so the total below can say what it counts (the server's defaults are the same:
        # 30 days before until, until now).
        since, until = usage_window(args.since, args.until)
        params = {
            "since": since,
            "until": until,
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
            print_json(rows)
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
        print(f"\nTotal: {total:.2f} GPU-hours from {_shown(since)} to {_shown(until)}")
        return ExitCode.OK

    return run_command(handle, args)

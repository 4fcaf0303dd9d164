"""`tessera submit`: a job from a spec file, a script with #TESSERA lines or flags (sbatch), and the name a job
gets when it names none."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cli.client import ApiError, Client, ExitCode
from cli.output import command_parser, print_json, run_command
from portal.submit_flags import COUNTS, REPEATED, SESSION_TEMPLATES, SUBMIT_FLAGS

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
    parser = command_parser(
        "submit", "Submit a job from a spec file, a script with #TESSERA lines, or flags."
    )
    parser.add_argument("file", nargs="?", help="job spec (.yaml/.json) or a script; flags override it")
    for flags, field, text in SUBMIT_FLAGS:
        kwargs: dict[str, Any] = {"dest": field, "help": text.replace("%", "%%")}  # argparse formats help
        if field in REPEATED:
            kwargs["action"] = "append"
        parser.add_argument(*flags, **kwargs)
    parser.add_argument("--env", "-e", action="append", default=[], metavar="NAME=VALUE", help="repeatable")
    parser.add_argument("--no-preempt", action="store_true", help="ask not to be preempted")
    parser.add_argument(
        "--idempotency-key", help="retries with the same key submit once (default: a fresh key)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the spec that would be sent")
    parser.add_argument(
        "--template",
        choices=sorted(SESSION_TEMPLATES),
        help="start from a session template (name, command, web port, kind); flags and the command after -- win",
    )
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
        if args.template:
            template = SESSION_TEMPLATES[args.template]
            spec.update({k: template[k] for k in ("name", "command", "ports", "kind")})
        if args.file:
            try:
                read, _ = _read_spec_file(args.file)
                spec.update(read)
            except (OSError, ValueError) as exc:
                print(f"tessera submit: cannot read {args.file}: {exc}", file=sys.stderr)
                return ExitCode.USAGE
        for _, field, _ in SUBMIT_FLAGS:
            value = getattr(args, field)
            if value is not None:
                spec[field] = value
        for field in COUNTS:
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
            print_json(spec)
            return ExitCode.OK
        client = Client.from_config()
        try:
            job = client.submit(spec, idempotency_key=args.idempotency_key)
        except ApiError as exc:
            raise _team_hint(client, exc) from None
        if args.json:
            print_json(job)
        else:
            print(f"Submitted job {job['id']} ({job['name']}) to {job['team']}: {job['state']}")
            if job.get("pending_reason"):
                print(f"  {job['pending_reason']}")
        return ExitCode.OK

    return run_command(handle, args)


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

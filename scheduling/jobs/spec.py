"""Job specs as people write them (YAML or JSON, with units such as "10GiB", "2h", "500m") into a JobSpec.

Each field is read as its kind is written and bounded as the spec's one definition says (scheduling.jobs.fields);
a refusal names the field and the limit. Whether the cluster can ever run the job is
`validation.job_spec_validate`'s call.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from scheduling.errors import ServiceError
from scheduling.jobs import fields as f
from scheduling.jobs.documents import SpecError, check_shape, load_document
from scheduling.jobs.fields import (
    CANNOT_RUN,
    INCOMPATIBLE,
    MAX_CHECKPOINT_INTERVAL_S,
    MAX_COMMAND_CHARS,
    MAX_CPU_MILLI,
    MAX_ENV_VALUE_CHARS,
    MAX_ENV_VARS,
    MAX_GPU_MODELS,
    MAX_HOST_MEMORY_MIB,
    MAX_RUNTIME_S,
    MAX_SPEC_INT,
    MAX_WORKDIR_CHARS,
    MIN_CHECKPOINT_INTERVAL_S,
    OUT_OF_RANGE,
    JobSpec,
    SpecField,
)
from scheduling.jobs.validation import largest_slice_mib
from scheduling.notifications.services import parse_events

_BYTES_PER_UNIT = {
    "": None,  # a bare number is refused for memory: "10" could mean anything
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}
_SECONDS_PER_UNIT = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
# The written forms, ASCII only (a Unicode digit or space is no part of a quantity); the API's schema states the
# same patterns (scheduling/jobs/api/spec_schema.py).
DIGITS = r"[0-9]+"
SIZE = (
    r" *[0-9]+(\.[0-9]+)? *("
    + "|".join("".join(f"[{c.lower()}{c.upper()}]" for c in unit) for unit in _BYTES_PER_UNIT if unit)
    + ") *"
)
DURATION = r" *([0-9]+(\.[0-9]+)?|([0-9]+(\.[0-9]+)? *([dDhHsS]|[mM]([iI][nN])?|[sS][eE][cC]) *)+) *"
CPU = r" *[0-9]+(\.[0-9]+)?m? *"
DECIMAL = r" *[0-9]+(\.[0-9]+)? *"
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_QUANTITY = re.compile(r" *([0-9]+(?:\.[0-9]+)?) *([A-Za-z]*) *")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?) *(d|h|min|m|sec|s)", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class ParsedSpec:
    team: str | None
    spec: JobSpec


def _absent(value: Any, *also: Any) -> bool:
    """None, or one of `also` (compared as values: False is not 0 here)."""
    return value is None or (not isinstance(value, bool) and value in also)


def _shown(value: Any) -> str:
    """A value for an error message: short, and never an error itself (repr of a huge int raises)."""
    try:
        text = repr(value)
    except ValueError:
        return "a number of more than 4300 digits"
    return text if len(text) <= 60 else f"{text[:57]}..."


def _int_in(field: str, value: Any, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str | float):
        raise SpecError(f"{field} must be a whole number (got {_shown(value)}).", field=field)
    if isinstance(value, str) and not re.fullmatch(f"-?{DIGITS}", value):
        raise SpecError(f"{field} must be a whole number (got {_shown(value)}).", field=field)
    if isinstance(value, str):  # "-1" from a form is a whole number below the range, and said to be
        negative, digits = value.startswith("-"), value.removeprefix("-").lstrip("0") or "0"
        if len(digits) > 20:  # out of any range here (and int() refuses more than 4300 digits)
            number = low - 1 if negative else high + 1
        else:
            number = -int(digits) if negative else int(digits)
    else:
        number = value
    if isinstance(number, float):
        if not number.is_integer():  # NaN and infinities too
            raise SpecError(f"{field} must be a whole number (got {_shown(value)}).", field=field)
        number = int(number)
    if number < low:
        raise SpecError(
            f"{field} must be at least {low} (got {_shown(number)}).",
            field=field,
            limit=low,
            code=OUT_OF_RANGE,
        )
    if number > high:
        raise SpecError(
            f"{field} must be at most {high} (got {_shown(number)}).",
            field=field,
            limit=high,
            code=OUT_OF_RANGE,
        )
    return number


def parse_memory_mib(value: Any, *, field: str = "memory", high: int = MAX_HOST_MEMORY_MIB) -> int:
    """'10GiB' -> 10240, '512MiB' -> 512, '80GB' -> 76294 (decimal units, rounded up to whole MiB)."""
    if isinstance(value, bool):
        raise SpecError(f"{field} must be a size such as '10GiB' (got {value!r}).", field=field)
    if isinstance(value, int | float):
        raise SpecError(
            f"{field} needs a unit, e.g. '{value}GiB' or '{value}MiB' (or give {field}_mib as a number).",
            field=field,
        )
    match = _QUANTITY.fullmatch(value) if isinstance(value, str) else None
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _BYTES_PER_UNIT:
        raise SpecError(
            f"{field} must be a size such as '10GiB', '512MiB' or '80GB' (got {value!r}).", field=field
        )
    if _BYTES_PER_UNIT[unit] is None:
        raise SpecError(f"{field} needs a unit, e.g. '{match.group(1)}GiB' (got {value!r}).", field=field)
    mib = math.ceil(Decimal(match.group(1)) * _BYTES_PER_UNIT[unit] / (1024**2))
    if mib > high:
        raise SpecError(
            f"{field} must be at most {high} MiB (got {_shown(value)}).",
            field=field,
            limit=f"{high}MiB",
            code=OUT_OF_RANGE,
        )
    return int(mib)


def _duration_seconds(value: Any, *, field: str) -> float:
    """'1h30m' -> 5400.0, 90 -> 90.0 (a bare number is seconds); an int beyond any float is infinite."""
    if isinstance(value, bool):
        raise SpecError(f"{field} must be a duration such as '2h' (got {_shown(value)}).", field=field)
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # an int beyond any float: certainly over the limit
            return math.inf
    text = str(value).strip(" ")
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        return float(text)
    if isinstance(value, str) and re.fullmatch(DURATION, value):
        return sum(float(n) * _SECONDS_PER_UNIT[u.lower()] for n, u in _DURATION_PART.findall(text))
    raise SpecError(
        f"{field} must be a duration such as '2h', '30m', '90s' or '1h30m' (got {_shown(value)}).",
        field=field,
    )


def parse_duration_s(value: Any, *, field: str = "max_runtime") -> int:
    """'2h' -> 7200, '30m' -> 1800, '90s' -> 90, '1h30m' -> 5400, 3600 -> 3600 (a bare number is seconds)."""
    seconds = _duration_seconds(value, field=field)
    if seconds <= 0:
        raise SpecError(
            f"{field} must be positive (got {_shown(value)}).", field=field, limit=1, code=OUT_OF_RANGE
        )
    if seconds > MAX_RUNTIME_S:
        raise SpecError(
            f"{field} must be at most {MAX_RUNTIME_S} s (365 days) (got {_shown(value)}).",
            field=field,
            limit=MAX_RUNTIME_S,
            code=OUT_OF_RANGE,
        )
    return math.ceil(seconds)


def parse_checkpoint_interval_s(value: Any, *, field: str = "checkpoint_interval") -> int:
    """How often a job checkpoints, in whole seconds from 1 minute to 7 days: '30m' -> 1800, 600 -> 600."""
    seconds = _duration_seconds(value, field=field)
    # Whole up to float error: '1.1m' is 66 s, though 1.1 * 60 is 66.00000000000001.
    whole = round(seconds) if math.isfinite(seconds) else None
    if whole is None or abs(seconds - whole) > 1e-6:
        raise SpecError(
            f"{field} must be a whole number of seconds (got {_shown(value)}).",
            field=field,
            code=OUT_OF_RANGE,
        )
    low, high = MIN_CHECKPOINT_INTERVAL_S, MAX_CHECKPOINT_INTERVAL_S
    if not low <= whole <= high:
        raise SpecError(
            f"{field} must be between {low} s (1m) and {high} s (7d) (got {_shown(value)}).",
            field=field,
            limit=low if whole < low else high,
            code=OUT_OF_RANGE,
        )
    return whole


def parse_cpu_milli(value: Any, *, field: str = "cpu") -> int:
    """'4' or 4 -> 4000 (cores), '500m' -> 500 (millicores), 0.5 -> 500."""
    if isinstance(value, bool):
        raise SpecError(f"{field} must be cores such as '4' or millicores such as '500m'.", field=field)
    if isinstance(value, int) and value > MAX_CPU_MILLI:  # before str(): a huge int cannot be printed
        raise SpecError(
            f"{field} must be at most {MAX_CPU_MILLI // 1000} cores (got {_shown(value)}).",
            field=field,
            limit=MAX_CPU_MILLI // 1000,
            code=OUT_OF_RANGE,
        )
    # A number is cores as Decimal reads its digits (0.5, 1e-3); text is cores or millicores as written.
    text = format(Decimal(str(value)), "f") if isinstance(value, int | float) else value
    match = re.fullmatch(r" *([0-9]+(?:\.[0-9]+)?)(m?) *", text) if isinstance(text, str) else None
    if not match:
        raise SpecError(
            f"{field} must be cores such as '4' or '0.5', or millicores such as '500m' (got {_shown(value)}).",
            field=field,
        )
    milli = Decimal(match.group(1)) if match.group(2) else Decimal(match.group(1)) * 1000
    if milli != milli.to_integral_value():
        raise SpecError(
            f"{field} is counted in whole millicores (got {_shown(value)}).",
            field=field,
            limit="1m",
            code=OUT_OF_RANGE,
        )
    if milli < 1:
        raise SpecError(
            f"{field} must be at least 1m (got {_shown(value)}).", field=field, limit="1m", code=OUT_OF_RANGE
        )
    if milli > MAX_CPU_MILLI:
        raise SpecError(
            f"{field} must be at most {MAX_CPU_MILLI // 1000} cores (got {_shown(value)}).",
            field=field,
            limit=MAX_CPU_MILLI // 1000,
            code=OUT_OF_RANGE,
        )
    return int(milli)


def _bool(field: str, value: Any) -> bool:
    """A boolean as JSON and YAML write one (YAML's yes/no/on/off are booleans already); text is refused."""
    if isinstance(value, bool):
        return value
    raise SpecError(f"{field} must be true or false (got {_shown(value)}).", field=field)


def _str(field: str, value: Any, *, high: int) -> str:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise SpecError(f"{field} must be text (got {type(value).__name__}).", field=field)
    text = str(value)
    if "\x00" in text:
        raise SpecError(f"{field} must not contain NUL characters.", field=field)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (a "\ud800" escape): no text can be stored or run with it
        raise SpecError(
            f"{field} is not valid text (it holds a lone surrogate character).", field=field
        ) from None
    if len(text) > high:
        raise SpecError(
            f"{field} must be at most {high} characters (got {len(text)}).",
            field=field,
            limit=high,
            code=OUT_OF_RANGE,
        )
    return text


def _command(value: Any) -> str:
    if isinstance(value, list):
        if not all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in value):
            raise SpecError("command must be a string or a list of strings.", field="command")
        value = shlex.join(str(v) for v in value)
    return _str("command", value, high=MAX_COMMAND_CHARS)


def _workdir(value: Any) -> str:
    """An absolute path on the node (the job starts there; it is not created for it)."""
    path = _str("workdir", value, high=MAX_WORKDIR_CHARS).strip()
    if not path.startswith("/"):
        raise SpecError(
            f"workdir must be an absolute path on the node, e.g. /data/run1 (got {path!r}).", field="workdir"
        )
    return path


def _env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError("env must be a mapping of NAME: value.", field="env")
    if len(value) > MAX_ENV_VARS:
        raise SpecError(
            f"env may hold at most {MAX_ENV_VARS} variables (got {len(value)}).",
            field="env",
            limit=MAX_ENV_VARS,
            code=OUT_OF_RANGE,
        )
    env = {}
    for name, raw in value.items():
        if not isinstance(name, str) or not re.fullmatch(ENV_NAME, name):
            raise SpecError(f"env name {name!r} is not a valid variable name.", field="env")
        if isinstance(raw, dict | list) or raw is None:
            raise SpecError(f"env {name} must be a plain value.", field="env")
        text = str(raw).lower() if isinstance(raw, bool) else str(raw)
        env[name] = _str("env", text, high=MAX_ENV_VALUE_CHARS)
    return env


def _gpu_models(value: Any) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v.strip() for v in items):
        raise SpecError(
            "gpu_models must be a list of model names, e.g. [A100-80GB, H100-80GB].", field="gpu_models"
        )
    if len(items) > MAX_GPU_MODELS:
        raise SpecError(
            f"gpu_models may list at most {MAX_GPU_MODELS} models.",
            field="gpu_models",
            limit=MAX_GPU_MODELS,
            code=OUT_OF_RANGE,
        )
    return tuple(v.strip() for v in items)


def _compute_capability(value: Any) -> Decimal:
    try:
        if isinstance(value, bool) or (isinstance(value, str) and not re.fullmatch(DECIMAL, value)):
            raise InvalidOperation
        number = Decimal(value if isinstance(value, int) else str(value).strip(" "))
    except InvalidOperation:
        raise SpecError(
            f"min_compute_capability must be a number such as 8.0 (got {_shown(value)}).",
            field="min_compute_capability",
        ) from None
    if not number.is_finite() or number < 0 or number > Decimal("99.9"):
        raise SpecError(
            f"min_compute_capability must be between 0 and 99.9 (got {_shown(value)}).",
            field="min_compute_capability",
            limit="99.9",
            code=OUT_OF_RANGE,
        )
    return number.quantize(Decimal("0.1"))


def _refuse_odd_numbers(field: str, value: Any) -> None:
    """NaN and infinities (YAML's .nan and .inf) are no quantity, and no field needs an integer beyond 64 bits
    (str() of one past 4300 digits raises): refuse them wherever they sit in a field."""
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(f"{field} must be a finite number (got {value!r}).", field=field)
    if isinstance(value, int | float) and not isinstance(value, bool) and abs(value) > MAX_SPEC_INT:
        raise SpecError(
            f"{field} must be a number of at most {MAX_SPEC_INT} (got {_shown(value)}).",
            field=field,
            limit=MAX_SPEC_INT,
            code=OUT_OF_RANGE,
        )
    if isinstance(value, dict):
        for item in value.values():
            _refuse_odd_numbers(field, item)
    elif isinstance(value, list):
        for item in value:
            _refuse_odd_numbers(field, item)


def _given(field: SpecField, value: Any) -> bool:
    """Whether a field counts as given: null never does; blank text, and a size of 0 where 0 means none, do not."""
    if value is None:
        return False
    if value == "" and field.kind in (f.TEXT, f.DURATION, f.DIRECTORY, f.MODELS, f.IMAGE, f.NAMES):
        return False
    return not (field.zero_is_none and _absent(value, 0, "0"))


def _read(field: SpecField, value: Any, *, written_as: str) -> Any:
    """One field's value in JobSpec's unit, read as its kind is written; refusals name the key as written."""
    name = field.name
    match field.kind:
        case f.TEXT:
            return _str(name, value, high=field.high).strip()
        case f.COMMAND:
            return _command(value)
        case f.ENV:
            return _env(value)
        case f.COUNT:
            return _int_in(name, value, low=field.low, high=field.high)
        case f.SIZE:
            mib = parse_memory_mib(value, field=name, high=field.high)
            if mib < 1 and not field.zero_is_none:
                raise SpecError(f"{name} must be at least 1MiB.", field=name, limit="1MiB", code=OUT_OF_RANGE)
            return mib
        case f.MODELS:
            return _gpu_models(value)
        case f.CAPABILITY:
            return _compute_capability(value)
        case f.CHOICE:
            if value not in field.choices:
                raise SpecError(
                    f"{name} must be one of {', '.join(field.choices)} (got {value!r}).", field=name
                )
            return value
        case f.CPU:
            return parse_cpu_milli(value, field=name)
        case f.FLAG:
            return _bool(name, value)
        case f.DURATION if field.low:  # a bounded interval (checkpoints): whole seconds between its bounds
            return parse_checkpoint_interval_s(value, field=written_as)
        case f.DURATION:
            return parse_duration_s(value, field=written_as)
        case f.DIRECTORY:
            return _workdir(value)
        case f.DEPENDENCIES:
            return parse_dependencies(value, high=field.high or f.MAX_DEPENDENCIES)
        case f.PORTS:
            return parse_ports(value, high=field.high or f.MAX_PORTS)
        case f.IMAGE:
            return _image(value, high=field.high or f.MAX_IMAGE_CHARS)
        case f.NAMES:
            return _names(name, value, high=field.high or f.MAX_MOUNTS)
        case f.EVENT_LIST:
            try:
                return tuple(parse_events(value, field=name))
            except ServiceError as exc:
                raise SpecError(exc.message, field=name) from None
    raise AssertionError(f"no reader for the kind {field.kind!r} of {name}")


def _image(value: Any, *, high: int) -> str:
    image = _str("image", value, high=high).strip()
    if image and not re.fullmatch(f.IMAGE_REFERENCE, image):
        raise SpecError(
            f"image must be an image reference such as nvcr.io/nvidia/pytorch:24.05-py3: letters, digits and "
            f"._/:@+- only, starting with a letter or digit (got {_shown(image)}).",
            field="image",
        )
    return image


def _names(field: str, value: Any, *, high: int) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise SpecError(
            f"{field} must be names: a list, or joined by commas (datasets,scratch).", field=field
        )
    names = [v.strip() for v in items if v.strip()]
    bad = next((n for n in names if not re.fullmatch(f.MOUNT_NAME, n)), None)
    if bad is not None:
        raise SpecError(
            f"{field}: a name is a lower-case word of at most 31 letters, digits and '-', starting with a letter "
            f"(got {_shown(bad)}).",
            field=field,
        )
    if len(names) > high:
        raise SpecError(
            f"{field} may name at most {high} (got {len(names)}).", field=field, limit=high, code=OUT_OF_RANGE
        )
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise SpecError(f"{field} names {twice!r} twice.", field=field, code=INCOMPATIBLE)
    return tuple(names)


def parse_ports(value: Any, *, high: int) -> tuple[tuple[str, int], ...]:
    """`jupyter:8888,tensorboard:6006` (the CLI's --port, repeated, comes as a list of such), or a list of
    {name, port}: ((name, port), ...) in the order given, each name and each port once."""
    forms = "name:port joined by commas (jupyter:8888), or a list of {name, port}"
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list):
        raise SpecError(f"ports is {forms}.", field="ports")
    ports: list[tuple[str, int]] = []
    for item in items:
        if isinstance(item, str):
            name, _, port = item.strip().partition(":")
        elif isinstance(item, dict) and set(item) == {"name", "port"}:
            name, port = item["name"], item["port"]
        else:
            raise SpecError(
                f"ports: each item is name:port or {{name, port}} (got {_shown(item)}).", field="ports"
            )
        if not isinstance(name, str) or not re.fullmatch(f.PORT_NAME, name):
            raise SpecError(
                f"ports: a name is a lower-case word of at most 31 letters, digits and '-', starting with a "
                f"letter (got {_shown(name)}).",
                field="ports",
            )
        ports.append((name, _int_in("ports", port, low=f.MIN_PORT, high=f.MAX_PORT)))
    if len(ports) > high:
        raise SpecError(
            f"ports may list at most {high} ports (got {len(ports)}).",
            field="ports",
            limit=high,
            code=OUT_OF_RANGE,
        )
    for i, what in ((0, "name"), (1, "port")):
        seen = [p[i] for p in ports]
        twice = next((x for x in seen if seen.count(x) > 1), None)
        if twice is not None:
            raise SpecError(f"ports gives the {what} {twice!r} twice.", field="ports", code=INCOMPATIBLE)
    return tuple(ports)


def ports_written(ports: Any) -> str:
    """Ports as the CLI and the form write them: jupyter:8888,tensorboard:6006."""
    return ",".join(f"{name}:{port}" for name, port in (ports or ()))


_SINGLETON = (0, "singleton")  # `singleton` written among the dependencies: the flag, not a job


def parse_dependencies(value: Any, *, high: int) -> tuple[tuple[int, str], ...]:
    """sbatch's `afterok:123:456,afterany:789,singleton`, or a list of {job: 123, when: succeeded}: ((job, when),
    ...) in the order given, each job once. Refusals name `depends_on` and say the forms."""
    forms = (
        "afterok:<job>, afterany:<job>, afternotok:<job>, aftercorr:<array> or singleton, joined by commas"
    )
    deps: list[tuple[int, str]] = []
    if isinstance(value, str):
        for part in value.replace(" ", "").split(","):
            kind, _, jobs = part.partition(":")
            if kind == "singleton" and not jobs:
                deps.append(_SINGLETON)
                continue
            when = f.SLURM_DEPENDENCY.get(kind) or (kind if kind in f.DEPENDENCY_WHEN else None)
            if when is None or not jobs:
                raise SpecError(f"depends_on: {part[:40]!r} is not one of {forms}.", field="depends_on")
            for job in jobs.split(":"):
                deps.append((_dependency_job(job), when))
    elif isinstance(value, list):
        for item in value:
            if not isinstance(item, dict) or set(item) - {"job", "when", "each_task"} or "job" not in item:
                raise SpecError(
                    "depends_on: each item is {job: <id>, when: succeeded|ended|failed, each_task: true|false} "
                    "(when defaults to succeeded).",
                    field="depends_on",
                )
            when = item.get("when", "succeeded")
            if when not in f.DEPENDENCY_WHEN:
                raise SpecError(
                    f"depends_on: when must be one of {', '.join(f.DEPENDENCY_WHEN)} (got {str(when)[:40]!r}).",
                    field="depends_on",
                )
            each = item.get("each_task", False)
            if not isinstance(each, bool) or (each and when != "succeeded"):
                raise SpecError(
                    "depends_on: each_task is true or false, and true only with when: succeeded (sbatch's "
                    "aftercorr).",
                    field="depends_on",
                )
            deps.append((_dependency_job(item["job"]), f.EACH_TASK if each else when))
    else:
        raise SpecError(f"depends_on is a text ({forms}) or a list of {{job, when}}.", field="depends_on")
    jobs = [job for job, _ in deps if (job, _) != _SINGLETON]
    if len(jobs) > high:
        raise SpecError(
            f"depends_on names at most {high} jobs (got {len(jobs)}).",
            field="depends_on",
            limit=high,
            code=OUT_OF_RANGE,
        )
    twice = sorted({job for job in jobs if jobs.count(job) > 1})
    if twice:
        raise SpecError(f"depends_on names job {twice[0]} twice.", field="depends_on", code=f.BAD_DEPENDENCY)
    return tuple(deps)


def dependencies_written(depends_on: list[dict[str, Any]], *, singleton: bool = False) -> str:
    """Dependencies as sbatch writes them (afterok:123,afterany:45,singleton): the submit form's text."""
    words = {when: word for word, when in f.SLURM_DEPENDENCY.items()}
    parts = [f"{words[f.EACH_TASK if d.get('each_task') else d['when']]}:{d['job']}" for d in depends_on]
    return ",".join([*parts, "singleton"] if singleton else parts)


def _dependency_job(value: Any) -> int:
    if isinstance(value, bool) or not (
        isinstance(value, int) or (isinstance(value, str) and value.isascii() and value.isdigit())
    ):
        raise SpecError(f"depends_on: {str(value)[:40]!r} is not a job id.", field="depends_on")
    job = int(value)
    if not 1 <= job <= 2**31 - 1:
        raise SpecError(f"depends_on: {job} is not a job id.", field="depends_on")
    return job


def spec_from_mapping(data: Any) -> ParsedSpec:
    """Turn a decoded spec (a dict from YAML or JSON) into a JobSpec, refusing unknown keys and bad values."""
    check_shape(data)
    if not isinstance(data, dict):
        raise SpecError("A job spec must be a mapping of fields (name, command, gpus, ...).", field="spec")
    given: dict[str, Any] = {}
    written_as: dict[str, str] = {}
    for key, value in data.items():
        alias = f.ALIAS.get(key)
        name = alias.field if alias else key
        if name not in f.FIELD:
            raise SpecError(
                f"Unknown field {key!r}; a spec may have: {', '.join(f.FIELD_NAMES)}.", field=str(key)
            )
        if name in given:
            raise SpecError(
                f"{name} is given twice ({key!r} is another name for it).", field=name, code=INCOMPATIBLE
            )
        _refuse_odd_numbers(name, value)
        if alias and alias.unit:  # a unit-free alias carries the model's unit: write it as the field is
            value = f"{_int_in(name, value, low=alias.low, high=alias.high)}{alias.unit}"
        given[name] = value
        written_as[name] = str(key)

    for required in f.REQUIRED:
        if given.get(required) in (None, ""):
            raise SpecError(f"{required} is required.", field=required)
    values = {
        field.name: _read(field, given[field.name], written_as=written_as[field.name])
        for field in f.FIELDS
        if _given(field, given.get(field.name))
    }
    for required in f.REQUIRED:
        if not str(values[required]).strip():
            raise SpecError(f"{required} must not be empty.", field=required)
    if not values.get("gpus") and not values.get("gpu_memory") and not values.get("compute_pct"):
        raise SpecError(
            "Ask for GPUs: set gpus (whole cards) or gpu_memory and/or compute_pct (a slice of one card).",
            field="gpus",
            code=INCOMPATIBLE,
        )
    if values.get("ports") and values.get("array"):
        raise SpecError(
            "ports are for one job (a session); an array's tasks cannot share them.",
            field="ports",
            code=INCOMPATIBLE,
        )
    if values.get("mounts") and not values.get("image"):
        raise SpecError(
            "mounts are for a job in an image: a job on the node itself sees the node's files.",
            field="mounts",
            code=INCOMPATIBLE,
        )
    kwargs = {f.FIELD[name].attr: value for name, value in values.items() if f.FIELD[name].attr}
    if _SINGLETON in kwargs.get("depends_on", ()):  # sbatch's -d singleton: the flag
        kwargs["depends_on"] = tuple(d for d in kwargs["depends_on"] if d != _SINGLETON)
        kwargs["singleton"] = True
    return ParsedSpec(team=values.get("team") or None, spec=JobSpec(**kwargs))


def spec_field_errors(data: dict[str, Any]) -> dict[str, str]:
    """Each given field's own refusal, all of them at once (field -> message): what the form shows beside every
    field it concerns, where spec_from_mapping stops at the first. Unknown keys and cross-field rules are
    spec_from_mapping's."""
    errors: dict[str, str] = {}
    for key, value in data.items():
        alias = f.ALIAS.get(key)
        field = f.FIELD.get(alias.field if alias else key)
        if field is None or field.name in errors or not _given(field, value):
            continue
        try:
            _refuse_odd_numbers(field.name, value)
            if alias and alias.unit:
                value = f"{_int_in(field.name, value, low=alias.low, high=alias.high)}{alias.unit}"
            _read(field, value, written_as=str(key))
        except SpecError as exc:
            errors[field.name] = exc.message
    return errors


def spec_from_text(text: str | bytes) -> ParsedSpec:
    """Parse a YAML or JSON document (JSON is YAML) into a spec; `documents.load_document` bounds it first."""
    return spec_from_mapping(load_document(text))


def spec_to_mapping(spec: JobSpec, *, team: str | None = None) -> dict[str, Any]:
    """The spec back in the written form (units as strings), for "copy & edit" and `tessera show`."""
    out: dict[str, Any] = {"name": spec.name}
    if team:
        out["team"] = team
    out["command"] = spec.command
    if spec.env:
        out["env"] = dict(spec.env)
    if spec.gpus:
        out["gpus"] = spec.gpus
    if spec.gpu_memory_mib:
        out["gpu_memory"] = format_mib(spec.gpu_memory_mib)
    if spec.compute_pct:
        out["compute_pct"] = spec.compute_pct
    if spec.gpu_models:
        out["gpu_models"] = list(spec.gpu_models)
    if spec.min_gpu_memory_mib:
        out["min_gpu_memory"] = format_mib(spec.min_gpu_memory_mib)
    if spec.min_compute_capability:
        out["min_compute_capability"] = str(spec.min_compute_capability)
    if spec.topology != "none":
        out["topology"] = spec.topology
    if spec.nodes != 1:
        out["nodes"] = spec.nodes
    out["cpu"] = f"{spec.cpu_milli}m" if spec.cpu_milli % 1000 else str(spec.cpu_milli // 1000)
    out["memory"] = format_mib(spec.memory_mib)
    if spec.priority:
        out["priority"] = spec.priority
    if spec.preemptible is not None:
        out["preemptible"] = spec.preemptible
    if spec.max_runtime_s:
        out["max_runtime"] = format_duration(spec.max_runtime_s)
    if spec.checkpoint_interval_s:
        out["checkpoint_interval"] = format_duration(spec.checkpoint_interval_s)
    if not spec.requeue_on_node_loss:
        out["requeue_on_node_loss"] = False
    if spec.workdir:
        out["workdir"] = spec.workdir
    if spec.notify is not None:
        out["notify"] = ",".join(spec.notify) or "none"
    if spec.array:
        out["array"] = spec.array
    if spec.depends_on:
        out["depends_on"] = [
            {"job": job, "when": "succeeded", "each_task": True}
            if when == f.EACH_TASK
            else {"job": job, "when": when}
            for job, when in spec.depends_on
        ]
    if spec.singleton:
        out["singleton"] = True
    if spec.kind != "batch":
        out["kind"] = spec.kind
    if spec.ports:
        out["ports"] = [{"name": name, "port": port} for name, port in spec.ports]
    if spec.image:
        out["image"] = spec.image
    if spec.mounts:
        out["mounts"] = list(spec.mounts)
    return out


def format_mib(mib: int) -> str:
    return f"{mib // 1024}GiB" if mib % 1024 == 0 else f"{mib}MiB"


def format_duration(seconds: int) -> str:
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


def spec_check_card_limits(spec: JobSpec) -> None:
    """Refuse a slice larger than the largest card the spec allows, naming that card's size as the limit.

    validation.job_spec_validate refuses it too (the same rule, `largest_slice_mib`); this only adds the limit."""
    if not spec.gpu_memory_mib:
        return
    largest = largest_slice_mib(spec=spec)
    if largest and spec.gpu_memory_mib > largest:
        raise SpecError(
            f"gpu_memory {spec.gpu_memory_mib} MiB is more than the largest allowed GPU has ({largest} MiB).",
            field="gpu_memory",
            limit=f"{largest}MiB",
            code=CANNOT_RUN,
        )

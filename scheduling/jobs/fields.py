"""The job spec, defined once: its fields, how each is written, its bounds, and the validated `JobSpec`.

The YAML/JSON reader (`scheduling.jobs.spec`), the API's OpenAPI schema (`scheduling.jobs.api.spec_schema`), the
submit form (`frontend.forms`) and the CLI's flags (`portal.submit_flags`) are all derived from `FIELDS` and
`ALIASES`. Pure Python (the CLI imports it and loads neither Django nor Celery).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

# --- Bounds ---------------------------------------------------------------------------------------------------
MAX_NAME_CHARS = 200
MAX_TEAM_CHARS = 100
MAX_PRIORITY_CHARS = 50
MAX_COMMAND_CHARS = 64 * 1024
MAX_ENV_VARS = 256
MAX_ENV_VALUE_CHARS = 32 * 1024
MAX_GPUS_PER_JOB_NODE = 64
MAX_GANG_NODES = 256
MAX_GPU_MEMORY_MIB = 16 * 1024 * 1024  # 16 TiB: far above any card, keeps integers sane
MAX_HOST_MEMORY_MIB = 64 * 1024 * 1024
MAX_CPU_MILLI = 4096 * 1000
MAX_RUNTIME_S = 365 * 24 * 3600
# A job checkpoints at most every minute and at least every week: anything else is surely a unit mistake.
MIN_CHECKPOINT_INTERVAL_S = 60
MAX_CHECKPOINT_INTERVAL_S = 7 * 24 * 3600
MAX_WORKDIR_CHARS = 4096
MAX_GPU_MODELS = 32
MAX_ARRAY_CHARS = 10_000  # scheduling.jobs.array_indexes.MAX_ARRAY_CHARS
MAX_DEPENDENCIES = 64
DEPENDENCY_WHEN = ("succeeded", "ended", "failed")
# sbatch's --dependency words for them (and `singleton`).
SLURM_DEPENDENCY = {"afterok": "succeeded", "afterany": "ended", "afternotok": "failed", "aftercorr": "each"}
# Each task of an array after the task of the same index of another array succeeded (sbatch's aftercorr).
EACH_TASK = "each"
MAX_SPEC_INT = 2**63 - 1  # the database's bigint
TOPOLOGIES = ("none", "numa", "nvlink")  # scheduling.choices.Topology's values
EVENTS = ("start", "end", "fail", "preempt")  # what a submitter may be told of
JOB_KINDS = ("batch", "interactive")  # scheduling.choices.JobKind's values
# Web ports a job serves (notebooks, dashboards), opened through the portal at /jobs/<id>/open/<name>/.
MAX_PORTS = 8
MIN_PORT, MAX_PORT = 1024, 65535  # no privileged port: jobs never run as root
PORT_NAME = r"[a-z][a-z0-9-]{0,30}"
# A container image the job runs in (agent/containers.py): a registry reference such as
# nvcr.io/nvidia/pytorch:24.05-py3, within the team's allowed images (quotas.Team.allowed_images).
MAX_IMAGE_CHARS = 512
IMAGE_REFERENCE = r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*"
# The team's mounts a job in an image asks for, by name (quotas.TeamMount).
MAX_MOUNTS = 16
MOUNT_NAME = r"[a-z][a-z0-9-]{0,30}"

# A spec well formed field by field can still be refused: this cluster can never run it, its fields do not go
# together, or its team may not (the codes a 400 may carry: portal/api_schema.py).
CANNOT_RUN = "cannot_run"
INCOMPATIBLE = "incompatible"
# Beyond "invalid" (against the schema), a bound the schema cannot state for a quantity as written ("20TiB", "0s",
# a digit string).
OUT_OF_RANGE = "out_of_range"
# A dependency on a job that does not exist or is not the submitter's to see, named twice, or already impossible.
BAD_DEPENDENCY = "bad_dependency"
# How a job whose dependency can never be met ends (scheduling/jobs/dependencies.py).
NEVER_SATISFIED = "dependency_never_satisfied"


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A validated-shape job request, in the model's units (MiB, percent of one GPU, millicores, seconds)."""

    name: str
    command: str
    env: dict[str, str] = field(default_factory=dict)
    gpus: int = 0
    gpu_memory_mib: int = 0
    compute_pct: int = 0
    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_mib: int = 0
    min_compute_capability: Decimal = Decimal("0")
    topology: str = "none"
    nodes: int = 1
    cpu_milli: int = 1000
    memory_mib: int = 4096
    priority: str | None = None
    preemptible: bool | None = None
    max_runtime_s: int | None = None
    checkpoint_interval_s: int | None = None  # None: an eviction loses all its work
    requeue_on_node_loss: bool = True
    workdir: str = ""
    notify: tuple[str, ...] | None = None  # start, end, fail, preempt; None: the submitter's default
    array: str = ""  # a job array's tasks, e.g. 0-999%50 (scheduling.jobs.array_indexes); blank: one job
    # The jobs it waits for, each with how it must have ended: ((job id, "succeeded" | "ended" | "failed"), ...);
    # "each": each of its tasks waits for the same task of that array to succeed.
    depends_on: tuple[tuple[int, str], ...] = ()
    singleton: bool = False  # waits while an earlier live job of its owner has its name
    kind: str = "batch"  # batch | interactive (a session: a notebook, a dashboard)
    # Web ports it serves: ((name, port), ...); its agent gives it that port, or another one where the node's is
    # taken, as TESSERA_PORT_<NAME>.
    ports: tuple[tuple[str, int], ...] = ()
    image: str = ""  # blank: a process on the node itself
    mounts: tuple[str, ...] = ()  # names of its team's mounts (only in an image)


# --- Fields ---------------------------------------------------------------------------------------------------
# How a field is written (each kind has one reader in scheduling.jobs.spec and one schema in spec_schema):
TEXT = "text"  # a line of text (a number is taken as its digits)
COMMAND = "command"  # a shell line, or a list of arguments
ENV = "env"  # NAME: value
COUNT = "count"  # a whole number
SIZE = "size"  # memory with its unit: 10GiB, 512MiB, 80GB
MODELS = "models"  # GPU model names: a list or a comma list
CAPABILITY = "capability"  # a CUDA compute capability: 8.0
CHOICE = "choice"  # one of `choices`
CPU = "cpu"  # cores (4, 0.5) or millicores (500m)
FLAG = "flag"  # true or false
DURATION = "duration"  # 2h, 30m, 1h30m, or seconds
DIRECTORY = "directory"  # an absolute path on the node
EVENT_LIST = "events"  # a comma list of EVENTS, all or none
DEPENDENCIES = "dependencies"  # afterok:123,afterany:45 (sbatch --dependency), or a list of {job, when}
PORTS = "ports"  # jupyter:8888,tensorboard:6006, or a list of {name, port}
IMAGE = "image"  # a container image reference: nvcr.io/nvidia/pytorch:24.05-py3
NAMES = "names"  # lower-case names: a list or a comma list (datasets,scratch)


@dataclass(frozen=True, kw_only=True)
class SpecField:
    """One key a spec may carry, as people write it, and where it lands in `JobSpec` (its unit in the name)."""

    name: str
    kind: str
    help: str  # what it is, for the CLI's --help and the API schema's description
    attr: str | None = None  # the JobSpec attribute (None: not part of JobSpec, e.g. team)
    required: bool = False
    low: int = 0  # bounds of a count; `high` also of a size (MiB), a text (characters), a duration (s)
    high: int | None = None
    zero_is_none: bool = False  # a size of 0 means "not asked for"
    choices: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()  # `tessera submit`'s flags for it (none: set it in a spec file)
    flag_help: str = ""  # the CLI's help when it says more than `help`
    label: str = ""  # the submit form's label (blank: the form has no such field)
    form_help: str = ""  # the form's hint under the field


@dataclass(frozen=True, kw_only=True)
class SpecAlias:
    """A second name for a field, in the model's unit (`memory_mib: 4096` is `memory: 4096MiB`)."""

    name: str
    field: str
    kind: str  # how the alias itself is written
    unit: str = ""  # appended to a count to write it as the field is written ("MiB", "m")
    low: int = 0
    high: int | None = None


FIELDS: tuple[SpecField, ...] = (
    SpecField(
        name="name",
        kind=TEXT,
        attr="name",
        required=True,
        high=MAX_NAME_CHARS,
        help="job name",
        flags=("--name", "-J"),
        flag_help="job name (default: the script it runs, e.g. train.py, else its program)",
        label="Name",
        form_help="What you will recognise it by.",
    ),
    SpecField(
        name="team",
        kind=TEXT,
        high=MAX_TEAM_CHARS,
        help="team slug, e.g. ai-lab/training; optional when you are in one team",
        flags=("--team", "-A"),
        label="Team",
    ),
    SpecField(
        name="command",
        kind=COMMAND,
        attr="command",
        required=True,
        high=MAX_COMMAND_CHARS,
        help=f"a shell command, or a list of arguments; at most {MAX_COMMAND_CHARS} characters",
        label="Command",
    ),
    SpecField(
        name="env",
        kind=ENV,
        attr="env",
        high=MAX_ENV_VALUE_CHARS,
        help=f"environment variables, NAME: value; at most {MAX_ENV_VARS}, a value of at most "
        f"{MAX_ENV_VALUE_CHARS} characters",
        label="Environment",
        form_help="One NAME=value a line",
    ),
    SpecField(
        name="gpus",
        kind=COUNT,
        attr="gpus",
        low=0,
        high=MAX_GPUS_PER_JOB_NODE,
        help="whole GPUs per node",
        flags=("--gpus", "-G"),
        label="GPUs per node",
    ),
    SpecField(
        name="gpu_memory",
        kind=SIZE,
        attr="gpu_memory_mib",
        high=MAX_GPU_MEMORY_MIB,
        zero_is_none=True,
        help="a slice of one GPU: its memory, e.g. 10GiB",
        flags=("--gpu-memory",),
        label="GPU memory",
        form_help="e.g. 10GiB",
    ),
    SpecField(
        name="compute_pct",
        kind=COUNT,
        attr="compute_pct",
        low=0,
        high=100,
        help="a slice of one GPU: its compute share, percent of one card",
        flags=("--compute-pct",),
        label="Compute share (%)",
        form_help="1-100 of one card",
    ),
    SpecField(
        name="gpu_models",
        kind=MODELS,
        attr="gpu_models",
        high=MAX_GPU_MODELS,
        help="allowed GPU models (any, if none)",
        flags=("--gpu-model", "-C"),
        flag_help="allowed GPU model (repeat for several)",
        label="GPU models",
        form_help="Leave all unticked for any model",
    ),
    SpecField(
        name="min_gpu_memory",
        kind=SIZE,
        attr="min_gpu_memory_mib",
        high=MAX_GPU_MEMORY_MIB,
        zero_is_none=True,
        help="only GPUs with at least this much memory, e.g. 40GiB",
        flags=("--min-gpu-memory",),
        label="Minimum card memory",
        form_help="e.g. 40GiB",
    ),
    SpecField(
        name="min_compute_capability",
        kind=CAPABILITY,
        attr="min_compute_capability",
        help="only GPUs of at least this CUDA compute capability, e.g. 8.0",
        flags=("--min-compute-capability",),
    ),
    SpecField(
        name="topology",
        kind=CHOICE,
        attr="topology",
        choices=TOPOLOGIES,
        help="how a node's GPUs must be connected: none, numa or nvlink",
        flags=("--topology",),
        label="Topology",
    ),
    SpecField(
        name="nodes",
        kind=COUNT,
        attr="nodes",
        low=1,
        high=MAX_GANG_NODES,
        help="gang size (whole-GPU jobs)",
        flags=("--nodes", "-N"),
        label="Nodes (gang)",
        form_help="More than 1: whole GPUs on each",
    ),
    SpecField(
        name="cpu",
        kind=CPU,
        attr="cpu_milli",
        high=MAX_CPU_MILLI,
        help="CPU per node: cores (4) or millicores (500m)",
        flags=("--cpus", "-c"),
        label="CPU per node",
        form_help="cores (4) or millicores (500m)",
    ),
    SpecField(
        name="memory",
        kind=SIZE,
        attr="memory_mib",
        high=MAX_HOST_MEMORY_MIB,
        help="host memory per node, e.g. 64GiB",
        flags=("--mem",),
        label="Host memory per node",
        form_help="e.g. 64GiB",
    ),
    SpecField(
        name="priority",
        kind=TEXT,
        attr="priority",
        high=MAX_PRIORITY_CHARS,
        help="priority class, e.g. training; blank: the team's default",
        flags=("--priority", "-p"),
        label="Priority class",
    ),
    SpecField(
        name="preemptible",
        kind=FLAG,
        attr="preemptible",
        help="whether the job may be preempted (unset: its priority class decides)",
    ),
    SpecField(
        name="max_runtime",
        kind=DURATION,
        attr="max_runtime_s",
        high=MAX_RUNTIME_S,
        help="run-time limit, e.g. 2h, 30m, 1h30m",
        flags=("--time", "-t"),
        label="Runtime limit",
        form_help="e.g. 2h, 30m, 1h30m",
    ),
    SpecField(
        name="checkpoint_interval",
        kind=DURATION,
        attr="checkpoint_interval_s",
        low=MIN_CHECKPOINT_INTERVAL_S,
        high=MAX_CHECKPOINT_INTERVAL_S,
        help="how often the job checkpoints, e.g. 30m, 2h, 600 (s); whole seconds from 1m to 7d",
        flags=("--checkpoint-every",),
        label="Checkpoints every",
        form_help="Optional, e.g. 30m: preemption prefers jobs that lose the least work",
    ),
    SpecField(
        name="requeue_on_node_loss",
        kind=FLAG,
        attr="requeue_on_node_loss",
        help="start the job again elsewhere when its node is lost (default: true)",
    ),
    SpecField(
        name="workdir",
        kind=DIRECTORY,
        attr="workdir",
        high=MAX_WORKDIR_CHARS,
        help="absolute directory the job starts in on its node (default: the agent's)",
        flags=("--chdir", "-D"),
        label="Working directory",
        form_help="Absolute path on the node; empty: the agent's",
    ),
    SpecField(
        name="array",
        kind=TEXT,
        attr="array",
        high=MAX_ARRAY_CHARS,
        help="run it as a job array: task indexes 0-999, 0-99:10 or 1,3,8, and optionally %N to run at most N at "
        "once; each task gets TESSERA_ARRAY_TASK_ID",
        flags=("--array", "-a"),
        label="Array",
        form_help="Optional: tasks 0-99, 0-99:10 or 1,3,8; %10 runs at most 10 at once",
    ),
    SpecField(
        name="depends_on",
        kind=DEPENDENCIES,
        attr="depends_on",
        high=MAX_DEPENDENCIES,
        help="start only after other jobs ended: afterok:123 (succeeded), afterany:123 (ended), afternotok:123 "
        "(failed), aftercorr:123 (each task of this array after the same task of array 123 succeeded), several "
        "joined by commas, and singleton; or a list of {job: 123, when: succeeded|ended|failed, each_task: true}. "
        "An array counts as all its tasks",
        flags=("--dependency", "-d"),
        label="Starts after",
        form_help="Optional: afterok:123 (after job 123 succeeded), afterany:123, afternotok:123, aftercorr:123, "
        "singleton",
    ),
    SpecField(
        name="singleton",
        kind=FLAG,
        attr="singleton",
        help="wait while an earlier job of yours with the same name is live (sbatch's --dependency=singleton)",
    ),
    SpecField(
        name="kind",
        kind=CHOICE,
        attr="kind",
        choices=JOB_KINDS,
        help="batch (default), or interactive for a session such as a notebook",
        flags=("--kind",),
    ),
    SpecField(
        name="ports",
        kind=PORTS,
        attr="ports",
        high=MAX_PORTS,
        help=f"web ports the job serves, opened through the portal at /jobs/<id>/open/<name>/: name:port "
        f"joined by commas (jupyter:8888), or a list of {{name, port}}; at most {MAX_PORTS}, ports "
        f"{MIN_PORT}-{MAX_PORT}. The job listens on $TESSERA_PORT_<NAME>",
        flags=("--port",),
        flag_help="a web port the job serves, name:port (repeat for several), e.g. jupyter:8888",
        label="Web ports",
        form_help="Optional: name:port, e.g. jupyter:8888; open them from the job's page",
    ),
    SpecField(
        name="image",
        kind=IMAGE,
        attr="image",
        high=MAX_IMAGE_CHARS,
        help="a container image to run the command in, e.g. nvcr.io/nvidia/pytorch:24.05-py3 (one of your "
        "team's allowed images); unset: the command runs on the node itself",
        flags=("--image",),
        label="Image",
        form_help="Optional: a container image, e.g. nvcr.io/nvidia/pytorch:24.05-py3; blank: runs on the node",
    ),
    SpecField(
        name="mounts",
        kind=NAMES,
        attr="mounts",
        high=MAX_MOUNTS,
        help=f"your team's data mounts the job's image gets, by name (datasets,scratch); at most {MAX_MOUNTS}",
        flags=("--mount",),
        flag_help="one of your team's mounts for the job's image, by name (repeat for several), e.g. datasets",
        label="Mounts",
        form_help="Optional, with an image: your team's mounts by name, e.g. datasets",
    ),
    SpecField(
        name="notify",
        kind=EVENT_LIST,
        attr="notify",
        choices=EVENTS,
        help="tell the submitter by email/webhook when the job starts, ends, fails or is preempted: "
        "start,end,fail,preempt, all or none (unset: their default)",
        flags=("--notify",),
        label="Tell me when it",
        form_help="By email or your webhook (your notification settings); none ticked: your default",
    ),
)

ALIASES: tuple[SpecAlias, ...] = (
    SpecAlias(name="gpu_memory_mib", field="gpu_memory", kind=COUNT, unit="MiB", high=MAX_GPU_MEMORY_MIB),
    SpecAlias(
        name="min_gpu_memory_mib", field="min_gpu_memory", kind=COUNT, unit="MiB", high=MAX_GPU_MEMORY_MIB
    ),
    SpecAlias(name="memory_mib", field="memory", kind=COUNT, unit="MiB", low=1, high=MAX_HOST_MEMORY_MIB),
    SpecAlias(name="cpu_milli", field="cpu", kind=COUNT, unit="m", low=1, high=MAX_CPU_MILLI),
    SpecAlias(name="max_runtime_s", field="max_runtime", kind=DURATION),
    SpecAlias(name="checkpoint_interval_s", field="checkpoint_interval", kind=DURATION),
    SpecAlias(name="gpu_model", field="gpu_models", kind=MODELS),
    SpecAlias(name="cwd", field="workdir", kind=DIRECTORY),
)

FIELD = {f.name: f for f in FIELDS}
ALIAS = {a.name: a for a in ALIASES}
FIELD_NAMES = tuple(FIELD)
REQUIRED = tuple(f.name for f in FIELDS if f.required)


# Ready-made sessions (the submit form's templates and `tessera submit --template`; docs/portal.md): each a job's
# spec as the form writes it. Each server listens on its port where the agent put it and serves under the portal's
# path for it.
SESSION_TEMPLATES: dict[str, dict[str, str]] = {
    "jupyter": {
        "label": "Jupyter",
        "name": "notebook",
        "kind": "interactive",
        "ports": "jupyter:8888",
        # Jupyter takes JUPYTER_TOKEN (the portal's secret for the job) as its own token: the proxy sends it, and
        # nothing else on the node can open the notebook.
        "command": 'jupyter lab --no-browser --ip=0.0.0.0 --port="$TESSERA_PORT_JUPYTER" '
        '--ServerApp.base_url="$TESSERA_BASE_URL_JUPYTER"',
    },
    "tensorboard": {
        "label": "TensorBoard",
        "name": "tensorboard",
        "kind": "interactive",
        "ports": "tensorboard:6006",
        # TensorBoard has no sign-in of its own: other jobs on its node can read it (docs/portal.md, "Sessions").
        "command": 'tensorboard --logdir "${LOGDIR:-$HOME/runs}" --bind_all --port "$TESSERA_PORT_TENSORBOARD" '
        '--path_prefix "${TESSERA_BASE_URL_TENSORBOARD%/}"',
    },
    "http": {
        "label": "Plain HTTP port",
        "name": "web",
        "kind": "batch",
        "ports": "web:8080",
        # A server gets the whole path (/jobs/<id>/open/web/...): this one serves a folder laid out under it.
        "command": 'mkdir -p "site$TESSERA_BASE_URL_WEB" && echo "<h1>It works</h1>" > '
        '"site${TESSERA_BASE_URL_WEB}index.html" && python3 -m http.server "$TESSERA_PORT_WEB" --directory site',
    },
}

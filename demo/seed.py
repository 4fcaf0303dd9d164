"""The embedded demo's data: the seed document's case-study cluster, three teams, four people and their jobs.

Idempotent: running it twice leaves one copy of everything. Used by `manage.py load_demo` and `make demo`.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from django.contrib.auth import get_user_model
from django.db import transaction

from demo.history import history_backfill
from demo.workload import STEP_S
from quotas import services as quota_services
from quotas.choices import ChangeSource, Role
from quotas.models import PriorityClass, Quota, Team
from scheduling.choices import ActorKind, JobState, LinkKind, SharingMode, Topology
from scheduling.inventory import services as inventory_services
from scheduling.inventory.models import Gpu, GpuLink, GpuModel, Node
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.ledger import job_release_slices, slice_allocate
from scheduling.jobs.models import Job
from scheduling.jobs.submit import job_submit
from scheduling.jobs.transitions import job_transition

GIB = 1024

GPU_MODELS = [
    {
        "name": "A100-80GB",
        "memory_mib": 80 * GIB,
        "compute_capability": Decimal("8.0"),
        "relative_speed": 1.0,
        "sharing_modes": ["exclusive", "mps", "timeslice", "mig"],
        "mig_profiles": [
            {"name": "1g.10gb", "memory_mib": 10 * GIB, "instances": 7},
            {"name": "2g.20gb", "memory_mib": 20 * GIB, "instances": 3},
            {"name": "3g.40gb", "memory_mib": 40 * GIB, "instances": 2},
            {"name": "7g.80gb", "memory_mib": 80 * GIB, "instances": 1},
        ],
    },
    {
        "name": "H100-80GB",
        "memory_mib": 80 * GIB,
        "compute_capability": Decimal("9.0"),
        "relative_speed": 2.0,
        "sharing_modes": ["exclusive", "mps", "timeslice", "mig"],
        "mig_profiles": [],
    },
    {
        # Profiles as `nvidia-smi mig -lgip` lists them on a real H200 (shared/fixtures/nvml-h200/misc.txt).
        "name": "H200-141GB",
        "memory_mib": 143771,
        "compute_capability": Decimal("9.0"),
        "relative_speed": 2.4,
        "sharing_modes": ["exclusive", "mps", "timeslice", "mig"],
        "mig_profiles": [
            {"name": "1g.18gb", "memory_mib": 16384, "instances": 7},
            {"name": "2g.35gb", "memory_mib": 33280, "instances": 3},
            {"name": "3g.71gb", "memory_mib": 71424, "instances": 2},
            {"name": "7g.141gb", "memory_mib": 143360, "instances": 1},
        ],
    },
    {
        "name": "T4",
        "memory_mib": 15 * GIB,
        "compute_capability": Decimal("7.5"),
        "relative_speed": 0.25,
        "sharing_modes": ["exclusive", "mps", "timeslice"],
        "mig_profiles": [],
    },
]


@dataclass(frozen=True)
class NodeGroup:
    prefix: str
    count: int
    model: str
    gpus: int
    nvlink_count: int  # all-to-all NVLink bonds between the node's GPUs; 0 = PCIe only
    sharing: dict[int, str]  # gpu index -> sharing mode where not exclusive


NODE_GROUPS = [
    NodeGroup("a100", 4, "A100-80GB", 8, 12, {}),
    NodeGroup("h100", 1, "H100-80GB", 8, 18, {}),
    NodeGroup("t4", 1, "T4", 4, 0, {0: SharingMode.TIMESLICE, 1: SharingMode.TIMESLICE}),
]
# One A100 node hosts light inference on MPS slices, as in the seed's remedy.
MPS_NODE = "a100-04"

USERS = [
    # username, password, staff, [(team, role)]
    ("admin", "tessera-admin", True, []),
    ("alice", "tessera-demo", False, [("ai-lab/training", Role.MEMBER)]),
    ("bob", "tessera-demo", False, [("ai-lab/inference", Role.MEMBER)]),
    (
        "carol",
        "tessera-demo",
        False,
        [("ai-lab/training", Role.TEAM_ADMIN), ("ai-lab/inference", Role.TEAM_ADMIN)],
    ),
    ("dave", "tessera-demo", False, [("ai-lab/research", Role.MEMBER)]),
]

TEAMS = [
    # slug, name, guaranteed GiB, limit GiB, guaranteed GPUs, limit GPUs, weight, default priority
    # (training's limit of 16 GPUs / 1280 GiB holds its running 4-GPU finetune and its 2 x 2 GPU gang at once,
    # with room for a new user's 2 x 4 GPU example; submit refuses a job beyond its team's limits)
    ("ai-lab/training", "Training", 320, 1280, "4", "16", "2", "training"),
    ("ai-lab/inference", "Inference", 64, 160, "1", "4", "1", "inference"),
    ("ai-lab/research", "Research", 128, 320, "2", "6", "1", "training"),
]


def _nodes() -> None:
    models = {}
    for spec in GPU_MODELS:
        models[spec["name"]], _ = GpuModel.objects.update_or_create(name=spec["name"], defaults=spec)
    for group in NODE_GROUPS:
        for n in range(1, group.count + 1):
            name = f"{group.prefix}-{n:02d}"
            node, created = Node.objects.get_or_create(
                name=name,
                defaults={
                    "cpu_milli": 128_000 if group.gpus == 8 else 32_000,
                    "memory_mib": 1024 * GIB if group.gpus == 8 else 192 * GIB,
                    "labels": {"rack": f"r{(n + 1) // 2}", "gpu-model": group.model},
                },
            )
            if not created:
                continue
            model = models[group.model]
            gpus = []
            for index in range(group.gpus):
                sharing = group.sharing.get(index, SharingMode.EXCLUSIVE)
                if name == MPS_NODE and index >= 6:
                    sharing = SharingMode.MPS
                gpus.append(
                    Gpu.objects.create(
                        node=node,
                        index=index,
                        uuid=f"GPU-demo-{name}-{index}",
                        model=model,
                        memory_mib=model.memory_mib,
                        numa_node=index * 2 // group.gpus,
                        sharing_mode=sharing,
                        compute_capacity_pct=200 if sharing == SharingMode.TIMESLICE else 100,
                    )
                )
            for i, a in enumerate(gpus):
                for b in gpus[i + 1 :]:
                    if group.nvlink_count:
                        kind, count = LinkKind.NVLINK, group.nvlink_count
                    else:
                        kind, count = (LinkKind.PIX if a.numa_node == b.numa_node else LinkKind.SYS), 0
                    GpuLink.objects.create(gpu_a=a, gpu_b=b, kind=kind, nvlink_count=count)


def _people_and_teams() -> dict[str, object]:
    quota_services.priority_classes_ensure_defaults()
    classes = {pc.name: pc for pc in PriorityClass.objects.all()}
    org, _ = Team.objects.get_or_create(slug="ai-lab", defaults={"display_name": "AI Lab"})
    admin_user = None
    users = {}
    User = get_user_model()
    for username, password, staff, _ in USERS:
        user, created = User.objects.get_or_create(
            username=username, defaults={"is_staff": staff, "is_superuser": staff}
        )
        if created:
            user.set_password(password)
            user.save()
        users[username] = user
        if staff:
            admin_user = user
    for slug, name, g_gib, l_gib, g_gpus, l_gpus, weight, priority in TEAMS:
        team, _ = Team.objects.get_or_create(slug=slug, defaults={"display_name": name, "parent": org})
        if not Quota.objects.filter(team=team, gpu_model__isnull=True).exists():
            quota_services.quota_save(
                quota=Quota(
                    team=team,
                    guaranteed_gpu_memory_mib=g_gib * GIB,
                    limit_gpu_memory_mib=l_gib * GIB,
                    guaranteed_gpus=Decimal(g_gpus),
                    limit_gpus=Decimal(l_gpus),
                    fair_share_weight=Decimal(weight),
                    default_priority_class=classes[priority],
                ),
                actor=admin_user,
                source=ChangeSource.SYSTEM,
                note="demo data",
            )
    for username, _, _, teams in USERS:
        for slug, role in teams:
            quota_services.membership_set(user=users[username], team=Team.objects.get(slug=slug), role=role)
    return users


def _run(job: Job, gpus: list[Gpu], *, memory_mib: int | None = None, compute_pct: int = 100) -> None:
    # The placed event records the cards held, as the scheduler's does: the chargeback reads their model from it
    # once the job has ended and given them back.
    held = [[g.node.name, g.index, memory_mib or g.memory_mib, compute_pct * 10] for g in gpus]
    job_transition(
        job=job,
        to_state=JobState.PLACED,
        actor_kind=ActorKind.SCHEDULER,
        code="placed",
        message="Placed by the demo loader.",
        data={"nodes": sorted({g.node.name for g in gpus}), "gpus": held},
    )
    for gpu in gpus:
        slice_allocate(job=job, gpu=gpu, memory_mib=memory_mib or gpu.memory_mib, compute_pct=compute_pct)
    job_transition(
        job=job,
        to_state=JobState.RUNNING,
        actor_kind=ActorKind.AGENT,
        code="started",
        message=f"Started on {', '.join(sorted({g.node.name for g in gpus}))} by the demo loader.",
    )


def _jobs(users: dict) -> None:
    if Job.objects.exists():
        return
    training = Team.objects.get(slug="ai-lab/training")
    inference = Team.objects.get(slug="ai-lab/inference")
    research = Team.objects.get(slug="ai-lab/research")

    def submit(user: str, team: Team, *, minutes: int = 30, **spec) -> Job:
        spec.setdefault("command", "python train.py")
        # How long the demo's stand-in script runs it (run_demo): the seeded work outlasts the demo's first hour
        # or ends within it, as real work would, while the other teams' new work comes in (demo.workload).
        spec["env"] = {"TESSERA_DEMO_STEPS": str(minutes * 60 // STEP_S)}
        return job_submit(submitter=users[user], team=team, spec=JobSpec(**spec))

    spare = Gpu.objects.select_related("node").get(node__name="a100-03", index=7)
    done = submit("alice", training, name="bert-pretrain-smoke", gpus=1, max_runtime_s=3600)
    _run(done, [spare])
    job_transition(
        job=done,
        to_state=JobState.SUCCEEDED,
        actor_kind=ActorKind.AGENT,
        code="exited",
        message="Exited with code 0.",
        data={"exit_code": 0},
    )
    job_release_slices(job=done)
    failed = submit("dave", research, name="sweep-lr-3e-4", gpus=1, max_runtime_s=1800)
    _run(failed, [spare])
    job_transition(
        job=failed,
        to_state=JobState.FAILED,
        actor_kind=ActorKind.AGENT,
        code="exited",
        message="Exited with code 1.",
        data={"exit_code": 1},
    )
    job_release_slices(job=failed)

    mps_gpus = list(Gpu.objects.filter(node__name=MPS_NODE, sharing_mode=SharingMode.MPS).order_by("index"))
    for i in range(6):
        job = submit(
            "bob",
            inference,
            minutes=20 + 15 * i,
            name=f"llm-serve-{i}",
            command="python serve.py",
            gpu_memory_mib=4 * GIB,
            compute_pct=10,
        )
        _run(job, [mps_gpus[i % len(mps_gpus)]], memory_mib=4 * GIB, compute_pct=10)
    a100_01 = list(Gpu.objects.filter(node__name="a100-01").order_by("index"))
    _run(
        submit(
            "alice",
            training,
            minutes=120,
            name="llama-finetune",
            gpus=4,
            topology=Topology.NVLINK,
            max_runtime_s=8 * 3600,
        ),
        a100_01[:4],
    )
    submit(
        "alice",
        training,
        minutes=60,
        name="llama-pretrain-7b",
        gpus=2,
        nodes=2,
        topology=Topology.NVLINK,
        max_runtime_s=24 * 3600,
        command="torchrun train.py --nnodes 2",
    )
    submit("dave", research, minutes=40, name="diffusion-ablation", gpus=2, max_runtime_s=4 * 3600)
    submit(
        "bob",
        inference,
        name="embedding-batch",
        gpu_memory_mib=10 * GIB,
        compute_pct=25,
        command="python embed.py",
    )


def demo_logins() -> list[tuple[str, str, str]]:
    return [
        (u, p, "admin" if staff else ", ".join(f"{t} ({r})" for t, r in teams))
        for u, p, staff, teams in USERS
    ]


@transaction.atomic
def load_demo(*, token_dir: Path | None = None, history_days: int = 0) -> dict[str, str]:
    """Load everything; returns the agent token of each node issued now (written to token_dir if given).
    `history_days`: that many days of generated history before now (`history_backfill`)."""
    _nodes()
    users = _people_and_teams()
    _jobs(users)
    history_backfill(days=history_days)
    tokens = {}
    if token_dir is not None:
        token_dir.mkdir(parents=True, exist_ok=True)
        for node in Node.objects.all():
            path = token_dir / f"{node.name}.token"
            if not path.exists() or not node.agent_token_hash:
                tokens[node.name] = inventory_services.node_issue_token(node=node)
                path.write_text(tokens[node.name])
                path.chmod(0o600)
    return tokens

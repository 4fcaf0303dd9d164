"""The cluster map and a node's page through Django's test client: groups by pool, tiles with slices as the
API's tenancy rule shows them, NVLink islands, staff-only state changes, and reads in a bounded number of
queries whatever the cluster's size. The live behaviour is in tests/browser/test_cluster_map.py."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from scheduling.choices import ActorKind, JobState, LinkKind, NodeState
from scheduling.inventory import cluster_map
from scheduling.inventory.models import Gpu, GpuLink, GpuModel, Node, NodeStateChange
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.ledger import slice_allocate
from scheduling.jobs.submit import job_submit
from scheduling.jobs.transitions import job_transition

pytestmark = pytest.mark.django_db


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _placed(user, team, gpu, *, memory_mib: int, compute_pct: int, name: str):
    job = job_submit(
        submitter=user,
        team=team,
        spec=JobSpec(name=name, command="python run.py", gpu_memory_mib=memory_mib, compute_pct=compute_pct),
    )
    job_transition(job=job, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER)
    slice_allocate(job=job, gpu=gpu, memory_mib=memory_mib, compute_pct=compute_pct)
    return job


@pytest.fixture
def shared_card(alice, bob, teams, node):
    """GPU 6 of a100-01 (MPS) shared by a slice of alice's and one of bob's."""
    gpu = Gpu.objects.get(node=node, index=6)
    mine = _placed(alice, teams["training"], gpu, memory_mib=10240, compute_pct=25, name="alice-eval")
    theirs = _placed(bob, teams["inference"], gpu, memory_mib=20480, compute_pct=50, name="bob-secret-serve")
    return mine, theirs


def _many_nodes(model: GpuModel, count: int, *, prefix: str, pool: str | None = None) -> None:
    Node.objects.bulk_create(
        Node(name=f"{prefix}-{i:03d}", cpu_milli=1000, memory_mib=1024, labels={"pool": pool} if pool else {})
        for i in range(count)
    )
    nodes = Node.objects.filter(name__startswith=prefix)
    Gpu.objects.bulk_create(
        Gpu(node=n, index=g, uuid=f"{n.name}-{g}", model=model, memory_mib=model.memory_mib)
        for n in nodes
        for g in range(8)
    )
    gpus = list(Gpu.objects.filter(node__name__startswith=prefix).order_by("node_id", "index"))
    GpuLink.objects.bulk_create(
        GpuLink(gpu_a=gpus[k], gpu_b=gpus[k + 1], kind=LinkKind.NVLINK, nvlink_count=4)
        for k in range(0, len(gpus), 2)
    )


def test_alice_sees_her_slice_named_and_bobs_anonymous_on_the_node_tile(alice, shared_card):
    page = _signed_in(alice).get("/cluster/").content.decode()
    assert "a100-01" in page and "A100-80GB" in page
    assert f"job {shared_card[0].pk} alice-eval (alice, ai-lab/training): 10 GiB + 25%" in page
    assert "another team: 20 GiB + 50%" in page
    assert "bob-secret-serve" not in page and "ai-lab/inference" not in page
    assert "30 GiB of 80 GiB held by 2 slices" in page  # the cell's aria-label, the same facts
    node_page = _signed_in(alice).get("/cluster/a100-01/").content.decode()
    assert "alice-eval" in node_page and "bob-secret-serve" not in node_page


def test_staff_see_every_slice_named(admin_user, shared_card):
    page = _signed_in(admin_user).get("/cluster/").content.decode()
    assert "bob-secret-serve" in page and "alice-eval" in page


def test_the_map_and_the_api_apply_one_tenancy_rule(alice, shared_card):
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(alice)
    held = api.get("/api/v1/cluster/nodes/a100-01/").json()["gpus"][6]["slices"]
    tiles = cluster_map.node_tiles(user=alice, names=["a100-01"])
    from dataclasses import asdict

    assert held == [asdict(s) for s in tiles[0].gpus[6].slices]


def test_nvlink_islands_are_connected_components_per_node(alice, a100):
    node = Node.objects.create(name="islands", cpu_milli=1000, memory_mib=1024)
    gpus = [
        Gpu.objects.create(node=node, index=i, uuid=f"i-{i}", model=a100, memory_mib=81920) for i in range(4)
    ]
    GpuLink.objects.create(gpu_a=gpus[0], gpu_b=gpus[2], kind=LinkKind.NVLINK, nvlink_count=2)
    GpuLink.objects.create(gpu_a=gpus[1], gpu_b=gpus[3], kind=LinkKind.PIX)  # PCIe: no island
    tile = cluster_map.node_tiles(user=alice, names=["islands"])[0]
    assert [[g.index for g in island] for island in tile.islands] == [[0, 2], [1], [3]]
    assert tile.gpus[2].island == [0, 2]


def test_nodes_are_grouped_by_pool_label_else_gpu_model_with_their_numbers(alice, a100, node):
    _many_nodes(a100, 3, prefix="train", pool="training-pool")
    Node.objects.filter(name="train-000").update(state=NodeState.CORDONED)
    groups = {g.name: g for g in cluster_map.cluster_groups()}
    assert set(groups) == {"A100-80GB", "training-pool"}
    pool = groups["training-pool"]
    assert (pool.nodes, pool.gpus, pool.nodes_by_state) == (3, 24, {"ready": 2, "cordoned": 1})
    assert pool.free_whole_gpus == 16  # the cordoned node's cards are not free for work
    assert groups["A100-80GB"].nodes == 1


def test_heartbeat_words(alice, node):
    from datetime import timedelta

    from django.utils import timezone

    assert cluster_map.node_tiles(user=alice, names=["a100-01"])[0].heartbeat_words == "never connected"
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=3))
    assert cluster_map.node_tiles(user=alice, names=["a100-01"])[0].heartbeat_words == "heartbeat 3 s ago"
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=35))
    tile = cluster_map.node_tiles(user=alice, names=["a100-01"])[0]
    assert tile.silent and tile.heartbeat_words == "agent silent for 35 s"


def test_the_map_reads_in_the_same_number_of_queries_for_3_nodes_as_for_60(alice, a100, shared_card):
    client = _signed_in(alice)

    def queries(path: str) -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(path).status_code == 200
        return len(ctx.captured_queries)

    _many_nodes(a100, 3, prefix="small", pool="big-pool")
    for k in range(3):
        _many_nodes(a100, 2, prefix=f"tiny{k}", pool=f"tiny-{k}")
    small = (queries("/cluster/"), queries("/cluster/?group=big-pool&part=group"))
    _many_nodes(a100, 57, prefix="more", pool="big-pool")  # 60 nodes: closed, a page of tiles when opened
    for k in range(3, 20):
        _many_nodes(a100, 2, prefix=f"tiny{k}", pool=f"tiny-{k}")  # more small groups, all open
    assert (queries("/cluster/"), queries("/cluster/?group=big-pool&part=group")) == small
    assert max(small) <= 12, small  # session and user, the groups (2), the open groups' tiles (5)


def test_a_big_group_starts_closed_and_opens_a_page_of_tiles(alice, a100, node):
    _many_nodes(a100, cluster_map.OPEN_GROUP_MAX_NODES + 1, prefix="big", pool="big")
    page = _signed_in(alice).get("/cluster/").content.decode()
    assert "big-000" not in page and "a100-01" in page  # the one-node group is open
    part = _signed_in(alice).get("/cluster/?group=big&part=group").content.decode()
    assert "big-000" in part and "big-012" in part


def test_a_member_sees_no_state_buttons_and_a_post_is_403_changing_nothing(alice, node):
    client = _signed_in(alice)
    assert "data-set-state" not in client.get("/cluster/").content.decode()
    assert "data-set-state" not in client.get("/cluster/a100-01/").content.decode()
    response = client.post("/cluster/a100-01/state/", {"state": "cordoned", "reason": "mine now"})
    assert response.status_code == 403
    node.refresh_from_db()
    assert node.state == NodeState.READY and not NodeStateChange.objects.exists()


def test_staff_cordon_from_the_page_and_the_node_page_shows_the_audit_row(admin_user, node):
    client = _signed_in(admin_user)
    assert 'data-set-state="cordoned"' in client.get("/cluster/").content.decode()
    response = client.post("/cluster/a100-01/state/", {"state": "cordoned", "reason": "fan noise"})
    assert response.status_code == 302
    node.refresh_from_db()
    assert node.state == NodeState.CORDONED
    page = client.get("/cluster/a100-01/").content.decode()
    assert "fan noise" in page and "admin" in page
    refused = client.post("/cluster/a100-01/state/", {"state": "draining", "reason": ""}, follow=True)
    assert "Say why" in refused.content.decode()
    assert Node.objects.get(pk=node.pk).state == NodeState.CORDONED


def test_the_nav_links_to_the_map_when_signed_in(alice):
    assert 'href="/cluster/"' in _signed_in(alice).get("/jobs/").content.decode()


def test_an_unknown_node_is_404(alice):
    assert _signed_in(alice).get("/cluster/nope/").status_code == 404


def test_the_totals_line_and_the_group_rows_count_allocated_gpus_alike(alice, shared_card):
    """Both read as a GPU count is written elsewhere (no trailing zeros), the totals the sum of the rows: they
    once read '13.6 allocated' above a row of 13.55, and '0.0' for a group with nothing allocated."""
    page = _signed_in(alice).get("/cluster/").content.decode()
    groups = cluster_map.cluster_groups()
    shown = sum(g.allocated_gpus for g in groups)
    assert 0 < shown < 1 and round(shown, 1) != shown  # a count the old totals line rounded differently
    totals = re.search(r"GPUs?: ([\d.]+) allocated", page).group(1)
    rows = re.findall(r'class="meter-fill"[^>]*></span></span> ([\d.]+) \(', page)
    assert rows and totals == f"{shown:.3f}".rstrip("0").rstrip(".")
    assert all(not r.endswith(".0") and not (r.endswith("0") and "." in r) for r in rows), rows


def test_the_map_says_who_held_idle_gpus_in_the_last_day_by_team_and_by_person_in_ones_teams(
    alice, bob, teams, node
):
    """Idle-allocated GPU-hours (the hourly usage rows) by team for everyone, by person only within one's teams."""
    from datetime import timedelta

    from django.utils import timezone

    from scheduling.history.models import UsageHour

    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    UsageHour.objects.create(
        hour=hour,
        team_id=teams["training"].pk,
        user_id=alice.pk,
        model_id=0,
        gpu_seconds=4 * 3600,
        idle_gpu_seconds=3 * 3600,
    )
    UsageHour.objects.create(
        hour=hour,
        team_id=teams["inference"].pk,
        user_id=bob.pk,
        model_id=0,
        gpu_seconds=2 * 3600,
        idle_gpu_seconds=0.5 * 3600,
    )
    UsageHour.objects.create(  # older than a day: not counted
        hour=hour - timedelta(days=2),
        team_id=teams["inference"].pk,
        user_id=bob.pk,
        model_id=0,
        gpu_seconds=9 * 3600,
        idle_gpu_seconds=9 * 3600,
    )
    assert 'hx-get="/cluster/?part=idle"' in _signed_in(alice).get("/cluster/").content.decode()
    page = _signed_in(alice).get("/cluster/?part=idle").content.decode()
    idle = page[page.index('id="cluster-idle"') :]
    idle = idle[: idle.index("</section>")]
    teams_table, people = idle.split("By person")
    rows = re.findall(
        r"<tr><td>(.*?)</td><td class=\"num\">(.*?)</td><td class=\"num\">(.*?)</td></tr>", teams_table
    )
    assert [(re.sub("<[^>]+>", "", t), h, p) for t, h, p in rows] == [
        ("ai-lab/training", "3.0", "75 %"),
        ("ai-lab/inference", "0.5", "25 %"),
    ]
    assert "alice" in people and "bob" not in people  # bob is not in alice's teams
    assert "bob" in _signed_in(bob).get("/cluster/?part=idle").content.decode()


def test_the_moves_and_idle_parts_read_none_of_the_groups_cards(alice, shared_card):
    """Both are re-fetched on their own (moves on every queue and node change): neither reads the cards and samples
    the map's groups are summed from."""
    client = _signed_in(alice)
    client.get("/cluster/")  # the session and the user read once
    for part, shows in (("moves", "Moved to make room"), ("idle", "Idle GPUs")):
        with CaptureQueriesContext(connection) as queries:
            response = client.get(f"/cluster/?part={part}")
        assert response.status_code == 200 and shows in response.content.decode()
        read = " ".join(q["sql"] for q in queries.captured_queries)
        assert Gpu._meta.db_table not in read and Node._meta.db_table not in read, part

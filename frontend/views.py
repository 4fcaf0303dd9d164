"""Portal pages. Views only read through selectors; anonymous visitors see the cluster, not the jobs."""

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from scheduling.inventory import selectors as inventory_selectors
from scheduling.jobs import selectors as job_selectors


def overview(request: HttpRequest) -> HttpResponse:
    nodes = list(inventory_selectors.cluster_nodes())
    totals = inventory_selectors.gpu_capacity_totals()
    context = {
        "nodes": nodes,
        "totals": totals,
        "allocated_pct": round(100 * totals["allocated_memory_mib"] / totals["memory_mib"])
        if totals["memory_mib"]
        else 0,
        "queue": list(job_selectors.queue()[:50]) if request.user.is_authenticated else [],
        "my_jobs": list(job_selectors.jobs_visible_to(user=request.user)[:50])
        if request.user.is_authenticated
        else [],
    }
    return render(request, "frontend/overview.html", context)


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})

"""Portal pages. Views only read through selectors; anonymous visitors see the cluster, not the jobs."""

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from scheduling import selectors


def overview(request: HttpRequest) -> HttpResponse:
    nodes = list(selectors.cluster_nodes())
    totals = selectors.gpu_capacity_totals()
    context = {
        "nodes": nodes,
        "totals": totals,
        "allocated_pct": round(100 * totals["allocated_memory_mib"] / totals["memory_mib"])
        if totals["memory_mib"]
        else 0,
        "queue": list(selectors.queue()[:50]) if request.user.is_authenticated else [],
        "my_jobs": list(selectors.jobs_visible_to(user=request.user)[:50])
        if request.user.is_authenticated
        else [],
    }
    return render(request, "frontend/overview.html", context)


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})

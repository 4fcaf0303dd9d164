"""Portal pages that are not about one job: the cluster summary, the queue, sign-in, health and the favicon.

Views are thin: they read through the same selectors as the API (so a page never shows a user more than the API
does) and render a template; a page's parts that change are partials it re-requests on a stream event.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.views.decorators.cache import cache_control

from quotas.oidc import oidc_enabled
from quotas.selectors import team_ids_for_user, team_slugs_visible_to
from scheduling.inventory import selectors as inventory_selectors
from scheduling.jobs import selectors as job_selectors
from scheduling.observability.readiness import readiness
from scheduling.realtime.parts import pushed

QUEUE_PAGE_SIZE = 50


def overview(request: HttpRequest) -> HttpResponse:
    """Signed in: the jobs list is home. Signed out: the cluster in numbers and a way to sign in."""
    if request.user.is_authenticated and request.GET.get("cluster") is None:
        return redirect("frontend:jobs")
    totals = inventory_selectors.gpu_capacity_totals()
    context = {
        "totals": totals,
        "nodes": inventory_selectors.node_state_counts(),
        "models": inventory_selectors.capacity_by_model(),
        "pending": job_selectors.queue().count(),
        "allocated_pct": round(100 * totals["allocated_memory_mib"] / totals["memory_mib"])
        if totals["memory_mib"]
        else 0,
    }
    return render(request, "frontend/overview.html", context)


class SignInView(auth_views.LoginView):
    """The password form, and the site's single sign-on where one is configured (quotas/oidc.py)."""

    template_name = "frontend/login.html"
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        if oidc_enabled():
            context["sso_name"] = settings.OIDC_PROVIDER_NAME
            context["sso_failed"] = self.request.GET.get("sso") == "failed"
        return context


class SignOutView(auth_views.LogoutView):
    """POST signs out (back to /); GET asks first, so a link or a prefetch cannot sign anyone out."""

    next_page = "/"
    http_method_names = ["get", "post", "options"]

    def get(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        return render(request, "frontend/logout.html")


class PasswordChangeView(auth_views.PasswordChangeView):
    """A local account changes its password here; one from the site's directory is told its password is the
    directory's (it has none here), and may still sign out everywhere."""

    template_name = "frontend/password_change.html"
    success_url = "/password/done/"

    def dispatch(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if request.user.is_authenticated and not request.user.has_usable_password():
            return render(request, "frontend/password_directory.html")
        return super().dispatch(request, *args, **kwargs)


class PasswordChangeDoneView(auth_views.PasswordChangeDoneView):
    template_name = "frontend/password_change_done.html"


def _queue_audience(request: HttpRequest) -> tuple | None:
    """Whom the queue's rows depend on: which teams' jobs the user sees in full (staff: all); the others are
    anonymous alike for everyone."""
    if request.GET.get("part") != "rows" or not request.user.is_authenticated:
        return None
    return ("teams", None if request.user.is_staff else tuple(sorted(team_ids_for_user(user=request.user))))


@pushed(_queue_audience)
@login_required
def queue(request: HttpRequest) -> HttpResponse:
    """The whole queue in the scheduler's order; other teams' entries anonymous exactly as /api/v1/queue/."""
    team = request.GET.get("team", "")
    model = request.GET.get("model", "")
    ids = job_selectors.queue_for_user(user=request.user, team=team, model=model).values_list("pk", flat=True)
    page = Paginator(ids, QUEUE_PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "entries": job_selectors.queue_entries(
            user=request.user, jobs=job_selectors.jobs_in_order(ids=list(page.object_list))
        ),
        "page": page,
        "team": team,
        "model": model,
        "teams": team_slugs_visible_to(user=request.user, all_teams=True),
        "models": [m.name for m in inventory_selectors.gpu_model_rows(installed_only=True)],
    }
    template = (
        "frontend/queue/_rows.html" if request.GET.get("part") == "rows" else "frontend/queue/list.html"
    )
    return render(request, template, context)


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: this process answers. (Whether it can do its work is /readyz's question.)"""
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: the database, Redis, a recent scheduling cycle and beat, each check's state; 503 when one
    fails."""
    answer = readiness()
    return JsonResponse(answer, status=200 if answer["ready"] else 503)


@cache_control(max_age=86400)
def favicon(request: HttpRequest) -> HttpResponse:
    return redirect(static("frontend/favicon.svg"))

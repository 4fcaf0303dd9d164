"""Job pages: the jobs list (/jobs/), one job (/jobs/<id>/), cancel, log download, and the submit form
(/jobs/new/) with its live what-if.

Every read goes through scheduling's selectors with the signed-in user, every write through its services: a
job another team's member asks for is a 404, as in the API.
"""

from __future__ import annotations

import json
import math

import yaml
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from frontend.forms import JobForm, initial_from_job
from frontend.job_charts import job_charts
from portal.api_support import PreviewRateThrottle
from portal.submit_flags import submit_command_line
from quotas.selectors import team_allowances_by_slug, team_by_slug, team_image_settings, team_slugs_visible_to
from scheduling.agents import joblogs
from scheduling.agents.live_metrics import IDLE_WARN_AFTER_S, job_usage
from scheduling.choices import JobState
from scheduling.cycle.fairness import why_ahead
from scheduling.cycle.idle import job_idle_reset, jobs_idle_states
from scheduling.cycle.whatif import job_whatif, snapshot_warm
from scheduling.errors import ServiceError
from scheduling.inventory.selectors import gpu_model_rows
from scheduling.jobs import selectors as job_selectors
from scheduling.jobs.array_tasks import job_cancel_as_listed
from scheduling.jobs.chargeback import usage_rows
from scheduling.jobs.fields import SESSION_TEMPLATES
from scheduling.jobs.sessions import job_sessions_for, session_share
from scheduling.jobs.spec import spec_check_card_limits, spec_from_mapping, spec_to_mapping
from scheduling.jobs.states import ACTIVE_STATES, TERMINAL_STATES, IllegalTransition
from scheduling.jobs.submit import job_submit
from scheduling.jobs.wording import LIMIT_STOPS
from scheduling.realtime.parts import pushed

JOBS_PAGE_SIZE = 50


def _scopes(user) -> list[tuple[str, str]]:
    scopes = [("mine", "Mine"), ("teams", "My teams")]
    if user.is_staff:
        scopes.append(("all", "All"))
    return scopes


def _jobs_audience(request: HttpRequest) -> int | None:
    """Whom the jobs list's rows depend on: the user (their own jobs are marked and selectable)."""
    return request.user.pk if request.GET.get("part") == "rows" and request.user.is_authenticated else None


@pushed(_jobs_audience)
@login_required
def jobs(request: HttpRequest) -> HttpResponse:
    scopes = _scopes(request.user)
    scope = request.GET.get("scope", "mine")
    if scope not in dict(scopes):
        scope = "mine"
    state, team, search = (request.GET.get(k, "").strip() for k in ("state", "team", "q"))
    array = request.GET.get("array", "")
    array_id = int(array) if array.isdigit() and len(array) < 10 else None
    rows = job_selectors.jobs_for_user(
        user=request.user, scope=scope, state=state, team=team, search=search, array=array_id
    )
    page = Paginator(rows.values_list("pk", flat=True), JOBS_PAGE_SIZE).get_page(request.GET.get("page"))
    page_jobs = job_selectors.jobs_in_order(ids=list(page.object_list))
    active = [j.pk for j in page_jobs if j.state in ACTIVE_STATES]
    context = {
        "page": page,
        "jobs": page_jobs,
        "usage": job_usage(job_ids=active),
        "positions": {
            e["id"]: e
            for e in job_selectors.queue_entries(
                user=request.user, jobs=[j for j in page_jobs if j.state == JobState.PENDING]
            )
        },
        "scopes": scopes,
        "scope": scope,
        "state": state,
        "team": team,
        "q": search,
        "states": JobState.choices,
        "teams": team_slugs_visible_to(user=request.user),
        "idle_warn_min": int(IDLE_WARN_AFTER_S // 60),
        "node_conditions": job_selectors.jobs_node_silence(jobs=page_jobs),
        "arrays": job_selectors.array_summaries(jobs=page_jobs),
        "array": array_id,
    }
    template = "frontend/jobs/_rows.html" if request.GET.get("part") == "rows" else "frontend/jobs/list.html"
    return render(request, template, context)


def _job_or_404(request: HttpRequest, job_id: int):
    job = job_selectors.job_for_user(user=request.user, job_id=job_id)
    if job is None:
        raise Http404("No such job, or not yours to see.")
    return job


def _right_size(job, peak_mib: int | None, events) -> dict | None:
    """For a finished job that held its cards alone (the only case NVML's memory in use is its own): its peak
    memory against what it held, and the slice that would have done (the peak plus 1 GiB, rounded up to 8 GiB).
    What it held is its placement's record: its cards are given back when it ends."""
    if peak_mib is None or not job.gpus:  # a slice shares its card: NVML's memory in use is not its own
        return None
    placed = next((e for e in reversed(events) if e.to_state == JobState.PLACED), None)
    assigned = (placed.data or {}).get("gpus", []) if placed is not None else []
    held = max((a[2] for a in assigned if isinstance(a, list | tuple) and len(a) > 2), default=None)
    held = held or job.gpu_memory_mib
    if not held:
        return None
    suggest = -(-(peak_mib + 1024) // 8192) * 8192
    return {"peak_mib": peak_mib, "held_mib": held, "suggest_mib": suggest if suggest < held else None}


def _bar_phases(phases: list[dict]) -> list[dict]:
    """The time bar's phases. One over within the second it began (no wait in the queue, an instant start) is left
    out: it read "waiting in the queue · 0 s", "starting · 0 s". The last is kept, so a job whose whole life took
    less than a second still has a bar ("running · under 1 s"), not an empty card."""
    last = len(phases) - 1
    return [p for i, p in enumerate(phases) if p["open"] or p["seconds"] >= 1 or i == last]


def _job_live_audience(request: HttpRequest, job_id: int) -> tuple | None:
    """Whom a job's live part depends on: whoever may see the job sees the same, but for the cancel button."""
    if request.GET.get("part") != "live" or not request.user.is_authenticated:
        return None
    job = _job_or_404(request, job_id)
    return ("job", job_selectors.can_cancel_job(user=request.user, job=job))


@pushed(_job_live_audience)
@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job_or_404(request, job_id)
    if request.GET.get("part") == "ahead":
        # Loaded after the page (it reads the what-if snapshot): how the teams ahead of a pending job stand.
        return render(request, "frontend/jobs/_ahead.html", {"job": job, "ahead": why_ahead(job=job)})
    events = job_selectors.job_events(job=job)
    usage = job_usage(job_ids=[job.pk]).get(job.pk)
    context = {
        "job": job,
        "array": job_selectors.array_summaries(jobs=[job]).get(job.pk),
        "events": events,
        "phases": _bar_phases(job_selectors.job_phases(job=job, events=events)),
        "slices": list(job.slices.all()),
        "usage": usage,
        "queue_entry": next(iter(job_selectors.queue_entries(user=request.user, jobs=[job])), None)
        if job.state == JobState.PENDING
        else None,
        "can_cancel": job_selectors.can_cancel_job(user=request.user, job=job)
        and job.state not in TERMINAL_STATES,
        "finished": job.state in TERMINAL_STATES,
        "right_size": _right_size(job, (usage or {}).get("peak_memory_mib"), events)
        if job.state in TERMINAL_STATES
        else None,
        "gpu_hours": _gpu_hours(request, job) if job.state in TERMINAL_STATES else None,
        "streams": joblogs.STREAMS,
        "exit_code": _exit_code(events),
        "stopped_by_limit": _stopped_by_limit(job, events) if job.state in TERMINAL_STATES else None,
        "node_condition": job_selectors.job_node_silence(job=job),
        "sessions": job_sessions_for(user=request.user, job=job),
        "idle": jobs_idle_states(jobs=[job], usage={job.pk: usage} if usage else {}).get(job.pk),
        "can_share": bool(job.ports)
        and job.submitter_id == request.user.pk
        and job.state not in TERMINAL_STATES,
    }
    if request.GET.get("part") != "live":
        context["charts"] = job_charts(job=job, events=events)
    template = (
        "frontend/jobs/_live.html" if request.GET.get("part") == "live" else "frontend/jobs/detail.html"
    )
    return render(request, template, context)


def _exit_code(events) -> int | None:
    for event in reversed(events):
        code = (event.data or {}).get("exit_code")
        if isinstance(code, int):
            return code
    return None


def _stopped_by_limit(job, events) -> str | None:
    """How a job that one of its limits ended was stopped (its exit code is then the signal's, not the job's)."""
    ended = next((e for e in reversed(events) if e.to_state == job.state and e.from_state != job.state), None)
    return LIMIT_STOPS[ended.code] if ended is not None and ended.code in LIMIT_STOPS else None


def _gpu_hours(request: HttpRequest, job) -> float:
    """Whole-GPU-equivalent hours the job has held, as /api/v1/usage/ counts them."""
    mine = job_selectors.jobs_visible_to(user=request.user).filter(pk=job.pk)
    rows = usage_rows(jobs=mine, since=job.submitted_at, until=timezone.now(), group_by=("team",))
    return sum(r["gpu_hours"] for r in rows)


def _new_page(form: JobForm) -> dict:
    """The submit page's context: the form, and the session templates as the values they put in it."""
    templates = [
        (
            key,
            {
                "label": t["label"],
                "values_json": json.dumps(
                    {
                        "name": t["name"],
                        "command_form": "shell",
                        "command": t["command"],
                        "ports": t["ports"],
                        "interactive": "on" if t["kind"] == "interactive" else "",
                    }
                ),
            },
        )
        for key, t in SESSION_TEMPLATES.items()
    ]
    return {"form": form, "session_templates": templates}


def session_slash(request: HttpRequest, job_id: int, name: str) -> HttpResponse:
    return redirect(f"/jobs/{job_id}/open/{name}/", permanent=False)


@login_required
@require_POST
def job_still_in_use(request: HttpRequest, job_id: int) -> HttpResponse:
    """The owner says the job is still in use: its idle clock starts again (once per idle timeout)."""
    try:
        job_idle_reset(user=request.user, job_id=job_id)
    except ServiceError as exc:
        if exc.code == "not_found":
            raise Http404(exc.message) from None
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Job {job_id}'s idle clock starts again.")
    return redirect("frontend:job", job_id=job_id)


@login_required
@require_POST
def job_share(request: HttpRequest, job_id: int) -> HttpResponse:
    """The submitter lets the job's team open its web ports too (share=1), or no longer (share=0)."""
    try:
        job = session_share(user=request.user, job_id=job_id, shared=request.POST.get("share") == "1")
    except ServiceError as exc:
        if exc.code == "not_found":
            raise Http404(exc.message) from None
        messages.error(request, exc.message)
        return redirect("frontend:job", job_id=job_id)
    if job.session_shared:
        messages.success(request, f"Members of {job.team.slug} may now open job {job.pk}'s web ports.")
    else:
        messages.success(request, f"Only you may open job {job.pk}'s web ports now.")
    return redirect("frontend:job", job_id=job_id)


@login_required
@require_POST
def jobs_cancel(request: HttpRequest) -> HttpResponse:
    """Cancel one or several jobs: each only if this user may cancel it (their own; a team admin's team's)."""
    ids = [int(i) for i in request.POST.getlist("job") if i.isdigit()]
    done, refused = [], []
    for job_id in ids:
        job = job_selectors.job_for_user(user=request.user, job_id=job_id)
        if job is None or not job_selectors.can_cancel_job(user=request.user, job=job):
            refused.append(f"{job_id} (not yours to cancel)")
            continue
        try:
            job_cancel_as_listed(job=job, actor=request.user)
            is_array = job.array_job_id is not None and job.array_job_id == job.pk
            done.append(f"{job_id} (an array: all its tasks)" if is_array else str(job_id))
        except IllegalTransition:
            refused.append(f"{job_id} (already {job.state})")
    if done:
        messages.success(request, f"Cancelled job{'s' if len(done) > 1 else ''} {', '.join(done)}.")
    if refused:
        messages.error(request, f"Not cancelled: {', '.join(refused)}.")
    back = request.POST.get("next") or "/jobs/"
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
        back = "/jobs/"
    return redirect(back)


@login_required
def job_log_download(request: HttpRequest, job_id: int, stream: str) -> HttpResponse:
    job = _job_or_404(request, job_id)
    if stream not in joblogs.STREAMS:
        raise Http404("No such stream.")
    path = joblogs.log_path(job_id=job.pk, stream=stream)
    name = f"job-{job.pk}-{stream}.log"
    if not path.exists():  # nothing written there (yet): the download is an empty log, not an error page
        empty = HttpResponse(b"", content_type="text/plain; charset=utf-8")
        empty["Content-Disposition"] = f'attachment; filename="{name}"'
        return empty
    return FileResponse(open(path, "rb"), as_attachment=True, filename=name)


# --- Submit -------------------------------------------------------------------------------------------------


def _form(request: HttpRequest, data=None, initial=None) -> JobForm:
    allowances = team_allowances_by_slug(slugs=team_slugs_visible_to(user=request.user))
    return JobForm(
        data,
        initial=initial,
        allowances=allowances,
        models=[m.name for m in gpu_model_rows(installed_only=True)],
        images=team_image_settings(team_ids=[a.team_id for a in allowances.values()]),
    )


def _parsed(request: HttpRequest, form: JobForm):
    """The form's spec through the API's parser and team check; refusals land next to their field, every
    field's at once."""
    if not form.is_valid():
        form.add_spec_field_errors()
        return None, None
    try:
        parsed = spec_from_mapping(form.spec_mapping())
    except ServiceError as exc:
        form.add_spec_field_errors()
        if exc.field not in form.errors:
            form.add_spec_error(exc.field, exc.message)
        return None, None
    team = team_by_slug(slug=parsed.team or "")
    if team is None or parsed.team not in team_slugs_visible_to(user=request.user):
        form.add_spec_error("team", f"You are not a member of team {parsed.team}.")
        return None, None
    return parsed, team


@login_required
def job_new(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        form = _form(request, request.POST)
        parsed, team = _parsed(request, form)
        if parsed is not None:
            try:
                job = job_submit(submitter=request.user, team=team, spec=parsed.spec)
            except ServiceError as exc:
                if exc.field == "gpu_memory":
                    try:
                        spec_check_card_limits(parsed.spec)
                    except ServiceError as limited:
                        exc = limited
                form.add_spec_error(exc.field, exc.message)
            else:
                messages.success(request, f"Submitted job {job.pk}: {job.name}.")
                return redirect("frontend:job", job_id=job.pk)
        return render(request, "frontend/jobs/new.html", _new_page(form), status=400)
    initial = None
    copy = request.GET.get("from")
    if copy and copy.isdigit():
        source = _job_or_404(request, int(copy))
        initial = initial_from_job(source)
        initial["name"] = f"{source.name} (copy)"[:200]
    else:
        teams = team_slugs_visible_to(user=request.user)
        initial = {"team": teams[0] if teams else "", "command_form": "argv", "kind": "whole", "gpus": "1"}
    snapshot_warm()  # the what-if's first answer comes as the user types: its snapshot is read meanwhile
    return render(request, "frontend/jobs/new.html", _new_page(_form(request, initial=initial)))


@login_required
@require_POST
def job_new_preview(request: HttpRequest) -> HttpResponse:
    """As the user edits the form: the spec as YAML and as a `tessera submit` line, and the engine's answer to
    "when would it start?" on the current snapshot. Nothing is stored, nothing is placed."""
    throttle = PreviewRateThrottle()
    if not throttle.allow_request(request, None):
        return _preview_refused(request, throttle)
    form = _form(request, request.POST)
    parsed, team = _parsed(request, form)
    context: dict = {"form": form}
    if parsed is not None:
        mapping = spec_to_mapping(parsed.spec, team=parsed.team)
        context["yaml"] = _yaml(mapping)
        context["cli"] = submit_command_line(mapping)
        whatif = job_whatif(user=request.user, team=team, spec=parsed.spec)
        if whatif.verdict == "refused":
            # Not a verdict on capacity (a class the team may not use): said beside its field, as a submit would.
            form.add_spec_error(whatif.field_name, whatif.text)
        else:
            context["whatif"] = whatif
            context["apply"] = json.dumps(whatif.apply) if whatif.apply else ""
    return render(request, "frontend/jobs/_preview.html", context)


_PER = {1: "second", 60: "minute", 3600: "hour", 86400: "day"}


def _preview_refused(request: HttpRequest, throttle: PreviewRateThrottle) -> HttpResponse:
    """429, saying the rate and when the preview answers again (page.js shows it where the answer goes)."""
    wait_s = max(1, math.ceil(throttle.wait() or 1))
    context = {
        "limit": throttle.num_requests,
        "per": _PER.get(throttle.duration, f"{throttle.duration} s"),
        "wait_s": wait_s,
    }
    response = render(request, "frontend/jobs/_preview_throttled.html", context, status=429)
    response["Retry-After"] = str(wait_s)
    return response


def _yaml(mapping: dict) -> str:
    return yaml.safe_dump(mapping, sort_keys=False, allow_unicode=True, width=100)

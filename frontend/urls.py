from django.urls import path, re_path

from frontend import account, cluster, fairness, history, jobs, team_page, teams, views

# A team slug: `ai-lab` or `ai-lab/training` (quotas.models.slug_path_validator).
TEAM = r"(?P<slug>[a-z0-9][a-z0-9-]*(?:/[a-z0-9][a-z0-9-]*)?)"

app_name = "frontend"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("login/", views.SignInView.as_view(), name="login"),
    path("logout/", views.SignOutView.as_view(), name="logout"),
    path("password/", views.PasswordChangeView.as_view(), name="password_change"),
    path("password/done/", views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    path("account/notifications/", account.notifications, name="notifications"),
    path("account/sign-out-everywhere/", account.sign_out_everywhere, name="sign_out_everywhere"),
    path("jobs/", jobs.jobs, name="jobs"),
    path("jobs/new/", jobs.job_new, name="job_new"),
    path("jobs/new/preview/", jobs.job_new_preview, name="job_new_preview"),
    path("jobs/cancel/", jobs.jobs_cancel, name="jobs_cancel"),
    path("jobs/<int:job_id>/", jobs.job_detail, name="job"),
    path("jobs/<int:job_id>/logs/<str:stream>/", jobs.job_log_download, name="job_log"),
    path("jobs/<int:job_id>/share/", jobs.job_share, name="job_share"),
    # A session's path without its last slash (typed by hand): the proxy serves it with the slash
    # (frontend/sessions.py, before Django).
    re_path(
        r"^jobs/(?P<job_id>[0-9]+)/open/(?P<name>[a-z][a-z0-9-]{0,30})$",
        jobs.session_slash,
        name="session_slash",
    ),
    path("jobs/<int:job_id>/still-in-use/", jobs.job_still_in_use, name="job_still_in_use"),
    path("queue/", views.queue, name="queue"),
    path("teams/", teams.teams, name="teams"),
    # Team slugs hold a '/' (ai-lab/training): a path converter, with the fixed ends after it.
    path("teams/<path:slug>/quota/preview/", teams.team_quota_preview, name="team_quota_preview"),
    path("teams/<path:slug>/quota/undo/<int:change_id>/", teams.team_quota_undo, name="team_quota_undo"),
    path("teams/<path:slug>/quota/", teams.team_quota, name="team_quota"),
    re_path(rf"^teams/{TEAM}/$", team_page.team_detail, name="team"),
    re_path(rf"^teams/{TEAM}/chargeback\.csv$", team_page.team_chargeback_csv, name="team_chargeback_csv"),
    path("cluster/", cluster.cluster, name="cluster"),
    path("cluster/<str:name>/", cluster.node, name="node"),
    path("cluster/<str:name>/state/", cluster.node_state, name="node_state"),
    path("fairness/", fairness.fairness, name="fairness"),
    path("history/", history.history_page, name="history"),
    path("capacity/", history.capacity_page, name="capacity"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
]

from django.urls import path

from frontend import history, jobs, views

app_name = "frontend"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("login/", views.SignInView.as_view(), name="login"),
    path("logout/", views.SignOutView.as_view(), name="logout"),
    path("password/", views.PasswordChangeView.as_view(), name="password_change"),
    path("password/done/", views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    path("jobs/", jobs.jobs, name="jobs"),
    path("jobs/new/", jobs.job_new, name="job_new"),
    path("jobs/new/preview/", jobs.job_new_preview, name="job_new_preview"),
    path("jobs/cancel/", jobs.jobs_cancel, name="jobs_cancel"),
    path("jobs/<int:job_id>/", jobs.job_detail, name="job"),
    path("jobs/<int:job_id>/logs/<str:stream>/", jobs.job_log_download, name="job_log"),
    path("queue/", views.queue, name="queue"),
    path("history/", history.history_page, name="history"),
    path("capacity/", history.capacity_page, name="capacity"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("healthz", views.healthz, name="healthz"),
]

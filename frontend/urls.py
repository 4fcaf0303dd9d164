from django.urls import path

from frontend import views

app_name = "frontend"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("healthz", views.healthz, name="healthz"),
]

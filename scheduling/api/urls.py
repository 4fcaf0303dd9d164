"""Routes of the scheduling API, mounted under /api/v1/ by portal.api_urls."""

from django.urls import path
from rest_framework.routers import DefaultRouter

from scheduling.api import views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("jobs", views.JobViewSet, basename="job")
router.register("cluster/nodes", views.NodeViewSet, basename="node")

urlpatterns = [
    path("queue/", views.QueueView.as_view(), name="queue"),
    path("cluster/", views.ClusterView.as_view(), name="cluster"),
    path("usage/", views.UsageView.as_view(), name="usage"),
    *router.urls,
]

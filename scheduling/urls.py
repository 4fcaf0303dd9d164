"""Routes of the scheduling API (jobs, queue, usage, nodes, cluster), mounted under /api/v1/ by portal.api_urls."""

from django.urls import path
from rest_framework.routers import DefaultRouter

from scheduling.inventory.api import views as inventory
from scheduling.jobs.api import views as jobs
from scheduling.notifications.api import NotificationSettingsView

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("jobs", jobs.JobViewSet, basename="job")
router.register("cluster/nodes", inventory.NodeViewSet, basename="node")

urlpatterns = [
    path("queue/", jobs.QueueView.as_view(), name="queue"),
    path("cluster/", inventory.ClusterView.as_view(), name="cluster"),
    path("usage/", jobs.UsageView.as_view(), name="usage"),
    path("notifications/", NotificationSettingsView.as_view(), name="notifications"),
    *router.urls,
]

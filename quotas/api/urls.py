"""Routes of the quotas API, mounted under /api/v1/ by portal.api_urls."""

from django.urls import path
from rest_framework.routers import DefaultRouter

from quotas.api import views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("teams", views.TeamViewSet, basename="team")
router.register("priority-classes", views.PriorityClassViewSet, basename="priorityclass")
router.register("tokens", views.ApiTokenViewSet, basename="apitoken")

urlpatterns = [
    path("whoami/", views.WhoamiView.as_view(), name="whoami"),
    path("auth/token/", views.TokenLoginView.as_view(), name="token-login"),
    path("auth/sso/", views.SsoConfigView.as_view(), name="sso-config"),
    path("auth/token/sso/", views.SsoTokenView.as_view(), name="token-sso"),
    path("auth/sign-out-everywhere/", views.SignOutEverywhereView.as_view(), name="sign-out-everywhere"),
    *router.urls,
]

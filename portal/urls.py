"""Top-level URLs: the portal pages, the admin and the API."""

from django.contrib import admin
from django.urls import include, path

from portal.metrics import metrics_view
from quotas import oidc

# The admin site says whose it is (it read "Django administration", "Site administration").
admin.site.site_header = "Tessera administration"
admin.site.site_title = "Tessera admin"
admin.site.index_title = "Cluster, teams and people"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("portal.api_urls")),
    path("metrics", metrics_view, name="metrics"),
    # Single sign-on (quotas/oidc.py): 404 where no provider is configured.
    path("oidc/sign-in/", oidc.SignInStart.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", oidc.SignInCallback.as_view(), name="oidc_authentication_callback"),
    path("", include("frontend.urls")),
]

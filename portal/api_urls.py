"""/api/v1/: the REST API of both apps, plus the OpenAPI schema and its interactive docs (served offline)."""

from django.http import HttpRequest, JsonResponse
from django.urls import include, path, re_path
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

app_name = "api"


@csrf_exempt  # it changes nothing; a POST to a wrong path gets the API's 404, not Django's CSRF page
def not_found(request: HttpRequest, path: str = "") -> JsonResponse:
    """Unknown API paths answer in the API's error format, not with an HTML page."""
    from portal.api_support import error_body

    return JsonResponse(
        error_body(code="not_found", message=f"No API endpoint at {request.path}; see /api/docs/."),
        status=404,
    )


urlpatterns = [
    path("v1/", include("scheduling.urls")),
    path("v1/", include("quotas.api.urls")),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="api:schema"), name="redoc"),
    re_path(r"^(?P<path>.*/)$", not_found),
]

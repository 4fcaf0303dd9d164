"""Sign-in protection (django-axes) as the portal uses it: the backend, and the answer to a locked-out sign-in."""

from __future__ import annotations

from typing import Any

from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from portal.api_support import error_body


class SignInProtectionBackend(AxesStandaloneBackend):
    """django-axes' check on every sign-in that comes with a request (the portal's form, the admin's, the API's
    token login). A call with no request is server-side code (a management command, Django's test client's
    `login()`): there is no client address to count, so it is not counted."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


class LocalAccountBackend(ModelBackend):
    """Passwords kept in the portal. With LOCAL_SIGN_IN = "superusers" (a site whose people sign in through its
    directory), only superusers sign in this way: the break-glass admins for when the directory is down."""

    def user_can_authenticate(self, user: Any) -> bool:
        if settings.LOCAL_SIGN_IN == "superusers" and not getattr(user, "is_superuser", False):
            return False
        return super().user_can_authenticate(user)


def _cool_off_minutes() -> int:
    return max(1, round(float(settings.AXES_COOLOFF_TIME) * 60))


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None, credentials: Any
) -> HttpResponse:
    """429 for a username and address that failed too often: JSON for the API, the sign-in page otherwise."""
    minutes = _cool_off_minutes()
    message = (
        f"Too many failed sign-ins for this username from your address; try again in {minutes} minutes "
        "or ask an admin to unlock it."
    )
    if request.path.startswith("/api/"):
        body = error_body(code="locked_out", message=message, field="password")
        return JsonResponse(body, status=429, headers={"Retry-After": str(minutes * 60)})
    return render(request, "frontend/login.html", {"locked_out": message, "form": None}, status=429)

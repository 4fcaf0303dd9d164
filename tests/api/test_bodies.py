"""Request bodies every endpoint refuses the same way, in the API's error format: a lone surrogate anywhere in a JSON
body, a body over the API's limit, and a field the request does not take."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from portal.api_support import error_body
from portal.parsers import MAX_BODY_BYTES
from quotas.models import ApiToken, Quota, QuotaChange
from scheduling.jobs.models import Job

pytestmark = pytest.mark.django_db

KEY = b'{"\\ud800": 1}'


def _refused(response, field: str | None, words: str) -> dict:
    assert response.status_code == 400, response.content[:300]
    assert response["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert error["field"] == field and words in error["message"], error
    return error


@pytest.fixture
def as_staff(admin_user, node):
    client = APIClient()
    client.force_authenticate(admin_user)
    return client


SURROGATES = [
    ("post", "/api/v1/tokens/", KEY, "\\ud800"),
    ("put", "/api/v1/notifications/", KEY, "\\ud800"),
    ("patch", "/api/v1/teams/{team}/quotas/", KEY, "\\ud800"),
    ("post", "/api/v1/teams/{team}/quota-preview/", KEY, "\\ud800"),
    ("post", "/api/v1/teams/{team}/quota-preview/", b'{"gpu_model": {"x": ["\\udfff"]}}', "gpu_model.x"),
    ("post", "/api/v1/jobs/", b'{"name": "a", "command": "b", "env": {"A\\ud800": "1"}}', "env.A\\ud800"),
]


def test_a_lone_surrogate_anywhere_in_a_json_body_is_a_400_naming_where(as_staff, teams):
    changes = QuotaChange.objects.count()
    for method, path, body, field in SURROGATES:
        url = path.format(team=teams["training"].pk)
        _refused(
            getattr(as_staff, method)(url, body, content_type="application/json"), field, "lone surrogate"
        )
    assert not Job.objects.exists() and not ApiToken.objects.exists()
    assert QuotaChange.objects.count() == changes


def test_an_error_holding_a_lone_surrogate_is_still_written_escaped():
    body = error_body(
        code="invalid", message="bad \ud800", field="env.A\udc80", fields={"k\ud800": ["m\ud800"]}
    )
    assert body["error"]["message"] == "bad \\ud800" and body["error"]["field"] == "env.A\\udc80"
    assert body["error"]["fields"] == {"k\\ud800": ["m\\ud800"]}


def test_a_body_over_a_limit_is_refused_in_the_api_format_naming_the_limit(db):
    body = b"--x\r\nContent-Disposition: form-data; name=f; filename=f\r\n\r\n" + b"x" * 3_000_000
    for content_type in (
        "application/json",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ):
        response = APIClient().post("/api/v1/auth/token/", body, content_type=content_type)
        error = _refused(response, None, "at most 1048576 bytes")
        assert (error["code"], error["limit"]) == ("out_of_range", MAX_BODY_BYTES)
    fields = "&".join(f"f{i}=1" for i in range(1001)).encode()
    response = APIClient().post(
        "/api/v1/auth/token/", fields, content_type="application/x-www-form-urlencoded"
    )
    assert _refused(response, None, "at most 1000 fields")["limit"] == 1000
    assert not ApiToken.objects.exists()


NOT_TAKEN = [
    ("patch", "/api/v1/teams/{team}/quotas/", {"reason": "x", "guaranteed_gpu": "2"}, "guaranteed_gpu"),
    ("post", "/api/v1/teams/{team}/quota-preview/", {"limit": 1}, "limit"),
    ("post", "/api/v1/tokens/", {"name": "laptop", "expires": "never"}, "expires"),
    ("post", "/api/v1/cluster/nodes/a100-01/state/", {"state": "ready", "reason": "x", "why": 1}, "why"),
    (
        "put",
        "/api/v1/notifications/",
        {"job_events": ["fail"], "email": False, "webhook_url": "", "webhok_url": "https://x"},
        "webhok_url",
    ),
]


def test_a_field_the_request_does_not_take_is_a_400_naming_it_and_the_schema_says_so(as_staff, teams):
    changes = QuotaChange.objects.count()
    for method, path, body, field in NOT_TAKEN:
        url = path.format(team=teams["training"].pk)
        error = _refused(getattr(as_staff, method)(url, body, format="json"), field, "not a field")
        assert field in error["fields"]
    assert Quota.objects.get(team=teams["training"], gpu_model=None).guaranteed_gpus == 4
    assert QuotaChange.objects.count() == changes and not ApiToken.objects.exists()
    schemas = as_staff.get("/api/schema/?format=json").json()["components"]["schemas"]
    for name in (
        "PatchedQuotaChangeRequestRequest",
        "QuotaEditRequest",
        "UndoRequestRequest",
        "ApiTokenCreateRequest",
        "TokenLoginRequest",
        "NodeStateRequestRequest",
        "NotificationSettingsRequest",
    ):
        assert schemas[name]["additionalProperties"] is False, name


def test_before_signing_in_a_lone_surrogate_or_a_field_not_taken_is_a_400_naming_it(db):
    client = APIClient()
    _refused(client.post("/api/v1/auth/token/", KEY, content_type="application/json"), "\\ud800", "surrogate")
    body = {"username": "a", "password": "b", "scope": "all"}
    _refused(client.post("/api/v1/auth/token/", body, format="json"), "scope", "not a field")

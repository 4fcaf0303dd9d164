"""Query and body values the schema does not allow are refused naming them; values it allows are not."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from quotas.models import ApiToken

pytestmark = pytest.mark.django_db


@pytest.fixture
def as_alice(alice):
    client = APIClient()
    client.force_authenticate(alice)
    return client


def test_a_token_name_must_be_text_not_a_number(as_alice):
    response = as_alice.post("/api/v1/tokens/", {"name": 0}, format="json")
    assert response.status_code == 400 and response.json()["error"]["field"] == "name"
    assert not ApiToken.objects.exists()


def test_usage_format_must_be_json_or_csv(as_alice):
    empty = as_alice.get("/api/v1/usage/?format=")
    assert empty.status_code == 400 and empty.json()["error"]["field"] == "format"
    # A format no renderer answers to is DRF's 404 (documented), in the API's error format.
    other = as_alice.get("/api/v1/usage/?format=xml")
    assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"


def test_a_parent_team_id_with_no_team_lists_nothing_rather_than_refusing(as_alice, teams):
    response = as_alice.get("/api/v1/teams/?parent=987654")
    assert response.status_code == 200 and response.json()["results"] == []


def test_page_bounds_are_in_the_schema_as_the_api_enforces_them(as_alice):
    schema = as_alice.get("/api/schema/?format=json").json()
    params = {p["name"]: p["schema"] for p in schema["paths"]["/api/v1/jobs/"]["get"]["parameters"]}
    assert params["page"]["minimum"] == 1
    assert (params["page_size"]["minimum"], params["page_size"]["maximum"]) == (1, 500)
    assert as_alice.get("/api/v1/jobs/?page_size=501").status_code == 400

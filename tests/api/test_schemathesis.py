"""Property-based requests from the OpenAPI schema (schemathesis): no 5xx, every status code is one the schema
documents, every response matches its schema, what the schema allows is accepted and what it refuses is refused.
Bounded: MAX_EXAMPLES per operation, plus hand-picked hostile inputs that random generation would rarely reach
(YAML's .nan, JSON's NaN, huge integers, year 1)."""

from __future__ import annotations

import csv
import io
import zlib

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from portal.api_schema import RULE_CODES
from portal.wsgi import application
from scheduling.jobs.ledger import slice_allocate
from scheduling.jobs.transitions import job_transition

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)
# About 150 requests for each of the 34 operations (half of them schemathesis's coverage phase, which the limit
# does not bound); the file takes about 60 s on a 2-core machine.
MAX_EXAMPLES = 75


def _error_code(response) -> str | None:
    """error.code of an error body, JSON or (for ?format=csv) CSV."""
    try:
        return response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return next(csv.DictReader(io.StringIO(response.text)), {}).get("code")


@schemathesis.check
def positive_data_acceptance_but_for_rules(ctx, response, case):
    """positive_data_acceptance, except for a 400 whose code names a rule no schema can state (a size's bound as
    written, fields that do not go together, what this cluster and team allow: portal.api_schema.RULE_CODES)."""
    if response.status_code == 400 and _error_code(response) in RULE_CODES:
        return None
    return positive_data_acceptance(ctx, response, case)


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    positive_data_acceptance_but_for_rules,
    negative_data_rejection,
]


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    """POST /api/v1/auth/token/ checks a password on every call (and hashes a dummy one for unknown users):
    the production hasher's deliberate slowness would dominate the run, so tests hash with MD5."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def keep_the_test_connection():
    """Calls go straight to the WSGI app, in the test's transaction: keep Django from closing the connection at
    the end of each request (its own test client does the same)."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def token(keep_the_test_connection, alice, bob, teams, node, submit, carol):
    """Alice, with a job of hers, a job of another team, and a running slice to show in the cluster."""
    from quotas.tokens import api_token_create
    from scheduling.agents import joblogs
    from scheduling.choices import ActorKind, JobState
    from scheduling.inventory.models import Gpu

    mine = submit(alice, teams["training"], name="mine")
    submit(bob, teams["inference"], name="theirs")
    running = submit(carol, teams["training"], gpus=0, gpu_memory_mib=10240, compute_pct=25)
    job_transition(job=running, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER)
    slice_allocate(job=running, gpu=Gpu.objects.get(node=node, index=6), memory_mib=10240, compute_pct=25)
    joblogs.log_append(job_id=mine.pk, stream="stdout", data="hello\n")
    spare, _ = api_token_create(user=alice, name="spare")
    return {
        "token": api_token_create(user=alice, name="schemathesis")[1],
        "ids": {
            "/api/v1/jobs/": mine.pk,
            "/api/v1/tokens/": spare.pk,
            "/api/v1/teams/": teams["training"].pk,
        },
    }


def _half(value: object) -> bool:
    """A stable coin per value (crc32, not hash(): str hashing is salted per process, defeating derandomize)."""
    return zlib.crc32(str(value).encode()) % 2 == 0


@pytest.mark.django_db
@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_the_api_answers_every_generated_request_without_a_server_error(case, token):
    # Random ids mostly miss (404); point half of the cases at objects that exist so their 200s are checked too
    # (not where the id is the invalid part of a negative case: the server would then be blamed for taking it).
    params = (
        {} if case.meta and case.meta.is_negative_at(ParameterLocation.PATH) else case.path_parameters or {}
    )
    for prefix, real_id in token["ids"].items():
        if case.path.startswith(prefix) and "id" in params and _half(params["id"]):
            params["id"] = real_id
    if case.path.startswith("/api/v1/cluster/nodes/") and "name" in params and _half(params["name"]):
        params["name"] = "a100-01"
    case.call_and_validate(headers={"Authorization": f"Bearer {token['token']}"}, checks=CHECKS)


YAML_SPEC = "name: hostile\ncommand: python run.py\n"
HOSTILE_SUBMITS = [
    ("application/yaml", YAML_SPEC + "gpus: 1\nmax_runtime: .nan\n"),
    ("application/yaml", YAML_SPEC + "gpus: .inf\n"),
    ("application/yaml", YAML_SPEC + "gpus: 1\nenv: {SEED: -.inf}\n"),
    ("application/yaml", YAML_SPEC + "gpus: " + "1" * 5000 + "\n"),
    ("application/yaml", YAML_SPEC + f"gpus: 1\nmemory_mib: {2**64}\n"),
    # A body that starts with "{" is read as JSON, whose parser accepts NaN and Infinity unless told not to.
    ("application/yaml", '{"name": "a", "command": "b", "gpus": 1, "max_runtime": NaN}'),
    ("application/yaml", '{"name": "a", "command": "b", "gpus": Infinity}'),
    ("application/json", '{"name": "a", "command": "b", "gpus": 1, "max_runtime": 1e400}'),
    ("application/json", '{"name": "a", "command": "b", "gpus": 1, "cpu": ' + str(2**70) + "}"),
]
NEGATIVE_ZERO = YAML_SPEC + "gpus: 1\ncompute_pct: -0.0\n"  # read as 0: accepted


@pytest.mark.django_db
@pytest.mark.parametrize(("media_type", "text"), HOSTILE_SUBMITS)
def test_hostile_specs_are_refused_without_a_server_error(token, media_type, text):
    case = schema["/api/v1/jobs/"]["POST"].Case(body={}, media_type=media_type)
    response = case.call(
        headers={"Authorization": f"Bearer {token['token']}", "Content-Type": media_type}, data=text.encode()
    )
    case.validate_response(response, checks=CHECKS)
    assert response.status_code == 400, response.text


@pytest.mark.django_db
def test_negative_zero_in_a_spec_reads_as_zero(token):
    case = schema["/api/v1/jobs/"]["POST"].Case(body={}, media_type="application/yaml")
    response = case.call(
        headers={"Authorization": f"Bearer {token['token']}", "Content-Type": "application/yaml"},
        data=NEGATIVE_ZERO.encode(),
    )
    case.validate_response(response, checks=CHECKS)
    assert response.status_code == 201, response.text
    assert response.json()["request"]["compute_pct"] == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query",
    [
        {"until": "0001-01-01"},
        {"since": "0001-01-01T00:00:00+05:00"},
        {"until": "9999-12-31T23:59:59-14:00"},
        {"since": "2026-02-30"},
        {"since": "1" * 5000},
    ],
)
def test_odd_usage_dates_are_refused_without_a_server_error(token, query):
    case = schema["/api/v1/usage/"]["GET"].Case(query=query)
    response = case.call_and_validate(headers={"Authorization": f"Bearer {token['token']}"}, checks=CHECKS)
    assert response.status_code == 400, response.text

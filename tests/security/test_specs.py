"""Hostile job specs: each refused with a 400 that names the field and the limit, cheaply, storing nothing."""

from __future__ import annotations

import gc
import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from scheduling.jobs.models import Job
from scheduling.jobs.spec import SpecError, spec_from_text
from tests.support import TIMEOUT_SCALE

pytestmark = pytest.mark.django_db


def _bomb(levels: int = 8, width: int = 10) -> str:
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\nname: bomb\ncommand: run\ngpus: 1\n"


@pytest.fixture
def as_alice(alice, node):
    client = APIClient()
    client.force_authenticate(alice)
    return client


def _post_yaml(client, text: str | bytes):
    body = text.encode() if isinstance(text, str) else text
    return client.post("/api/v1/jobs/", body, content_type="application/yaml")


def _post_json(client, text: str):
    return client.post(
        "/api/v1/jobs/", text.encode("utf-8", "surrogatepass"), content_type="application/json"
    )


def _refused(response, field: str, words: str):
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["field"] == field and words in error["message"], error
    assert not Job.objects.exists()
    return error


def test_a_yaml_alias_bomb_is_refused_at_once(as_alice, teams):
    started = time.process_time()
    _refused(_post_yaml(as_alice, _bomb()), "spec", "anchors and aliases")
    assert time.process_time() - started < 1.0 * TIMEOUT_SCALE  # it took 15 s once


def test_a_self_referencing_alias_is_a_400_not_a_500(as_alice, teams):
    _refused(_post_yaml(as_alice, "name: &a [*a]\ncommand: run\ngpus: 1\n"), "spec", "anchors and aliases")


def test_json_nested_100000_deep_is_a_400(as_alice, teams):
    response = _post_json(as_alice, "[" * 100_000 + "]" * 100_000)
    assert response.status_code == 400 and "nested deeper" in response.json()["error"]["message"]
    assert not Job.objects.exists()


def test_yaml_with_50000_open_brackets_is_a_400(as_alice, teams):
    error = _refused(_post_yaml(as_alice, "[" * 50_000), "spec", "nests deeper than")
    assert error["limit"] == 16


@pytest.mark.parametrize("field", ["name", "command"])
def test_a_lone_surrogate_in_text_is_a_400_naming_the_field(as_alice, teams, field):
    spec = {"name": "ok", "command": "run", "gpus": 1, "team": "ai-lab/training"}
    body = json.dumps(spec).replace(f'"{spec[field]}"', '"bad \\ud800 text"')
    _refused(_post_json(as_alice, body), field, "lone surrogate")


def test_a_lone_surrogate_in_an_env_value_is_refused_not_stored_to_fail_at_launch(teams):
    with pytest.raises(SpecError, match="surrogate") as refused:
        spec_from_text('{"name": "a", "command": "b", "gpus": 1, "env": {"A": "x\\udc80y"}}')
    assert refused.value.field == "env"


def test_invalid_utf8_in_yaml_is_a_400_not_silently_replaced(as_alice, teams):
    _refused(_post_yaml(as_alice, b"name: caf\xe9\ncommand: run\ngpus: 1\n"), "spec", "not valid UTF-8")


def test_a_key_given_twice_in_yaml_is_a_400(as_alice, teams):
    _refused(_post_yaml(as_alice, "name: a\ngpus: 1\ncommand: run\ngpus: 8\n"), "spec", "'gpus' twice")


def test_a_key_given_twice_in_json_is_a_400(as_alice, teams):
    response = _post_json(as_alice, '{"name": "a", "command": "run", "gpus": 1, "gpus": 8}')
    assert response.status_code == 400 and "twice" in response.json()["error"]["message"]
    assert not Job.objects.exists()


def test_an_unreadable_boolean_filter_is_a_400_naming_it(as_alice, teams):
    response = as_alice.get("/api/v1/jobs/?mine=maybe")
    assert response.status_code == 400
    assert "mine" in json.dumps(response.json())
    assert as_alice.get("/api/v1/jobs/?mine=true").status_code == 200


def test_a_spec_over_256_kib_is_refused_naming_the_limit(as_alice, teams):
    error = _refused(_post_yaml(as_alice, "name: a\ncommand: " + "x" * (256 * 1024)), "spec", "at most")
    assert error["limit"] == 256 * 1024
    # Past it by its Content-Length, YAML or JSON, 300 KB or 3 MB: refused before any of it is read.
    for response in (
        _post_yaml(as_alice, "name: a\ncommand: " + "x" * 3_000_000),
        _post_json(as_alice, '{"name": "a", "command": "' + "x" * 300_000 + '"}'),
    ):
        assert _refused(response, "spec", "at most 262144 bytes")["limit"] == 256 * 1024


# --- a property: no document, however odd, gets anything but a clean refusal, quickly --------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=25,
)
_documents = st.one_of(
    st.dictionaries(
        st.sampled_from(
            [
                "name",
                "command",
                "gpus",
                "gpu_memory",
                "compute_pct",
                "env",
                "nodes",
                "topology",
                "cwd",
                "bogus",
            ]
        ),
        _values,
        max_size=6,
    ).map(lambda d: json.dumps(d, allow_nan=True)),
    st.text(max_size=300),
    st.binary(max_size=300),
    st.text(alphabet="[]{}&*:,- \n\"'!|>%@`\\x", max_size=300),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_documents)
def test_any_document_is_accepted_or_refused_cleanly_within_5_ms(document):
    # This thread's CPU only (other threads of a long test session are not the refusal's cost), with the
    # collector held off: a pause for garbage from earlier tests belongs to no one spec.
    gc.disable()
    try:
        started = time.thread_time()
        try:
            spec_from_text(document)
        except SpecError as refused:
            spent = time.thread_time() - started
            assert refused.field and refused.message
            assert spent < 0.005, (document[:80], refused.message, spent)
    finally:
        gc.enable()

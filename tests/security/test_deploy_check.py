"""`manage.py check --deploy` fails while SECRET_KEY is the embedded demo key (issue: it only warned)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError


def test_check_deploy_fails_on_the_embedded_demo_key(settings):
    settings.SECRET_KEY = settings.EMBEDDED_SECRET_KEY
    with pytest.raises(SystemCheckError, match="tessera.E001"):
        call_command("check", deploy=True, stdout=io.StringIO(), stderr=io.StringIO())


def test_check_deploy_does_not_raise_e001_with_a_key_of_its_own(settings):
    settings.SECRET_KEY = "a-long-random-production-key-" + "x" * 40
    out = io.StringIO()
    try:
        call_command("check", deploy=True, stdout=out, stderr=out)
    except SystemCheckError as exc:  # other deploy settings (TLS) may still be reported; not this one
        assert "tessera.E001" not in str(exc)
    else:
        assert "tessera.E001" not in out.getvalue()

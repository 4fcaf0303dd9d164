"""What the quota editor's page tests share: a signed-in client, and the editor's form as a person fills it in
(GiB, as the page shows sizes), with some fields changed."""

from __future__ import annotations

from django.test import Client


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def quota_form(**changes) -> dict:
    form = {
        "scope": "all",
        "guaranteed_gpus": "4",
        "limit_gpus": "8",
        "guaranteed_gib": "320",
        "limit_gib": "640",
        "fair_share_weight": "1",
        "default_priority_class": "training",
        "reason": "",
    }
    return {**form, **changes}

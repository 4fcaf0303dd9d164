"""Who may read /metrics: this host, an allowed network, or a bearer of the metrics token; nobody else."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings

pytestmark = pytest.mark.django_db


def test_this_host_reads_the_metrics_and_another_address_is_refused(node):
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 200
    refused = Client(REMOTE_ADDR="10.1.2.3").get("/metrics")
    assert refused.status_code == 403 and b"TESSERA_METRICS_TOKEN" in refused.content


@override_settings(TESSERA_METRICS_TOKEN="s3cret", TESSERA_METRICS_ALLOW_NETWORKS=["10.9.0.0/16"])
def test_a_bearer_token_or_an_allowed_network_opens_it(node):
    outside = Client(REMOTE_ADDR="192.0.2.7")
    assert outside.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200
    assert outside.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert Client(REMOTE_ADDR="10.9.4.4").get("/metrics").status_code == 200
    body = outside.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").content.decode()
    assert "kueue_cluster_queue_nominal_quota" in body and 'Hostname="a100-01"' in body

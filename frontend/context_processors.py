"""What every portal page's template may use."""

from __future__ import annotations

import json

from django.conf import settings
from django.http import HttpRequest

from scheduling.choices import JobState

# The job states as the pages label them; live badges take their text from here, not from a copy in script.
_STATE_LABELS_JSON = json.dumps(dict(JobState.choices))


def portal(request: HttpRequest) -> dict:
    return {"state_labels_json": _STATE_LABELS_JSON, "demo": getattr(settings, "TESSERA_DEMO", False)}

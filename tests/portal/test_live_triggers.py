"""When a live part of a page is re-requested (frontend.templatetags.portal.refresh_on, the parts' hx-trigger): on its
stream events after the last of a burst, at once when the page catches up, with the filters it was given."""

from __future__ import annotations

from frontend.templatetags.portal import refresh_on


def test_a_part_follows_its_events_debounced_and_catches_up_at_once():
    assert refresh_on("job.changed queue.changed") == (
        "tessera:job.changed from:body delay:200ms, tessera:queue.changed from:body delay:200ms, "
        "tessera:catch-up from:body"
    )


def test_an_events_own_filter_holds_for_that_event_and_when_for_every_trigger():
    assert refresh_on("job.changed queue.changed[!!this.querySelector('#why')]") == (
        "tessera:job.changed from:body delay:200ms, "
        "tessera:queue.changed[(!!this.querySelector('#why'))] from:body delay:200ms, tessera:catch-up from:body"
    )
    assert refresh_on("node.changed gpu.health[!!x]", when="this.open") == (
        "tessera:node.changed[(this.open)] from:body delay:200ms, "
        "tessera:gpu.health[(!!x) && (this.open)] from:body delay:200ms, tessera:catch-up[(this.open)] from:body"
    )

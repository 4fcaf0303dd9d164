"""Pages an admin and a researcher meet beside their jobs: the notification settings' checkbox on its label's
line, the admin site's quota in GiB and GPUs with a link to the portal's editor, and the quota editor's tabs and
its warning when the memory limit cannot hold the GPU limit's cards."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_the_by_email_checkbox_sits_on_its_labels_line_right_before_it(browse):
    page = browse("alice")
    page.goto("/account/notifications/")
    box = page.locator("#id_email").bounding_box()
    label = page.locator("label[for=id_email]").bounding_box()
    box_middle, label_middle = box["y"] + box["height"] / 2, label["y"] + label["height"] / 2
    assert abs(box_middle - label_middle) <= 2, f"checkbox middle {box_middle}, its label's {label_middle}"
    assert 0 <= label["x"] - (box["x"] + box["width"]) <= 16, (
        "the box right before its label, not centred apart"
    )
    browse.shots(page, "notifications")

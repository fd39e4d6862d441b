"""The settings reference page (docs/settings.md) holds the table the declarations generate."""

from __future__ import annotations

import pathlib

from delayapp.settings import markdown_table

SETTINGS_PAGE = pathlib.Path(__file__).parents[1] / "docs" / "settings.md"


def test_settings_page_lists_every_setting_as_declared() -> None:
    page = SETTINGS_PAGE.read_text()
    assert markdown_table() in page, "docs/settings.md table is stale: paste `python settings.py --markdown`"

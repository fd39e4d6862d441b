"""The README's settings table is the one the declarations generate."""

from __future__ import annotations

import pathlib

from delayapp.settings import markdown_table


def test_readme_lists_every_setting_as_declared() -> None:
    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    assert markdown_table() in readme, "README settings table is stale: paste `python settings.py --markdown`"

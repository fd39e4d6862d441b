"""delayapp's settings, as the design card places them at the repository root.

The declarations live in :mod:`delayapp.settings` (one place, imported by the app);
run ``python settings.py`` to print every setting with its environment variable,
effective value, default and description, or ``python settings.py --markdown`` for the
table in docs/settings.md (a unit test keeps the page in step).
"""

import sys

from delayapp.settings import Guarantee, Settings, load_settings, markdown_table  # noqa: F401  (re-exported)

if __name__ == "__main__":
    if "--markdown" in sys.argv:
        print(markdown_table())
    else:
        for env, value, default, doc in load_settings().describe():
            print(f"{env:34} {value:28} (default {default}) {doc}")

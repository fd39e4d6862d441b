"""The Faust shell of delayapp: the app, its services, web views and commands.

``faust -A delayapp`` reaches :data:`app` through ``delayapp.app``. Importing this package
registers the views and commands on it: they import the app module, nothing imports them.
"""

from __future__ import annotations

from delayapp.faustapp import commands, views
from delayapp.faustapp.app import app

__all__ = ["app", "commands", "views"]

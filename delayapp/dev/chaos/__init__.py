"""Chaos harness: real worker processes, SIGKILL/SIGTERM and network cuts, then a full audit.

``python -m delayapp.dev.chaos`` runs the long version; the test suite runs a short one.
"""

"""No topic auto-creation: aiokafka's metadata requests are changed where the app starts, never
on import (delayapp.engine.metadata.forbid_topic_auto_creation)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

# What a fresh process's aiokafka metadata requests ask for, before and after the app starts.
_PROBE = textwrap.dedent(
    """
    import json
    from aiokafka.protocol.metadata import MetadataRequest

    def asks() -> object:
        return MetadataRequest(["t"])._allow_auto_topic_creation  # None: aiokafka's own default (allowed)

    seen = {"untouched": asks()}
    import delayapp, delayapp.client, delayapp.core.planner, delayapp.core.hop
    import delayapp.engine.service, delayapp.engine.metadata, delayapp.statestore.service, delayapp.ops.scan
    seen["imported"] = asks()
    seen["forbidden_before_start"] = delayapp.engine.metadata.topic_auto_creation_forbidden()
    import delayapp.faustapp.app  # the app starts: `faust -A delayapp` imports it before any client exists
    seen["app_started"] = asks()
    seen["forbidden"] = delayapp.engine.metadata.topic_auto_creation_forbidden()
    print(json.dumps(seen))
    """
)


def test_importing_delayapp_leaves_aiokafka_alone_and_the_app_start_forbids_auto_creation() -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["untouched"] is None
    assert seen["imported"] is None and seen["forbidden_before_start"] is False, "importing delayapp patched aiokafka"
    assert seen["app_started"] is False and seen["forbidden"] is True


def test_forbidding_twice_changes_nothing_more() -> None:
    script = textwrap.dedent(
        """
        from aiokafka.protocol.metadata import MetadataRequest
        from delayapp.engine.metadata import forbid_topic_auto_creation

        forbid_topic_auto_creation()
        once = MetadataRequest.__init__
        forbid_topic_auto_creation()
        assert MetadataRequest.__init__ is once, "wrapped twice"
        assert MetadataRequest(["t"])._allow_auto_topic_creation is False
        assert MetadataRequest(["t"], True)._allow_auto_topic_creation is True, "an explicit ask is kept"
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]

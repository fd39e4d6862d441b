"""One router loop per enabled compat source, for :class:`delayapp.engine.service.DelayEngine`."""

from __future__ import annotations

import logging
from typing import Any

from delayapp.compat.translating_handler import cesium_handler, envelope_handler
from delayapp.core.layout import TopicLayout
from delayapp.core.policies import Reason
from delayapp.engine.handler import RecordHandler
from delayapp.engine.loop import HopLoop, RouterLoop
from delayapp.errors import ConfigError
from delayapp.settings import Settings

log = logging.getLogger(__name__)


def _check_cesium(settings: Settings, handler: RecordHandler) -> tuple[str, str]:
    """The relay's source and destination; refuses a destination the policy would refuse for
    every record, and a source that is one of delayapp's own topics."""
    source, destination = settings.cesium_source, settings.cesium_destination
    assert source is not None and destination is not None  # the settings require both
    refused = handler.policy.check_target(destination)
    if refused is not None:
        raise ConfigError(f"DELAYAPP_CESIUM_DESTINATION: {refused.detail}")
    own = handler.policy.check_target(source)
    if own is not None and own.reason is Reason.TARGET_LOOP:
        raise ConfigError(f"DELAYAPP_CESIUM_SOURCE: {own.detail}; the relay reads one of your topics")
    return source, destination


def compat_loops(layout: TopicLayout, *, handler: RecordHandler, settings: Settings, **common: Any) -> list[HopLoop]:
    """The loops of the enabled compat sources (none by default); ``common`` as for every HopLoop."""
    s = settings
    loops: list[HopLoop] = []
    if s.compat_envelope:
        loops.append(
            RouterLoop(
                name="compat-envelope",
                topic=layout.compat_envelope,
                group_id=f"{s.app_id}.compat-envelope",
                handler=envelope_handler(handler),
                settings=s,
                **common,
            )
        )
        log.info("compat ingress: Redis-scheduler envelopes on %s", layout.compat_envelope)
    if s.cesium_source is not None:
        source, destination = _check_cesium(s, handler)
        loops.append(
            RouterLoop(
                name="cesium",
                topic=source,
                group_id=f"{s.app_id}.cesium",
                handler=cesium_handler(handler, destination),
                settings=s,
                **common,
            )
        )
        log.info("compat ingress: cesium relay from %s to %s", source, destination)
    return loops

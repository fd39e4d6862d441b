"""Compat ingress: let producers written for other delay systems use delayapp unchanged.

* :mod:`.envelope`: the Redis sorted-set scheduler's JSON envelope on ``<prefix>.compat.envelope``;
* :mod:`.cesium`: cesium-kafka-delay's relay from a source topic to a destination topic.

The translators are pure; :mod:`.translating_handler` puts them in front of the router's handler and
:mod:`.loops` runs one loop per enabled source.
"""

"""The step of each record a hop loop releases: a refusal to carry out, the lean step, or the
handler's full path. Compiled with the record path (:mod:`delayapp.compiled`): it runs once per
record, called by the partition state machine and calling the lean step, both compiled."""

from __future__ import annotations

from typing import cast

from confluent_kafka import Message

from delayapp.core.hop import LeanHeaders
from delayapp.core.partition import PartitionKey, Pending
from delayapp.core.policies import Wait
from delayapp.engine.handler import Handler, LeanOutput, Output
from delayapp.engine.intake import FetchedRecord, as_record
from delayapp.engine.writer import Writer


class Steps:
    """Decides the step of a released record of one loop (``ingress``: the router's, admitted
    by the lean admission or the full path; else a delay topic's of denomination ``max_wait_ms``)."""

    def __init__(self, *, handler: Handler, writer: Writer, ingress: bool, max_wait_ms: int) -> None:
        self.handler = handler
        self.lean_step = handler.lean_step
        self.lean_admission = handler.lean_admission
        self.writer = writer
        self.ingress = ingress
        self.max_wait_ms = max_wait_ms

    def __call__(self, key: PartitionKey, entry: Pending, now: int) -> Wait | list[Output] | LeanOutput:
        """The step of ``entry`` (fetched from ``key``) at ``now``: the lean step's where it
        decides, else the handler's."""
        writer = self.writer
        if writer.refused:  # its target refused it in an aborted transaction: dead-letter it now
            refused = writer.refused.pop((key, entry.offset), None)
            if refused is not None:
                return [self.handler.refused(as_record(entry), refused, now=now)]
        if self.ingress:
            admission = self.lean_admission
            record = entry.record
            if admission is not None and not writer.careful and isinstance(record, FetchedRecord):
                admitted = admission(
                    record.key,
                    record.value,
                    cast(LeanHeaders, record.headers),
                    entry.size,
                    record.timestamp,
                    record.timestamp_type,
                    key,
                    entry.offset,
                    now,
                )
                if admitted is not None:
                    return admitted
            return self.handler.handle(as_record(entry), now=now, ingress=True, max_wait_ms=self.max_wait_ms)
        lean_step = self.lean_step
        if lean_step is not None and not writer.careful:
            message = entry.record
            if isinstance(message, Message):  # the lean step: a hop or a delivery from raw headers
                step = lean_step.take(message.value(), entry.size, entry.headers, now, key, entry.offset, entry.lean)
                if step is not None:
                    return step
        return self.handler.handle(as_record(entry), now=now, ingress=self.ingress, max_wait_ms=self.max_wait_ms)

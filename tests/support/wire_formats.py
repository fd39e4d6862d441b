"""Records as earlier versions of delayapp wrote them, kept as bytes: the compatibility promise's
test data (docs/upgrading.md).

Every wire format delayapp has written since 0.1.0 to a delay topic, the cancel topic and
record-states, each as its version wrote it. The bytes were made once by running that
version's own code (its ``RecordHandler``, ``AuditEvent.encode`` and ``encode_cancel``) from a
checkout of it, with a fixed clock (:data:`T0`), the test ladder ``200ms,1s,3s``, a policy that
holds waits under 1 s in the worker, and these records entering ``old.ingress``:

* ``A``: a producer's ``reactivateAt`` (due ``T0 + 4.7 s``), headers of its own before and after
  delayapp's (one holds bytes that are not text, and ``;`` and ``=``, which the packed form uses);
* ``B``: ``delayMs`` 4200, ``timeRetried`` 2, ``originatedAt`` and ``expireAt`` set;
* ``C``: due ``T0 + 3.5 s``, cancelled by the cancel record below (appended after it entered);
* ``D``: no ``recordId`` (the router made one from where it entered), the priority lane;
* ``E``: a delay beyond the maximum: dead-lettered at the ingress (a record-states step only);
* ``F`` (from 0.3.0): sent back in by the dead-letter replay (``timeReplayed`` 1), ``validAt`` set.

Each delay record is named by its record and hop (``A2``: A's second hop) and carries what
that version's own decoder read from it (:class:`Expected`). The formats, by the version that
introduced them (CHANGELOG.md; the commit each version's bytes were made from in brackets):

Delay topics
  * plain headers, 0.1.0 [2bb15a5]: the state as one header per field, after the record's own
    headers: ``recordId``, ``originatedAt``, ``timeRetried``, [``validAt``, ``expireAt``],
    ``delayedAt``, ``reactivateAt``, ``reactivateToTopic``, ``awakeAt``, ``delayHops``,
    [``delayPriority``, ``throttledUntil``] (:data:`PLAIN_HEADERS`). 0.2.0 [e1e0747] wrote the
    same bytes (its lean hop rewrote ``awakeAt`` and ``delayHops`` in place).
  * plain headers with ``timeReplayed``, 0.3.0 [7257466]: a replayed record's count, after
    ``expireAt`` (:data:`PLAIN_HEADERS_REPLAYED`; its other records are byte for byte 0.1.0's).
  * packed ``delayState``, 0.4.0 [0b6f8cd]: the same names and values in one header,
    ``awakeAt=...;delayHops=...;...;recordId=...``, after the record's own headers
    (:data:`PACKED_STATE`). What this version writes, byte for byte.

record-states (key: the record id; value: one step's JSON)
  * 0.1.0 [2bb15a5]: the step with the partition and offset its record was written to
    (:data:`STATES_LOCATED`);
  * 0.2.0 [e1e0747]: ``partition`` and ``offset`` null (:data:`STATES_UNLOCATED`);
  * 0.3.0 [7257466]: ``replays`` added before ``topic`` (:data:`STATES_REPLAYS`); 0.4.0 and
    this version write the same bytes.

Cancel topic (key: the record id; value: any bytes, a JSON object's ``reason`` and ``by`` read)
  * 0.1.0 [2bb15a5], unchanged since: ``encode_cancel``'s JSON (:data:`CANCEL_RECORD`), and the
    values the contract has always accepted from other producers (:data:`CANCEL_VALUES`).

Commit metadata of the delay topics' consumer groups (what a loop released ahead of its commit)
  * ranges, 0.1.0 [2bb15a5]: ``released:3-5,9,50``, offsets after the committed one;
  * a bitmap, 0.3.0 [8a7d66e]: ``released~`` and base64 (:data:`COMMIT_METADATA`); 0.4.0 the same;
  * the bitmap bound to its commit point, 0.5.0: ``released@<offset>~`` and base64, so that a
    commit translated to another offset (MirrorMaker 2 copies the metadata) names nothing. What
    this version writes.

A literal here is never edited: a version that writes a new format adds a block of its own.
"""

from __future__ import annotations

from typing import NamedTuple

T0 = 1_800_000_000_000
"""The generating clock: every epoch-ms value in the records below is ``T0`` plus or minus seconds."""
TARGET = b"compat-orders"
"""The target every record below names (``reactivateToTopic``)."""


class Expected(NamedTuple):
    """What the writing version's own decoder read from a delay record."""

    record_id: str
    target: str
    due: int
    awake_at: int
    retries: int
    hops: int
    delayed_at: int | None
    priority: bool
    replays: int
    valid_at: int | None
    expire_at: int | None
    passthrough: list[tuple[str, bytes]]


class DelayRecord(NamedTuple):
    """One record as a version wrote it to the delay topic of ``denomination``."""

    name: str
    denomination: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    expected: Expected


PLAIN_HEADERS: tuple[DelayRecord, ...] = (
    DelayRecord(
        "A1",
        "3s",
        b"A",
        b"payload-A",
        [
            ("trace-id", b"t-1"),
            ("x-bin", b"\x00\xff\n;="),
            ("recordId", b"order-A"),
            ("originatedAt", b"1800000000000"),
            ("timeRetried", b"0"),
            ("delayedAt", b"1800000000000"),
            ("reactivateAt", b"1800000004700"),
            ("reactivateToTopic", b"compat-orders"),
            ("awakeAt", b"1800000003000"),
            ("delayHops", b"1"),
        ],
        Expected(
            record_id="order-A",
            target="compat-orders",
            due=1800000004700,
            awake_at=1800000003000,
            retries=0,
            hops=1,
            delayed_at=1800000000000,
            priority=False,
            replays=0,
            valid_at=None,
            expire_at=None,
            passthrough=[("trace-id", b"t-1"), ("x-bin", b"\x00\xff\n;=")],
        ),
    ),
    DelayRecord(
        "A2",
        "1s",
        b"A",
        b"payload-A",
        [
            ("trace-id", b"t-1"),
            ("x-bin", b"\x00\xff\n;="),
            ("recordId", b"order-A"),
            ("originatedAt", b"1800000000000"),
            ("timeRetried", b"0"),
            ("delayedAt", b"1800000000000"),
            ("reactivateAt", b"1800000004700"),
            ("reactivateToTopic", b"compat-orders"),
            ("awakeAt", b"1800000004000"),
            ("delayHops", b"2"),
        ],
        Expected(
            record_id="order-A",
            target="compat-orders",
            due=1800000004700,
            awake_at=1800000004000,
            retries=0,
            hops=2,
            delayed_at=1800000000000,
            priority=False,
            replays=0,
            valid_at=None,
            expire_at=None,
            passthrough=[("trace-id", b"t-1"), ("x-bin", b"\x00\xff\n;=")],
        ),
    ),
    DelayRecord(
        "B1",
        "3s",
        b"B",
        b"payload-B",
        [
            ("recordId", b"order-B"),
            ("originatedAt", b"1799999940000"),
            ("timeRetried", b"2"),
            ("expireAt", b"1800003600000"),
            ("delayedAt", b"1800000000000"),
            ("reactivateAt", b"1800000004200"),
            ("reactivateToTopic", b"compat-orders"),
            ("awakeAt", b"1800000003000"),
            ("delayHops", b"1"),
        ],
        Expected(
            record_id="order-B",
            target="compat-orders",
            due=1800000004200,
            awake_at=1800000003000,
            retries=2,
            hops=1,
            delayed_at=1800000000000,
            priority=False,
            replays=0,
            valid_at=None,
            expire_at=1800003600000,
            passthrough=[],
        ),
    ),
    DelayRecord(
        "B2",
        "1s",
        b"B",
        b"payload-B",
        [
            ("recordId", b"order-B"),
            ("originatedAt", b"1799999940000"),
            ("timeRetried", b"2"),
            ("expireAt", b"1800003600000"),
            ("delayedAt", b"1800000000000"),
            ("reactivateAt", b"1800000004200"),
            ("reactivateToTopic", b"compat-orders"),
            ("awakeAt", b"1800000004000"),
            ("delayHops", b"2"),
        ],
        Expected(
            record_id="order-B",
            target="compat-orders",
            due=1800000004200,
            awake_at=1800000004000,
            retries=2,
            hops=2,
            delayed_at=1800000000000,
            priority=False,
            replays=0,
            valid_at=None,
            expire_at=1800003600000,
            passthrough=[],
        ),
    ),
    DelayRecord(
        "C1",
        "3s",
        b"C",
        b"payload-C",
        [
            ("recordId", b"order-C"),
            ("originatedAt", b"1800000000000"),
            ("timeRetried", b"0"),
            ("delayedAt", b"1800000000000"),
            ("reactivateAt", b"1800000003500"),
            ("reactivateToTopic", b"compat-orders"),
            ("awakeAt", b"1800000003000"),
            ("delayHops", b"1"),
        ],
        Expected(
            record_id="order-C",
            target="compat-orders",
            due=1800000003500,
            awake_at=1800000003000,
            retries=0,
            hops=1,
            delayed_at=1800000000000,
            priority=False,
            replays=0,
            valid_at=None,
            expire_at=None,
            passthrough=[],
        ),
    ),
    DelayRecord(
        "D1",
        "1s.priority",
        b"D",
        b"payload-D",
        [
            ("recordId", b"a30cb4e5-ebb4-5bbb-9ff3-2fa359878630"),
            ("originatedAt", b"1800000000000"),
            ("timeRetried", b"0"),
            ("delayedAt", b"1800000000000"),
            ("reactivateAt", b"1800000001500"),
            ("reactivateToTopic", b"compat-orders"),
            ("awakeAt", b"1800000001000"),
            ("delayHops", b"1"),
            ("delayPriority", b"high"),
        ],
        Expected(
            record_id="a30cb4e5-ebb4-5bbb-9ff3-2fa359878630",
            target="compat-orders",
            due=1800000001500,
            awake_at=1800000001000,
            retries=0,
            hops=1,
            delayed_at=1800000000000,
            priority=True,
            replays=0,
            valid_at=None,
            expire_at=None,
            passthrough=[],
        ),
    ),
)

PLAIN_HEADERS_REPLAYED: tuple[DelayRecord, ...] = (
    DelayRecord(
        "F1",
        "1s",
        b"F",
        b"payload-F",
        [
            ("recordId", b"order-F"),
            ("originatedAt", b"1800000000000"),
            ("timeRetried", b"0"),
            ("validAt", b"1800000001000"),
            ("timeReplayed", b"1"),
            ("delayedAt", b"1800000000000"),
            ("reactivateAt", b"1800000002400"),
            ("reactivateToTopic", b"compat-orders"),
            ("awakeAt", b"1800000001000"),
            ("delayHops", b"1"),
        ],
        Expected(
            record_id="order-F",
            target="compat-orders",
            due=1800000002400,
            awake_at=1800000001000,
            retries=0,
            hops=1,
            delayed_at=1800000000000,
            priority=False,
            replays=1,
            valid_at=1800000001000,
            expire_at=None,
            passthrough=[],
        ),
    ),
    DelayRecord(
        "F2",
        "1s",
        b"F",
        b"payload-F",
        [
            ("recordId", b"order-F"),
            ("originatedAt", b"1800000000000"),
            ("timeRetried", b"0"),
            ("validAt", b"1800000001000"),
            ("timeReplayed", b"1"),
            ("delayedAt", b"1800000000000"),
            ("reactivateAt", b"1800000002400"),
            ("reactivateToTopic", b"compat-orders"),
            ("awakeAt", b"1800000002000"),
            ("delayHops", b"2"),
        ],
        Expected(
            record_id="order-F",
            target="compat-orders",
            due=1800000002400,
            awake_at=1800000002000,
            retries=0,
            hops=2,
            delayed_at=1800000000000,
            priority=False,
            replays=1,
            valid_at=1800000001000,
            expire_at=None,
            passthrough=[],
        ),
    ),
)

PACKED_STATE: tuple[DelayRecord, ...] = (
    DelayRecord(
        "A1",
        "3s",
        b"A",
        b"payload-A",
        [
            ("trace-id", b"t-1"),
            ("x-bin", b"\x00\xff\n;="),
            (
                "delayState",
                b"awakeAt=1800000003000;delayHops=1;originatedAt=1800000000000;timeRetried=0;delayedAt=1800000000000;reactivateAt=1800000004700;reactivateToTopic=compat-orders;recordId=order-A",
            ),
        ],
        Expected(
            record_id="order-A",
            target="compat-orders",
            due=1800000004700,
            awake_at=1800000003000,
            retries=0,
            hops=1,
            delayed_at=1800000000000,
            priority=False,
            replays=0,
            valid_at=None,
            expire_at=None,
            passthrough=[("trace-id", b"t-1"), ("x-bin", b"\x00\xff\n;=")],
        ),
    ),
    DelayRecord(
        "A2",
        "1s",
        b"A",
        b"payload-A",
        [
            ("trace-id", b"t-1"),
            ("x-bin", b"\x00\xff\n;="),
            (
                "delayState",
                b"awakeAt=1800000004000;delayHops=2;originatedAt=1800000000000;timeRetried=0;delayedAt=1800000000000;reactivateAt=1800000004700;reactivateToTopic=compat-orders;recordId=order-A",
            ),
        ],
        Expected(
            record_id="order-A",
            target="compat-orders",
            due=1800000004700,
            awake_at=1800000004000,
            retries=0,
            hops=2,
            delayed_at=1800000000000,
            priority=False,
            replays=0,
            valid_at=None,
            expire_at=None,
            passthrough=[("trace-id", b"t-1"), ("x-bin", b"\x00\xff\n;=")],
        ),
    ),
    DelayRecord(
        "B1",
        "3s",
        b"B",
        b"payload-B",
        [
            (
                "delayState",
                b"awakeAt=1800000003000;delayHops=1;originatedAt=1799999940000;timeRetried=2;expireAt=1800003600000;delayedAt=1800000000000;reactivateAt=1800000004200;reactivateToTopic=compat-orders;recordId=order-B",
            ),
        ],
        Expected(
            record_id="order-B",
            target="compat-orders",
            due=1800000004200,
            awake_at=1800000003000,
            retries=2,
            hops=1,
            delayed_at=1800000000000,
            priority=False,
            replays=0,
            valid_at=None,
            expire_at=1800003600000,
            passthrough=[],
        ),
    ),
    DelayRecord(
        "B2",
        "1s",
        b"B",
        b"payload-B",
        [
            (
                "delayState",
                b"awakeAt=1800000004000;delayHops=2;originatedAt=1799999940000;timeRetried=2;expireAt=1800003600000;delayedAt=1800000000000;reactivateAt=1800000004200;reactivateToTopic=compat-orders;recordId=order-B",
            ),
        ],
        Expected(
            record_id="order-B",
            target="compat-orders",
            due=1800000004200,
            awake_at=1800000004000,
            retries=2,
            hops=2,
            delayed_at=1800000000000,
            priority=False,
            replays=0,
            valid_at=None,
            expire_at=1800003600000,
            passthrough=[],
        ),
    ),
    DelayRecord(
        "C1",
        "3s",
        b"C",
        b"payload-C",
        [
            (
                "delayState",
                b"awakeAt=1800000003000;delayHops=1;originatedAt=1800000000000;timeRetried=0;delayedAt=1800000000000;reactivateAt=1800000003500;reactivateToTopic=compat-orders;recordId=order-C",
            ),
        ],
        Expected(
            record_id="order-C",
            target="compat-orders",
            due=1800000003500,
            awake_at=1800000003000,
            retries=0,
            hops=1,
            delayed_at=1800000000000,
            priority=False,
            replays=0,
            valid_at=None,
            expire_at=None,
            passthrough=[],
        ),
    ),
    DelayRecord(
        "D1",
        "1s.priority",
        b"D",
        b"payload-D",
        [
            (
                "delayState",
                b"awakeAt=1800000001000;delayHops=1;originatedAt=1800000000000;timeRetried=0;delayedAt=1800000000000;reactivateAt=1800000001500;reactivateToTopic=compat-orders;delayPriority=high;recordId=a30cb4e5-ebb4-5bbb-9ff3-2fa359878630",
            ),
        ],
        Expected(
            record_id="a30cb4e5-ebb4-5bbb-9ff3-2fa359878630",
            target="compat-orders",
            due=1800000001500,
            awake_at=1800000001000,
            retries=0,
            hops=1,
            delayed_at=1800000000000,
            priority=True,
            replays=0,
            valid_at=None,
            expire_at=None,
            passthrough=[],
        ),
    ),
    DelayRecord(
        "F1",
        "1s",
        b"F",
        b"payload-F",
        [
            (
                "delayState",
                b"awakeAt=1800000001000;delayHops=1;originatedAt=1800000000000;timeRetried=0;validAt=1800000001000;timeReplayed=1;delayedAt=1800000000000;reactivateAt=1800000002400;reactivateToTopic=compat-orders;recordId=order-F",
            ),
        ],
        Expected(
            record_id="order-F",
            target="compat-orders",
            due=1800000002400,
            awake_at=1800000001000,
            retries=0,
            hops=1,
            delayed_at=1800000000000,
            priority=False,
            replays=1,
            valid_at=1800000001000,
            expire_at=None,
            passthrough=[],
        ),
    ),
    DelayRecord(
        "F2",
        "1s",
        b"F",
        b"payload-F",
        [
            (
                "delayState",
                b"awakeAt=1800000002000;delayHops=2;originatedAt=1800000000000;timeRetried=0;validAt=1800000001000;timeReplayed=1;delayedAt=1800000000000;reactivateAt=1800000002400;reactivateToTopic=compat-orders;recordId=order-F",
            ),
        ],
        Expected(
            record_id="order-F",
            target="compat-orders",
            due=1800000002400,
            awake_at=1800000002000,
            retries=0,
            hops=2,
            delayed_at=1800000000000,
            priority=False,
            replays=1,
            valid_at=1800000001000,
            expire_at=None,
            passthrough=[],
        ),
    ),
)

STATES_LOCATED: tuple[tuple[bytes, bytes], ...] = (
    (
        b"order-A",
        b'{"record_id":"order-A","status":"waiting","at":1800000000000,"seq":10,"retries":0,"hops":1,"target":"compat-orders","awake_at":1800000003000,"reactivate_at":1800000004700,"lateness_ms":null,"reason":null,"source":"old.ingress/0/7","priority":false,"throttled_until":null,"delayed_at":1800000000000,"topic":"old.delay.3s","partition":0,"offset":41}',
    ),
    (
        b"order-A",
        b'{"record_id":"order-A","status":"waiting","at":1800000003000,"seq":20,"retries":0,"hops":2,"target":"compat-orders","awake_at":1800000004000,"reactivate_at":1800000004700,"lateness_ms":null,"reason":null,"source":"old.delay.3s/0/41","priority":false,"throttled_until":null,"delayed_at":1800000000000,"topic":"old.delay.1s","partition":0,"offset":42}',
    ),
    (
        b"order-A",
        b'{"record_id":"order-A","status":"delivered","at":1800000004700,"seq":21,"retries":0,"hops":2,"target":"compat-orders","awake_at":null,"reactivate_at":1800000004700,"lateness_ms":0,"reason":null,"source":"old.delay.1s/0/42","priority":false,"throttled_until":null,"delayed_at":1800000000000,"topic":"compat-orders","partition":0,"offset":43}',
    ),
    (
        b"order-B",
        b'{"record_id":"order-B","status":"waiting","at":1800000000000,"seq":20000010,"retries":2,"hops":1,"target":"compat-orders","awake_at":1800000003000,"reactivate_at":1800000004200,"lateness_ms":null,"reason":null,"source":"old.ingress/0/7","priority":false,"throttled_until":null,"delayed_at":1800000000000,"topic":"old.delay.3s","partition":0,"offset":44}',
    ),
    (
        b"order-B",
        b'{"record_id":"order-B","status":"waiting","at":1800000003000,"seq":20000020,"retries":2,"hops":2,"target":"compat-orders","awake_at":1800000004000,"reactivate_at":1800000004200,"lateness_ms":null,"reason":null,"source":"old.delay.3s/0/44","priority":false,"throttled_until":null,"delayed_at":1800000000000,"topic":"old.delay.1s","partition":0,"offset":45}',
    ),
    (
        b"order-B",
        b'{"record_id":"order-B","status":"delivered","at":1800000004200,"seq":20000021,"retries":2,"hops":2,"target":"compat-orders","awake_at":null,"reactivate_at":1800000004200,"lateness_ms":0,"reason":null,"source":"old.delay.1s/0/45","priority":false,"throttled_until":null,"delayed_at":1800000000000,"topic":"compat-orders","partition":0,"offset":46}',
    ),
    (
        b"order-C",
        b'{"record_id":"order-C","status":"waiting","at":1800000000000,"seq":10,"retries":0,"hops":1,"target":"compat-orders","awake_at":1800000003000,"reactivate_at":1800000003500,"lateness_ms":null,"reason":null,"source":"old.ingress/0/7","priority":false,"throttled_until":null,"delayed_at":1800000000000,"topic":"old.delay.3s","partition":0,"offset":47}',
    ),
    (
        b"order-C",
        b'{"record_id":"order-C","status":"cancelled","at":1800000003000,"seq":13,"retries":0,"hops":1,"target":"compat-orders","awake_at":null,"reactivate_at":1800000003500,"lateness_ms":null,"reason":null,"source":"old.delay.3s/0/47","priority":false,"throttled_until":null,"delayed_at":1800000000000,"topic":null,"partition":null,"offset":null}',
    ),
    (
        b"a30cb4e5-ebb4-5bbb-9ff3-2fa359878630",
        b'{"record_id":"a30cb4e5-ebb4-5bbb-9ff3-2fa359878630","status":"waiting","at":1800000000000,"seq":10,"retries":0,"hops":1,"target":"compat-orders","awake_at":1800000001000,"reactivate_at":1800000001500,"lateness_ms":null,"reason":null,"source":"old.ingress/0/7","priority":true,"throttled_until":null,"delayed_at":1800000000000,"topic":"old.delay.1s.priority","partition":0,"offset":49}',
    ),
    (
        b"a30cb4e5-ebb4-5bbb-9ff3-2fa359878630",
        b'{"record_id":"a30cb4e5-ebb4-5bbb-9ff3-2fa359878630","status":"delivered","at":1800000001500,"seq":11,"retries":0,"hops":1,"target":"compat-orders","awake_at":null,"reactivate_at":1800000001500,"lateness_ms":0,"reason":null,"source":"old.delay.1s.priority/0/49","priority":true,"throttled_until":null,"delayed_at":1800000000000,"topic":"compat-orders","partition":0,"offset":50}',
    ),
    (
        b"order-E",
        b'{"record_id":"order-E","status":"dead_lettered","at":1800000000000,"seq":2,"retries":0,"hops":0,"target":"compat-orders","awake_at":null,"reactivate_at":null,"lateness_ms":null,"reason":"delay-too-long","source":"old.ingress/0/7","priority":false,"throttled_until":null,"delayed_at":null,"topic":"old.dlq","partition":0,"offset":51}',
    ),
)

STATES_UNLOCATED: tuple[tuple[bytes, bytes], ...] = (
    (
        b"order-A",
        b'{"record_id":"order-A","status":"waiting","at":1800000000000,"seq":10,"retries":0,"hops":1,"target":"compat-orders","awake_at":1800000003000,"reactivate_at":1800000004700,"lateness_ms":null,"reason":null,"source":"old.ingress/0/7","priority":false,"throttled_until":null,"delayed_at":1800000000000,"topic":"old.delay.3s","partition":null,"offset":null}',
    ),
    (
        b"order-A",
        b'{"record_id":"order-A","status":"waiting","at":1800000003000,"seq":20,"retries":0,"hops":2,"target":"compat-orders","awake_at":1800000004000,"reactivate_at":1800000004700,"lateness_ms":null,"reason":null,"source":"old.delay.3s/0/41","priority":false,"throttled_until":null,"delayed_at":1800000000000,"topic":"old.delay.1s","partition":null,"offset":null}',
    ),
    (
        b"order-A",
        b'{"record_id":"order-A","status":"delivered","at":1800000004700,"seq":21,"retries":0,"hops":2,"target":"compat-orders","awake_at":null,"reactivate_at":1800000004700,"lateness_ms":0,"reason":null,"source":"old.delay.1s/0/42","priority":false,"throttled_until":null,"delayed_at":1800000000000,"topic":"compat-orders","partition":null,"offset":null}',
    ),
    (
        b"order-B",
        b'{"record_id":"order-B","status":"waiting","at":1800000000000,"seq":20000010,"retries":2,"hops":1,"target":"compat-orders","awake_at":1800000003000,"reactivate_at":1800000004200,"lateness_ms":null,"reason":null,"source":"old.ingress/0/7","priority":false,"throttled_until":null,"delayed_at":1800000000000,"topic":"old.delay.3s","partition":null,"offset":null}',
    ),
    (
        b"order-B",
        b'{"record_id":"order-B","status":"waiting","at":1800000003000,"seq":20000020,"retries":2,"hops":2,"target":"compat-orders","awake_at":1800000004000,"reactivate_at":1800000004200,"lateness_ms":null,"reason":null,"source":"old.delay.3s/0/44","priority":false,"throttled_until":null,"delayed_at":1800000000000,"topic":"old.delay.1s","partition":null,"offset":null}',
    ),
    (
        b"order-B",
        b'{"record_id":"order-B","status":"delivered","at":1800000004200,"seq":20000021,"retries":2,"hops":2,"target":"compat-orders","awake_at":null,"reactivate_at":1800000004200,"lateness_ms":0,"reason":null,"source":"old.delay.1s/0/45","priority":false,"throttled_until":null,"delayed_at":1800000000000,"topic":"compat-orders","partition":null,"offset":null}',
    ),
    (
        b"order-C",
        b'{"record_id":"order-C","status":"waiting","at":1800000000000,"seq":10,"retries":0,"hops":1,"target":"compat-orders","awake_at":1800000003000,"reactivate_at":1800000003500,"lateness_ms":null,"reason":null,"source":"old.ingress/0/7","priority":false,"throttled_until":null,"delayed_at":1800000000000,"topic":"old.delay.3s","partition":null,"offset":null}',
    ),
    (
        b"order-C",
        b'{"record_id":"order-C","status":"cancelled","at":1800000003000,"seq":13,"retries":0,"hops":1,"target":"compat-orders","awake_at":null,"reactivate_at":1800000003500,"lateness_ms":null,"reason":null,"source":"old.delay.3s/0/47","priority":false,"throttled_until":null,"delayed_at":1800000000000,"topic":null,"partition":null,"offset":null}',
    ),
    (
        b"a30cb4e5-ebb4-5bbb-9ff3-2fa359878630",
        b'{"record_id":"a30cb4e5-ebb4-5bbb-9ff3-2fa359878630","status":"waiting","at":1800000000000,"seq":10,"retries":0,"hops":1,"target":"compat-orders","awake_at":1800000001000,"reactivate_at":1800000001500,"lateness_ms":null,"reason":null,"source":"old.ingress/0/7","priority":true,"throttled_until":null,"delayed_at":1800000000000,"topic":"old.delay.1s.priority","partition":null,"offset":null}',
    ),
    (
        b"a30cb4e5-ebb4-5bbb-9ff3-2fa359878630",
        b'{"record_id":"a30cb4e5-ebb4-5bbb-9ff3-2fa359878630","status":"delivered","at":1800000001500,"seq":11,"retries":0,"hops":1,"target":"compat-orders","awake_at":null,"reactivate_at":1800000001500,"lateness_ms":0,"reason":null,"source":"old.delay.1s.priority/0/49","priority":true,"throttled_until":null,"delayed_at":1800000000000,"topic":"compat-orders","partition":null,"offset":null}',
    ),
    (
        b"order-E",
        b'{"record_id":"order-E","status":"dead_lettered","at":1800000000000,"seq":2,"retries":0,"hops":0,"target":"compat-orders","awake_at":null,"reactivate_at":null,"lateness_ms":null,"reason":"delay-too-long","source":"old.ingress/0/7","priority":false,"throttled_until":null,"delayed_at":null,"topic":"old.dlq","partition":null,"offset":null}',
    ),
)

STATES_REPLAYS: tuple[tuple[bytes, bytes], ...] = (
    (
        b"order-A",
        b'{"record_id":"order-A","status":"waiting","at":1800000000000,"seq":10,"retries":0,"hops":1,"target":"compat-orders","awake_at":1800000003000,"reactivate_at":1800000004700,"lateness_ms":null,"reason":null,"source":"old.ingress/0/7","priority":false,"throttled_until":null,"delayed_at":1800000000000,"replays":0,"topic":"old.delay.3s","partition":null,"offset":null}',
    ),
    (
        b"order-A",
        b'{"record_id":"order-A","status":"waiting","at":1800000003000,"seq":20,"retries":0,"hops":2,"target":"compat-orders","awake_at":1800000004000,"reactivate_at":1800000004700,"lateness_ms":null,"reason":null,"source":"old.delay.3s/0/41","priority":false,"throttled_until":null,"delayed_at":1800000000000,"replays":0,"topic":"old.delay.1s","partition":null,"offset":null}',
    ),
    (
        b"order-A",
        b'{"record_id":"order-A","status":"delivered","at":1800000004700,"seq":21,"retries":0,"hops":2,"target":"compat-orders","awake_at":null,"reactivate_at":1800000004700,"lateness_ms":0,"reason":null,"source":"old.delay.1s/0/42","priority":false,"throttled_until":null,"delayed_at":1800000000000,"replays":0,"topic":"compat-orders","partition":null,"offset":null}',
    ),
    (
        b"order-B",
        b'{"record_id":"order-B","status":"waiting","at":1800000000000,"seq":20000010,"retries":2,"hops":1,"target":"compat-orders","awake_at":1800000003000,"reactivate_at":1800000004200,"lateness_ms":null,"reason":null,"source":"old.ingress/0/7","priority":false,"throttled_until":null,"delayed_at":1800000000000,"replays":0,"topic":"old.delay.3s","partition":null,"offset":null}',
    ),
    (
        b"order-B",
        b'{"record_id":"order-B","status":"waiting","at":1800000003000,"seq":20000020,"retries":2,"hops":2,"target":"compat-orders","awake_at":1800000004000,"reactivate_at":1800000004200,"lateness_ms":null,"reason":null,"source":"old.delay.3s/0/44","priority":false,"throttled_until":null,"delayed_at":1800000000000,"replays":0,"topic":"old.delay.1s","partition":null,"offset":null}',
    ),
    (
        b"order-B",
        b'{"record_id":"order-B","status":"delivered","at":1800000004200,"seq":20000021,"retries":2,"hops":2,"target":"compat-orders","awake_at":null,"reactivate_at":1800000004200,"lateness_ms":0,"reason":null,"source":"old.delay.1s/0/45","priority":false,"throttled_until":null,"delayed_at":1800000000000,"replays":0,"topic":"compat-orders","partition":null,"offset":null}',
    ),
    (
        b"order-C",
        b'{"record_id":"order-C","status":"waiting","at":1800000000000,"seq":10,"retries":0,"hops":1,"target":"compat-orders","awake_at":1800000003000,"reactivate_at":1800000003500,"lateness_ms":null,"reason":null,"source":"old.ingress/0/7","priority":false,"throttled_until":null,"delayed_at":1800000000000,"replays":0,"topic":"old.delay.3s","partition":null,"offset":null}',
    ),
    (
        b"order-C",
        b'{"record_id":"order-C","status":"cancelled","at":1800000003000,"seq":13,"retries":0,"hops":1,"target":"compat-orders","awake_at":null,"reactivate_at":1800000003500,"lateness_ms":null,"reason":null,"source":"old.delay.3s/0/47","priority":false,"throttled_until":null,"delayed_at":1800000000000,"replays":0,"topic":null,"partition":null,"offset":null}',
    ),
    (
        b"a30cb4e5-ebb4-5bbb-9ff3-2fa359878630",
        b'{"record_id":"a30cb4e5-ebb4-5bbb-9ff3-2fa359878630","status":"waiting","at":1800000000000,"seq":10,"retries":0,"hops":1,"target":"compat-orders","awake_at":1800000001000,"reactivate_at":1800000001500,"lateness_ms":null,"reason":null,"source":"old.ingress/0/7","priority":true,"throttled_until":null,"delayed_at":1800000000000,"replays":0,"topic":"old.delay.1s.priority","partition":null,"offset":null}',
    ),
    (
        b"a30cb4e5-ebb4-5bbb-9ff3-2fa359878630",
        b'{"record_id":"a30cb4e5-ebb4-5bbb-9ff3-2fa359878630","status":"delivered","at":1800000001500,"seq":11,"retries":0,"hops":1,"target":"compat-orders","awake_at":null,"reactivate_at":1800000001500,"lateness_ms":0,"reason":null,"source":"old.delay.1s.priority/0/49","priority":true,"throttled_until":null,"delayed_at":1800000000000,"replays":0,"topic":"compat-orders","partition":null,"offset":null}',
    ),
    (
        b"order-E",
        b'{"record_id":"order-E","status":"dead_lettered","at":1800000000000,"seq":2,"retries":0,"hops":0,"target":"compat-orders","awake_at":null,"reactivate_at":null,"lateness_ms":null,"reason":"delay-too-long","source":"old.ingress/0/7","priority":false,"throttled_until":null,"delayed_at":null,"replays":0,"topic":"old.dlq","partition":null,"offset":null}',
    ),
    (
        b"order-F",
        b'{"record_id":"order-F","status":"waiting","at":1800000000000,"seq":10,"retries":0,"hops":1,"target":"compat-orders","awake_at":1800000001000,"reactivate_at":1800000002400,"lateness_ms":null,"reason":null,"source":"old.ingress/0/7","priority":false,"throttled_until":null,"delayed_at":1800000000000,"replays":1,"topic":"old.delay.1s","partition":null,"offset":null}',
    ),
    (
        b"order-F",
        b'{"record_id":"order-F","status":"waiting","at":1800000001000,"seq":20,"retries":0,"hops":2,"target":"compat-orders","awake_at":1800000002000,"reactivate_at":1800000002400,"lateness_ms":null,"reason":null,"source":"old.delay.1s/0/52","priority":false,"throttled_until":null,"delayed_at":1800000000000,"replays":1,"topic":"old.delay.1s","partition":null,"offset":null}',
    ),
    (
        b"order-F",
        b'{"record_id":"order-F","status":"delivered","at":1800000002400,"seq":21,"retries":0,"hops":2,"target":"compat-orders","awake_at":null,"reactivate_at":1800000002400,"lateness_ms":0,"reason":null,"source":"old.delay.1s/0/53","priority":false,"throttled_until":null,"delayed_at":1800000000000,"replays":1,"topic":"compat-orders","partition":null,"offset":null}',
    ),
)

CANCEL_RECORD: tuple[bytes, bytes] = (
    b"order-C",
    b'{"cancelled_at":1800000010000,"reason":"changed my mind","by":"http"}',
)

CANCEL_VALUES: tuple[bytes, ...] = (CANCEL_RECORD[1], b"{}", b"", b"not json: kcat -K:", b"[1, 2]")
"""Cancel values the contract accepts: the client's JSON, and what other producers may write
(an empty object, nothing, any text, JSON that is not an object)."""

DELAY_FORMATS: dict[str, tuple[DelayRecord, ...]] = {
    "0.1.0 plain headers": PLAIN_HEADERS,
    "0.3.0 plain headers with timeReplayed": PLAIN_HEADERS_REPLAYED,
    "0.4.0 packed delayState": PACKED_STATE,
}
"""Every delay-topic format so far, by the version that introduced it."""

STATE_FORMATS: dict[str, tuple[tuple[bytes, bytes], ...]] = {
    "0.1.0 located": STATES_LOCATED,
    "0.2.0 unlocated": STATES_UNLOCATED,
    "0.3.0 replays": STATES_REPLAYS,
}
"""Every record-states format so far: (key, value) in the order the version wrote them."""

FINAL_STATUS: dict[bytes, str] = {
    b"order-A": "delivered",
    b"order-B": "delivered",
    b"order-C": "cancelled",
    b"a30cb4e5-ebb4-5bbb-9ff3-2fa359878630": "delivered",  # D: the id the router made
    b"order-E": "dead_lettered",
    b"order-F": "delivered",
}
"""Where each record's life ended in the runs above (F only from 0.3.0)."""

COMMIT_METADATA: dict[str, tuple[int, str]] = {
    "0.1.0 ranges": (100, "released:3-5,9,50"),
    "0.3.0 bitmap": (100, "released~OAIAAAAABA=="),
    "0.5.0 bitmap at its point": (100, "released@100~OAIAAAAABA=="),
}
"""A delay topic's commit at offset 100, its metadata naming what was released ahead of it, as
each version wrote it (``tests.support.partitions.encode_released(100, RELEASED_AHEAD)`` today)."""
RELEASED_AHEAD = frozenset({103, 104, 105, 109, 150})

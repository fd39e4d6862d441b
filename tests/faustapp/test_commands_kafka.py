"""``faust -A delayapp <command>`` through the real command line, against a real broker."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from dataclasses import dataclass

import orjson
import pytest

from delayapp.core import headers as h
from delayapp.core.replay import REPLAYED_FROM
from delayapp.ops.dead_letters import read_replay_markers
from delayapp.settings import load_settings
from tests.support.kafka import SESSION_MS, TEST_LADDER, Collector, Worker, create_topics, producer, unique, wait_for

pytestmark = pytest.mark.integration

CLI_TIMEOUT_S = 120


@dataclass(frozen=True)
class Run:
    """One finished command: exit code and what it printed."""

    code: int
    out: str
    err: str


async def cli(bootstrap: str, prefix: str, *args: str, stdin: bytes | None = None, **env: str) -> Run:
    """Run ``python -m faust -A delayapp <args>`` with this broker and topic prefix."""
    environment = {
        **os.environ,
        "DELAYAPP_BROKER": bootstrap,
        "DELAYAPP_TOPIC_PREFIX": prefix,
        "DELAYAPP_APP_ID": prefix,
        "DELAYAPP_DENOMINATIONS": TEST_LADDER,
        "DELAYAPP_MAX_DELAY": "1h",
        "DELAYAPP_SESSION_TIMEOUT_MS": str(SESSION_MS),
        **env,
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "faust",
        "-A",
        "delayapp",
        *args,
        env=environment,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(stdin), CLI_TIMEOUT_S)
    return Run(process.returncode or 0, out.decode(), err.decode())


async def test_plan_prints_hops_and_refuses_beyond_max_delay(bootstrap: str) -> None:
    prefix = unique("cli")
    env = {"DELAYAPP_DENOMINATIONS": "1s,5s,30s,1m,5m,30m,1h,6h,1d", "DELAYAPP_MAX_DELAY": "7d"}
    run = await cli(bootstrap, prefix, "plan", "1h19m", **env)
    assert run.code == 0, run.err
    assert "1h19m = 1h + 5m + 5m + 5m + 1m + 1m + 1m + 1m (8 hops)" in run.out
    assert re.search(r"worst case: at most \d+ hops for any delay up to 7d", run.out)
    # within the read-ahead (5 s beyond the smallest), one partial hop on 5s
    assert "1s500ms = 1s500ms on 5s (1 hop)" in (await cli(bootstrap, prefix, "plan", "1500", **env)).out
    assert (
        "1s500ms = 1s + 500ms on 1s (2 hops)"
        in (await cli(bootstrap, prefix, "plan", "1500", DELAYAPP_READ_AHEAD="2s", **env)).out
    )
    beyond = await cli(bootstrap, prefix, "plan", "8d", **env)
    assert beyond.code == 1 and "beyond the maximum delay of 7d" in beyond.err
    bad = await cli(bootstrap, prefix, "plan", "soon", **env)
    assert bad.code == 2 and "not a duration" in bad.err


async def test_topics_check_then_create_then_check(bootstrap: str) -> None:
    prefix = unique("cli")
    missing = await cli(bootstrap, prefix, "topics", "check")
    assert missing.code == 1
    assert re.search(rf"^{re.escape(prefix)}\.ingress\s+MISSING", missing.out, re.M)
    assert "topics missing" in missing.err
    created = await cli(bootstrap, prefix, "topics", "create")
    assert created.code == 0, created.err
    assert f"{prefix}.dlq.replayed" in created.out and re.search(r"created \d+ topics", created.out)
    assert "(all exist)" in (await cli(bootstrap, prefix, "topics", "create")).out
    checked = await cli(bootstrap, prefix, "topics", "check")
    assert checked.code == 0, checked.out + checked.err
    assert re.search(rf"^{re.escape(prefix)}\.delay\.200ms\s+yes\s+4\s", checked.out, re.M)
    assert re.search(rf"^{re.escape(prefix)}\.dlq\.replayed\s+yes\s+4\s+compacted", checked.out, re.M)
    if not os.environ.get("DELAYAPP_TEST_BROKER"):  # the embedded broker refuses DescribeConfigs
        assert "retention not reported by broker" in checked.out
    assert "topics ok" in checked.out


async def test_schedule_delivers_and_status_reports(bootstrap: str) -> None:
    prefix = unique("cli")
    target = unique("cli-target-")
    await create_topics(bootstrap, target)
    worker = Worker(bootstrap, prefix).start()
    collector = await Collector(bootstrap, [target]).start()
    try:
        await worker.wait_ready()
        record_id = unique("order-")
        run = await cli(
            bootstrap,
            prefix,
            "schedule",
            "--target",
            target,
            "--key",
            "k1",
            "--value-file",
            "-",
            "--delay",
            "1s400ms",
            "--header",
            "source=cli",
            "--record-id",
            record_id,
            stdin=b'{"id":42}',
        )
        assert run.code == 0, run.err
        assert f"scheduled  {record_id}" in run.out
        assert re.search(rf"ingress    {re.escape(prefix)}\.ingress/\d+/\d+", run.out)
        assert "1s400ms = 1s400ms on 3s (1 hop)" in run.out  # a partial hop on 3s: within the read-ahead
        await wait_for(lambda: collector.on(target), 60, "the scheduled record at its target")
        [delivered] = collector.on(target)
        assert (delivered.key, delivered.value) == (b"k1", b'{"id":42}')
        assert ("source", b"cli") in delivered.headers and (h.RECORD_ID, record_id.encode()) in delivered.headers

        # bad input: a clear message and exit code 2, nothing sent
        for args, message in [
            (("--delay", "1s", "--at", "2030-01-01T00:00Z"), "exactly one of delay and at"),
            (("--delay", "soon"), "not a duration"),
            (("--at", "1700000000"), "not epoch milliseconds"),
            (("--delay", "2h"), "beyond the maximum delay"),
            (("--delay", "1s", "--header", "novalue"), "name=value"),
            (("--delay", "1s", "--header", "delayMs=5"), "delayMs is delayapp's own"),
            (("--delay", "10m", "--expire-at", "1m"), "expires-before-due"),
        ]:
            bad = await cli(bootstrap, prefix, "schedule", "--target", target, "--value", "x", *args)
            assert bad.code == 2 and message in bad.err, (args, bad)

        url = f"http://127.0.0.1:{worker.env['DELAYAPP_WEB_PORT']}"

        shown = await wait_for(
            lambda: _status_if(bootstrap, prefix, record_id, url, "delivered"), 60, "status delivered", interval=0.5
        )
        assert re.search(rf"^target\s+{re.escape(target)}$", shown.out, re.M)
        assert re.search(r"^hops\s+\d+$", shown.out, re.M)  # one partial hop on 3s, or more when re-planned late
        # a step is published without waiting for its write's report: the topic, not the offset
        assert re.search(rf"^where\s+{re.escape(target)}$", shown.out, re.M)

        waiting_id = unique("later-")
        later = await cli(
            bootstrap,
            prefix,
            "schedule",
            "--target",
            target,
            "--value",
            "later",
            "--delay",
            "30m",
            "--record-id",
            waiting_id,
            "--priority",
        )
        assert later.code == 0 and "(priority lane)" in later.out, later
        shown = await wait_for(
            lambda: _status_if(bootstrap, prefix, waiting_id, url, "waiting"),
            60,
            "status waiting",
            interval=0.5,
        )
        assert re.search(r"^next awake\s+\S+Z \(in \S+\)$", shown.out, re.M)
        assert re.search(rf"^where\s+{re.escape(prefix)}\.delay\.3s\.priority$", shown.out, re.M)
        as_json = orjson.loads((await cli(bootstrap, prefix, "--json", "status", record_id, "--url", url)).out)
        assert (as_json["record_id"], as_json["status"], as_json["target"]) == (record_id, "delivered", target)
        unknown = await cli(bootstrap, prefix, "status", "no-such-record", "--url", url)
        assert unknown.code == 1 and "no-such-record" in unknown.err
        nobody = await cli(bootstrap, prefix, "status", record_id, "--url", "http://127.0.0.1:9")
        assert nobody.code == 1 and "no worker answers" in nobody.err
    finally:
        await collector.stop()
        worker.stop()


async def _status_if(bootstrap: str, prefix: str, record_id: str, url: str, wanted: str) -> Run | None:
    shown = await cli(bootstrap, prefix, "status", record_id, "--url", url)
    return shown if re.search(rf"^status\s+{wanted}$", shown.out, re.M) else None


async def _write_dead_letter(
    bootstrap: str, prefix: str, value: bytes | None, *, reason: str, target: str, at_ms: int
) -> None:
    """A dead letter in the engine's shape, as if a worker had rejected it at ``at_ms``."""
    p = await producer(bootstrap)
    try:
        headers = h.dead_letter_headers(
            [(h.REACTIVATE_TO_TOPIC, target.encode()), (h.DELAY_MS, b"0")],
            reason=reason,
            detail=f"written by the test ({reason})",
            now_ms=at_ms,
            source=f"{prefix}.ingress/0/0",
        )
        await p.send_and_wait(f"{prefix}.dlq", value, key=b"synthetic", headers=headers)
    finally:
        await p.stop()


async def test_dlq_list_filters_and_replay_delivers_once(bootstrap: str) -> None:
    prefix = unique("cli")
    target = unique("cli-late-")  # does not exist yet: records to it are dead-lettered
    worker = Worker(bootstrap, prefix).start()
    try:
        await worker.wait_ready()
        for key in ("a", "b"):
            run = await cli(
                bootstrap,
                prefix,
                "schedule",
                "--target",
                target,
                "--key",
                key,
                "--value",
                f"v-{key}",
                "--delay",
                "1s",
                "--header",
                "n=1",
            )
            assert run.code == 0, run.err
        await _write_dead_letter(
            bootstrap, prefix, b"old", reason="expired", target="elsewhere", at_ms=1_600_000_000_000
        )
        await _write_dead_letter(
            bootstrap, prefix, None, reason="unknown-target", target=target, at_ms=1_700_000_000_000
        )

        async def listed() -> Run | None:
            shown = await cli(bootstrap, prefix, "dlq", "list")
            return shown if shown.out.count("unknown-target") >= 3 else None

        everything = await wait_for(listed, 60, "two records dead-lettered as unknown-target", interval=0.5)
        assert "4 dead letters shown; 4 read" in everything.out, everything.out
        assert "2020-09-13T12:26:40.000Z" in everything.out and "expired" in everything.out
        as_json = orjson.loads((await cli(bootstrap, prefix, "--json", "dlq", "list", "--reason", "expired")).out)
        assert [(d["reason"], d["target"], d["dead_letter_at"], d["replayed"]) for d in as_json] == [
            ("expired", "elsewhere", 1_600_000_000_000, None)
        ]
        by_reason = await cli(bootstrap, prefix, "dlq", "list", "--reason", "expired")
        assert "1 dead letters shown; 4 read" in by_reason.out and "elsewhere" in by_reason.out
        by_target = await cli(bootstrap, prefix, "dlq", "list", "--target", "cli-late-*", "--since", "1h")
        assert "2 dead letters shown" in by_target.out and "expired" not in by_target.out
        by_time = await cli(bootstrap, prefix, "dlq", "list", "--until", "2021-01-01T00:00:00Z")
        assert "1 dead letters shown" in by_time.out
        assert "more match" in (await cli(bootstrap, prefix, "dlq", "list", "--limit", "1")).out
        assert (await cli(bootstrap, prefix, "dlq", "list", "--since", "yesterday")).code == 2

        selection = ("--reason", "unknown-target", "--target", target)
        dry = await cli(bootstrap, prefix, "dlq", "replay", *selection, "--dry-run")
        assert dry.code == 0, dry.err
        assert "selected 3: would replay 2, already replayed 0, unreplayable 1" in dry.out
        assert "tombstone" in dry.out

        await create_topics(bootstrap, target)
        collector = await Collector(bootstrap, [target]).start()
        try:
            first = await cli(bootstrap, prefix, "dlq", "replay", *selection)
            assert first.code == 0, first.err
            assert "selected 3: replayed 2, already replayed 0, unreplayable 1" in first.out
            assert "replaying" in first.err  # the progress bar (standard error)
            await wait_for(lambda: len(collector.on(target)) >= 2, 60, "the replayed records at their target")
            assert sorted(r.value for r in collector.on(target)) == [b"v-a", b"v-b"]
            assert all(
                h.header_value(r.headers, REPLAYED_FROM).startswith(f"{prefix}.dlq/".encode())
                for r in collector.on(target)
            )

            settings = load_settings(broker=bootstrap, topic_prefix=prefix, denominations=TEST_LADDER)
            markers = await read_replay_markers(settings, settings.topic_layout())
            assert len(markers) == 2 and {m["by"] for m in markers.values()} == {"cli"}
            assert all(
                m["to"].startswith(f"{prefix}.ingress/") and m["reason"] == "unknown-target" for m in markers.values()
            )

            listed_after = await cli(bootstrap, prefix, "dlq", "list", *selection)
            assert listed_after.out.count(" yes ") == 2

            # again, with a due time of now: a duplicate would be delivered at once, before the sentinel
            second = await cli(bootstrap, prefix, "dlq", "replay", *selection, "--delay", "0s")
            assert "selected 3: replayed 0, already replayed 2, unreplayable 1" in second.out, second.out
            for key in ("a", "b"):  # same key, same ingress partition: delivered after any duplicate
                sentinel = await cli(
                    bootstrap,
                    prefix,
                    "schedule",
                    "--target",
                    target,
                    "--key",
                    key,
                    "--value",
                    "sentinel",
                    "--delay",
                    "0s",
                )
                assert sentinel.code == 0, sentinel.err
            await wait_for(lambda: [r.value for r in collector.on(target)].count(b"sentinel") == 2, 60, "the sentinels")
            assert sorted(r.value for r in collector.on(target)) == [b"sentinel", b"sentinel", b"v-a", b"v-b"]
        finally:
            await collector.stop()
    finally:
        worker.stop()


async def test_a_replayed_dead_letter_shows_delivered_once_delivered(bootstrap: str) -> None:
    """Issue 23, item 4: a record dead-lettered (its target missing), replayed by ``dlq replay``
    once the target exists and delivered, shows ``delivered`` in the record view, not the dead
    letter it was replayed from (the replay's steps start again at hop 0)."""
    prefix = unique("cli")
    target = unique("cli-gone-")  # does not exist yet: the record is dead-lettered
    record_id = unique("replayed-")
    worker = Worker(bootstrap, prefix).start()
    try:
        await worker.wait_ready()
        url = f"http://127.0.0.1:{worker.env['DELAYAPP_WEB_PORT']}"
        run = await cli(
            bootstrap, prefix, "schedule", "--target", target, "--value", "v", "--delay", "1s", "--record-id", record_id
        )
        assert run.code == 0, run.err
        dead = await wait_for(
            lambda: _status_if(bootstrap, prefix, record_id, url, "dead_lettered"), 60, "dead-lettered", interval=0.5
        )
        assert "unknown-target" in dead.out, dead.out
        await create_topics(bootstrap, target)
        collector = await Collector(bootstrap, [target]).start()
        try:
            replay = await cli(bootstrap, prefix, "dlq", "replay", "--reason", "unknown-target", "--target", target)
            assert replay.code == 0 and "replayed 1" in replay.out, (replay.out, replay.err)
            [delivered] = await wait_for(lambda: collector.on(target), 60, "the replayed record at its target")
            assert h.header_value(delivered.headers, h.TIME_REPLAYED) == b"1"
            shown = await wait_for(
                lambda: _status_if(bootstrap, prefix, record_id, url, "delivered"), 30, "status delivered", interval=0.5
            )
            assert re.search(rf"^target\s+{re.escape(target)}$", shown.out, re.M), shown.out
            as_json = orjson.loads((await cli(bootstrap, prefix, "--json", "status", record_id, "--url", url)).out)
            assert (as_json["status"], as_json["replays"]) == ("delivered", 1), as_json
        finally:
            await collector.stop()
    finally:
        worker.stop()

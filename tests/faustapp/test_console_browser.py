"""The console page in a real browser (headless Chromium) against a real worker with a read
token: the browser gets in through the login form, the page's figures match ``/delay/stats``,
and a cancel and a dead-letter replay done through the page take effect.

Screenshots go to the test's tmp dir; ``DELAYAPP_CONSOLE_SHOTS=docs`` writes them there too.
Without Chromium the test FAILS (bin/setup installs it): a console nobody looked at is not tested.
"""

from __future__ import annotations

import os
import shutil

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer

from delayapp.client import schedule
from delayapp.core.clock import now_ms
from tests.support import browser
from tests.support.kafka import Worker, create_topics, producer, unique, wait_for

pytestmark = pytest.mark.integration

TOKEN = "console-test-token"
READ_TOKEN = "console-read-token"
LADDER = "1s,1m,1h"  # records due in 90 minutes sit still in the 1h topic: stable pending figures
LATER_MS = 90 * 60_000


@pytest.fixture(scope="module")
async def worker(bootstrap: str):
    w = Worker(
        bootstrap,
        unique("con"),
        DELAYAPP_PARTITIONS="2",
        DELAYAPP_API_TOKEN=TOKEN,
        DELAYAPP_READ_TOKEN=READ_TOKEN,
        DELAYAPP_DENOMINATIONS=LADDER,
        DELAYAPP_MAX_DELAY="3h",
        DELAYAPP_STATS_WINDOW="10m",
    ).start()
    try:
        await w.wait_ready(loops=1 + len(LADDER.split(",")))
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module")
def page():
    why = browser.missing()
    if why:
        pytest.fail(f"no browser for the console test: {why}")
    with browser.chromium() as driver:
        yield driver


def _shot(driver, tmp_path, name: str) -> None:
    path = browser.screenshot(driver, str(tmp_path / f"console-{name}.png"))
    wanted = os.environ.get("DELAYAPP_CONSOLE_SHOTS")
    if wanted:
        os.makedirs(wanted, exist_ok=True)
        shutil.copy(path, os.path.join(wanted, f"console-{name}.png"))


def _js(driver, script: str):
    """Read the page through its DOM (never through the worker: what a person sees)."""
    return driver.execute_script(script)


PAGE_FIGURES = """
const cells = [...document.querySelectorAll('#pending-table td[data-topic]')];
const loops = [...document.querySelectorAll('#lateness-loops tr[data-loop]')];
const reasons = [...document.querySelectorAll('#dlq-reasons tr[data-reason]')];
return {
  at: document.getElementById('at').dataset.at || null,
  pending: Object.fromEntries(cells.map(td => [td.dataset.topic, td.textContent])),
  delivered: document.getElementById('delivered-total').textContent,
  early: document.getElementById('early').textContent,
  lateness: Object.fromEntries(loops.map(
    tr => [tr.dataset.loop, [...tr.children].slice(1, 5).map(td => td.textContent)])),
  dead_letters: Object.fromEntries(reasons.map(tr => [tr.dataset.reason, tr.children[1].textContent])),
  waiting_known: document.getElementById('waiting-known').textContent,
};
"""


def _expected(stats: dict) -> dict:
    """What the page must show for this ``/delay/stats`` body, in the page's own text."""
    text = lambda v: "-" if v is None else str(v)  # noqa: E731
    loops = stats["loops"].values()
    return {
        "pending": {t: text(n) for lp in loops for t, n in lp["pending"].items()},
        "delivered": str(sum(lp["totals"]["delivered"] for lp in loops)),
        "early": "0",
        "lateness": {
            name: [text(lp["lateness_ms"][k]) for k in ("count", "p50", "p99", "max")]
            for name, lp in stats["loops"].items()
        },
        "dead_letters": {r: str(n) for r, n in stats["dead_letters_by_reason"].items()},
    }


async def test_console_in_a_browser_matches_the_stats_and_acts(bootstrap: str, worker: Worker, page, tmp_path) -> None:
    base = f"http://127.0.0.1:{worker.env['DELAYAPP_WEB_PORT']}"
    target, missing = unique("it-con-out"), unique("it-con-missing")
    await create_topics(bootstrap, target, partitions=2)
    ingress = f"{worker.prefix}.ingress"
    p = await producer(bootstrap)
    try:
        start = now_ms()
        for n in range(6):
            await schedule(
                p,
                target,
                b"soon",
                key=f"s{n}".encode(),
                at=start + 1_500 + 100 * n,
                record_id=f"soon-{n}",
                ingress_topic=ingress,
            )
        for n in range(3):
            await schedule(
                p,
                target,
                b"later",
                key=f"l{n}".encode(),
                at=start + LATER_MS,
                record_id=f"later-{n}",
                ingress_topic=ingress,
            )
        # no such topic (yet): dead-lettered as unknown-target; replayed through the page once it exists
        await schedule(p, missing, b"lost", key=b"m", at=start + 1_000, record_id="to-missing", ingress_topic=ingress)
    finally:
        await p.stop()

    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {READ_TOKEN}"}) as http:

        async def get(path: str):
            async with http.get(base + path) as response:
                return response.status, await response.json()

        async def settled():
            status, stats = await get("/delay/stats")
            if status != 200:
                return None
            hour = stats["loops"]["delay-1h"]["pending"][f"{worker.prefix}.delay.1h"]  # sampled every 5 s
            return (
                sum(lp["totals"]["delivered"] for lp in stats["loops"].values()) >= 6
                and stats["dead_letters_by_reason"].get("unknown-target") == 1
                and (hour or 0) >= 2
            )

        await wait_for(settled, 60, "six records delivered, one dead-lettered, the later ones counted as pending")

        # 0. the console is closed to a browser without the read token: the login form lets it in
        page.get(base + "/console")
        await wait_for(lambda: page.find_elements("id", "login-token"), 20, "the login form")
        assert not page.find_elements("id", "pending-table")
        assert _js(page, "return getComputedStyle(document.body).maxWidth") == "360px"  # its stylesheet, open
        page.find_element("id", "login-token").send_keys("not the token")
        page.find_element("id", "login-go").click()
        await wait_for(lambda: page.find_elements("id", "login-error"), 20, "the wrong token refused")
        page.find_element("id", "login-token").send_keys(READ_TOKEN)
        page.find_element("id", "login-go").click()
        await wait_for(lambda: page.find_elements("id", "pending-table"), 20, "the console after logging in")
        assert _js(page, "return document.cookie") == ""  # the session cookie is HttpOnly: no script reads it
        await wait_for(
            lambda: _js(page, "return document.getElementById('status').dataset.refreshed"),
            30,
            "the page to load its figures",
        )
        assert not _js(page, "return document.getElementById('logout').hidden")
        # the page's script and styles are files the Content-Security-Policy allows: it ran (above),
        # its styles apply, and the browser reported no violation
        assert _js(page, "return getComputedStyle(document.querySelector('header')).display") == "flex"
        violations = [e["message"] for e in page.get_log("browser") if "Content Security Policy" in e["message"]]
        assert not violations, violations

        # 1. every figure the page shows is the one /delay/stats gives (pending is sampled every
        #    5 s: wait for both to agree)
        async def same():
            _, stats = await get("/delay/stats")
            shown = _js(page, PAGE_FIGURES)
            want = _expected(stats)
            return (
                shown
                if all(shown[k] == want[k] for k in want) and "3 records waiting" in shown["waiting_known"]
                else None
            )

        try:
            shown = await wait_for(same, 60, "the page's figures to match /delay/stats")
        except AssertionError:
            _, stats = await get("/delay/stats")
            raise AssertionError(f"page shows {_js(page, PAGE_FIGURES)}\nstats want {_expected(stats)}") from None
        assert (
            int(shown["pending"][f"{worker.prefix}.delay.1h"]) >= 2
        )  # the later ones (Tansu's end offsets may miss one)
        assert "nothing to act on" in _js(
            page, "return document.getElementById('alerts').textContent"
        ) or "dead-lettered in the last hour" in _js(page, "return document.getElementById('alerts').textContent")
        _shot(page, tmp_path, "overview")

        # 2. the record lookup shows a record's state and steps from the read model
        page.find_element("id", "lookup-id").send_keys("soon-0")
        page.find_element("id", "lookup-go").click()
        await wait_for(
            lambda: _js(page, "return document.getElementById('lookup-result').dataset.status") == "delivered",
            20,
            "the lookup",
        )
        assert "hops taken" in page.find_element("id", "lookup-result").text

        # 3. cancel through the page: refused without the token, done with it
        page.find_element("id", "cancel-id").send_keys("later-0")
        page.find_element("id", "cancel-go").click()
        await wait_for(
            lambda: _js(page, "return document.getElementById('cancel-result').dataset.outcome") == "refused",
            20,
            "a refusal",
        )
        page.find_element("id", "token").send_keys(TOKEN)
        page.find_element("id", "cancel-reason").send_keys("browser test")
        page.find_element("id", "cancel-go").click()
        await wait_for(
            lambda: _js(page, "return document.getElementById('cancel-result').dataset.outcome") == "ok",
            20,
            "the cancel",
        )

        async def cancelled():
            status, state = await get("/delay/records/later-0")
            return status == 200 and state["status"] == "cancelled" and state["cancel"]["reason"] == "browser test"

        await wait_for(cancelled, 30, "later-0 to be cancelled")
        await wait_for(
            lambda: "2 records waiting" in _js(page, "return document.getElementById('waiting-known').textContent"),
            20,
            "the cancelled record to leave the waiting figures",
        )

        # 4. replay the dead letter through the page, once its target exists: it is delivered there
        await create_topics(bootstrap, missing, partitions=1)
        row = "#dlq-latest tr[data-key] "
        key = await wait_for(
            lambda: _js(
                page,
                f"""
            for (const tr of document.querySelectorAll('{row}'))
              if (tr.children[5].textContent === 'to-missing') return tr.dataset.key;
            return null;""",
            ),
            30,
            "the dead letter listed",
        )
        _shot(page, tmp_path, "dead-letters")

        def tick() -> bool:
            try:
                box = page.find_element("css selector", f'#dlq-latest tr[data-key="{key}"] input[type=checkbox]')
                if not box.is_selected():
                    box.click()
                return page.find_element(
                    "css selector", f'#dlq-latest tr[data-key="{key}"] input[type=checkbox]'
                ).is_selected()
            except Exception:  # the table was redrawn under the click (it refreshes every 2 s): again
                return False

        await wait_for(tick, 20, "the dead letter ticked")
        page.find_element("id", "replay-go").click()
        await wait_for(
            lambda: _js(page, "return document.getElementById('replay-result').dataset.outcome") == "ok",
            60,
            "the replay",
        )
        assert page.find_element("id", "replay-result").text.startswith("replayed 1,"), page.find_element(
            "id", "replay-result"
        ).text

        consumer = AIOKafkaConsumer(missing, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None)
        await consumer.start()
        try:
            got: list = []

            async def delivered():
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend(records)
                return got

            await wait_for(delivered, 60, "the replayed record delivered to its target")
            assert got[0].value == b"lost"
        finally:
            await consumer.stop()
        await wait_for(
            lambda: (
                "yes, by http"
                in _js(
                    page,
                    f"""return document.querySelector('#dlq-latest tr[data-key="{key}"] td.replayed').textContent""",
                )
            ),
            30,
            "the page to show the dead letter replayed",
        )
        _shot(page, tmp_path, "after-actions")

"""Pure logic of the Spark pipelines: offsets, options, bulk rows to headers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.core import headers as h
from delayapp.pipelines.bulk_schedule import BulkRow, bulk_record_id, ingress_headers
from delayapp.pipelines.common import parse_time_ms, parse_time_or_ago_ms
from delayapp.pipelines.errors import PipelineError
from delayapp.pipelines.kafka_source import (
    EARLIEST,
    LATEST,
    cap_offsets,
    client_config,
    kafka_options,
    parse_offsets_option,
    ranges,
    sorted_offsets,
)
from delayapp.settings import load_settings


def test_offsets_serialise_in_a_fixed_order():
    messy = {"b": {"10": 1, "2": 2}, "a": {"1": 3, "0": 4}}
    assert json.dumps(sorted_offsets(messy)) == '{"a": {"0": 4, "1": 3}, "b": {"2": 2, "10": 1}}'


def test_offsets_option_words_and_json():
    assert parse_offsets_option(None, LATEST) == LATEST
    assert parse_offsets_option("Earliest", LATEST) == EARLIEST
    assert parse_offsets_option('{"t": {"0": 5, "1": -2}}', LATEST) == {"t": {"0": 5, "1": -2}}
    with pytest.raises(PipelineError):
        parse_offsets_option("[1, 2]", LATEST)


@given(
    st.dictionaries(
        st.sampled_from(["0", "1", "2", "3"]), st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1
    ),
    st.integers(0, 120),
)
def test_cap_offsets_reads_at_most_the_limit_and_never_goes_backwards(parts, limit):
    start = {"t": {p: a for p, (a, _) in parts.items()}}
    end = {"t": {p: a + n for p, (a, n) in parts.items()}}
    capped = cap_offsets(start, end, limit)
    taken = sum(capped["t"][p] - start["t"][p] for p in parts)
    assert taken == min(limit, sum(n for _, n in parts.values()))
    assert all(start["t"][p] <= capped["t"][p] <= end["t"][p] for p in parts)


def test_ranges_skip_empty_partitions_and_start_new_ones_at_zero():
    got = ranges({"t": {"0": 5}}, {"t": {"0": 5, "1": 3}})
    assert [(r.topic, r.partition, r.start, r.end) for r in got] == [("t", 1, 0, 3)]


def test_kafka_options_carry_broker_sasl_and_tls():
    settings = load_settings(
        broker="k1:9093,k2:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="u",
        sasl_password="p",
        ssl_cafile="/ca.pem",
    )
    config = client_config(kafka_options(settings))
    assert config == {
        "bootstrap.servers": "k1:9093,k2:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "u",
        "sasl.password": "p",
        "ssl.ca.location": "/ca.pem",
    }
    with pytest.raises(PipelineError, match="bootstrap"):
        client_config({"topic": "x"})


def test_record_ids_are_stable_and_distinguish_occurrences():
    assert bulk_record_id("order-1", "whatever", 1) == bulk_record_id("order-1", "other", 7)
    assert bulk_record_id(None, "c", 1) == bulk_record_id(None, "c", 1)
    assert bulk_record_id(None, "c", 1) != bulk_record_id(None, "c", 2)
    assert bulk_record_id(None, "c", 1) != bulk_record_id("", "d", 1)


NOW = 1_700_000_000_000  # a fixed clock: 2023-11-14T22:13:20Z


def test_ingress_headers_follow_the_contract():
    headers = ingress_headers(
        BulkRow("orders", "2026-05-01T09:30:00Z", None, '{"trace": "x", "expireAt": "1999999999999"}'),
        "rid-1",
        now_ms=NOW,
    )
    state, passthrough = h.decode(headers)
    assert (state.reactivate_to_topic, state.reactivate_at, state.record_id, state.expire_at) == (
        "orders",
        1777627800000,
        "rid-1",
        1999999999999,
    )
    assert passthrough == [("trace", b"x")]
    state, _ = h.decode(ingress_headers(BulkRow("orders", None, "90s", None), "rid-2", now_ms=NOW))
    assert (state.delay_ms, state.reactivate_at) == (90_000, None)


@pytest.mark.parametrize(
    "request_, message",
    [
        (BulkRow("orders", "1", "5s", None), "exactly one"),
        (BulkRow("orders", None, None, None), "exactly one"),
        (BulkRow("orders", "1", None, None), "seconds"),
        (BulkRow(None, "1", None, None), "target"),
        (BulkRow("bad topic!", "1700000000000", None, None), "topic name"),
        (BulkRow("orders", None, "soon", None), "duration"),
        (BulkRow("orders", "1700000000000", None, '{"recordId": "mine"}'), "set by the job"),
        (BulkRow("orders", "1700000000000", None, "[1]"), "object"),
        # what the router would dead-letter, refused by the schedule contract before a write
        (BulkRow("orders", None, "2h", '{"expireAt": "1700000000000"}'), "expires"),
        (BulkRow("orders", "1700000000000", None, '{"expireAt": "soon"}'), "epoch ms"),
        (BulkRow("orders", None, "30d", None), "maximum delay"),
    ],
)
def test_ingress_headers_refuse_bad_rows(request_, message):
    with pytest.raises(PipelineError, match=message):
        ingress_headers(request_, "rid", now_ms=NOW, max_delay_ms=7 * 86_400_000)


def test_times_iso_epoch_and_ago():
    assert parse_time_ms("1700000000000") == 1_700_000_000_000
    assert parse_time_ms("2023-11-14T22:13:20") == 1_700_000_000_000
    assert parse_time_ms("2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    assert parse_time_or_ago_ms("2h", 10_000_000) == 10_000_000 - 7_200_000
    with pytest.raises(PipelineError):
        parse_time_or_ago_ms("yesterday", 0)


# -- denomination optimizer --------------------------------------------------------------

from itertools import combinations  # noqa: E402
from math import comb  # noqa: E402

from delayapp.pipelines.optimizer import (  # noqa: E402
    default_candidates,
    expected_hops,
    format_comparison,
    optimize_ladder,
    serial_evaluator,
)

S = 1_000


def test_expected_hops_is_the_planners_exact_mean():
    assert expected_hops((S, 5 * S), [(10 * S, 1)]) == 2
    assert expected_hops((S, 3 * S, 4 * S), [(6 * S, 3), (4 * S, 1)]) == (2 * 3 + 1) / 4  # 3+3, not greedy 4+1+1
    assert expected_hops((S,), []) == 0.0


def test_optimizer_finds_the_obvious_ladder():
    histogram = [(7 * S, 50), (70 * S, 50)]
    best = optimize_ladder(
        3,
        S,
        [2 * S, 5 * S, 7 * S, 10 * S, 30 * S, 60 * S, 70 * S],
        serial_evaluator(histogram),
        current=(S, 5 * S, 60 * S),
    )
    assert best.denominations == (S, 7 * S, 70 * S) and best.expected_hops == 1.0


HISTOGRAMS = st.lists(st.tuples(st.integers(1, 120).map(lambda s: s * S), st.integers(1, 5)), min_size=1, max_size=6)
CANDIDATES = st.sampled_from([2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60, 90, 120]).map(lambda s: s * S)


def brute_force(k, pool, histogram):
    """(expected hops, ladder) of the best ladder of k: S and k - 1 of the pool, ties to smaller denominations."""
    return min((expected_hops((S, *rest), histogram), (S, *rest)) for rest in combinations(sorted(pool), k - 1))


def test_optimizer_is_exact_where_a_single_local_search_got_stuck():
    # main's greedy growth + swaps proposed 1s,2s,5s (7 hops for 29 s); 1s,3s,10s needs 5
    best = optimize_ladder(
        3, S, [2 * S, 3 * S, 5 * S, 10 * S, 30 * S, 60 * S], serial_evaluator([(29 * S, 1)]), current=(S, 5 * S, 60 * S)
    )
    assert best.exact and best.evaluated == comb(6, 2)
    assert (best.expected_hops, best.denominations) == (5.0, (S, 3 * S, 10 * S))


@given(HISTOGRAMS, st.integers(1, 5), st.lists(CANDIDATES, min_size=4, max_size=8, unique=True))
@settings(deadline=None)  # brute force and planner tables: timing varies on a shared CI machine
def test_optimizer_finds_the_brute_force_optimum_when_the_candidate_ladders_fit_the_budget(histogram, k, pool):
    current = (S, 5 * S, 60 * S)[:k]
    best = optimize_ladder(k, S, pool, serial_evaluator(histogram), current=current)
    searched = set(pool) | set(current[1:])  # the current ladder's denominations are candidates too
    assert best.exact and best.evaluated == comb(len(searched), k - 1)  # every ladder scored once, nothing else
    assert (best.expected_hops, best.denominations) == brute_force(k, searched, histogram)
    assert best.expected_hops <= expected_hops(current, histogram)


@given(HISTOGRAMS, st.integers(3, 6), st.lists(CANDIDATES, min_size=9, max_size=12, unique=True), st.integers(1, 150))
@settings(deadline=None)  # brute force and planner tables: timing varies on a shared CI machine
def test_the_local_search_for_large_pools_is_swap_optimal_and_never_worse_than_greedy_growth_or_the_current_ladder(
    histogram, k, pool, budget
):
    # The budget is below C(n, k-1), as for the default candidates (C(25, 8) = 1.1 million ladders for k = 9).
    # A local optimum has no proven ratio to the global one (main asserted 1.25x and hypothesis
    # found 7 hops against 5), so this checks what the construction guarantees; the brute-force
    # optimum is asserted where the search is exhaustive (above).
    current = (S, 5 * S, 30 * S, 60 * S, 90 * S, 120 * S)[:k]
    searched = sorted(set(pool) | set(current[1:]))
    budget = min(budget, comb(len(searched), k - 1) - 1)
    best = optimize_ladder(k, S, pool, serial_evaluator(histogram), current=current, max_evaluations=budget)
    assert not best.exact and len(best.denominations) == k and best.denominations[0] == S
    assert set(best.denominations) <= set(searched) | {S}
    assert best.expected_hops == expected_hops(best.denominations, histogram)
    assert best.expected_hops <= expected_hops(current, histogram)
    grown = (S,)
    while len(grown) < k:
        grown = min(
            (expected_hops(ladder, histogram), ladder)
            for ladder in (tuple(sorted((*grown, c))) for c in searched if c not in grown)
        )[1]
    assert best.expected_hops <= expected_hops(grown, histogram)
    for out in best.denominations[1:]:
        for into in set(searched) - set(best.denominations):
            assert expected_hops(sorted({*best.denominations, into} - {out}), histogram) >= best.expected_hops


def test_restarts_escape_the_local_optimum_of_the_first_search():
    pool = [s * S for s in (2, 3, 10, 12, 15, 20, 30, 45, 60, 90, 120, 300)]
    histogram = [(68 * S, 3)]  # 45s + 20s + 3s
    assert brute_force(4, pool, histogram) == (3.0, (S, 3 * S, 20 * S, 45 * S))
    alone = optimize_ladder(4, S, pool, serial_evaluator(histogram), max_evaluations=1)  # no restart
    assert alone.expected_hops == 4.0 and not alone.exact
    best = optimize_ladder(4, S, pool, serial_evaluator(histogram), max_evaluations=200)  # C(12, 3) = 220 ladders
    assert (best.expected_hops, best.denominations) == (3.0, (S, 3 * S, 20 * S, 45 * S)) and not best.exact
    assert best.evaluated < 220


def test_optimizer_refuses_impossible_budgets_and_candidates_stop_above_the_largest_delay():
    with pytest.raises(PipelineError):
        optimize_ladder(5, S, [2 * S], serial_evaluator([(S, 1)]))
    assert default_candidates(S, 50 * S) == [S, 2 * S, 3 * S, 5 * S, 10 * S, 15 * S, 20 * S, 30 * S, 45 * S, 60 * S]
    text = format_comparison(
        {
            "current": dict.fromkeys(
                ["ladder", "denominations", "topics", "expected_hops", "worst_case_hops", "max_delay"], 1
            ),
            "proposed": dict.fromkeys(
                ["ladder", "denominations", "topics", "expected_hops", "worst_case_hops", "max_delay"], 2
            ),
        }
    )
    assert "expected hops" in text.splitlines()[4]


def test_a_ladder_breaking_the_worst_case_bound_loses_to_any_that_keeps_it():
    from delayapp.pipelines.optimizer import PENALTY, Bound, ladder_cost

    histogram = [(7 * S, 1)]
    bound = Bound(max_delay_ms=3_600 * S, hops=100)
    assert ladder_cost((S, 7 * S), histogram, bound) >= PENALTY  # an hour of 7s hops
    assert ladder_cost((S, 7 * S, 600 * S), histogram, bound) == 1.0
    best = optimize_ladder(3, S, [7 * S, 60 * S, 600 * S], serial_evaluator(histogram, bound))
    assert (
        best.expected_hops == 1.0 and 7 * S in best.denominations
    )  # and within the bound, unlike (1s, 7s) + anything tiny

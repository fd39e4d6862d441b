"""``python -m bench --against``: the verdict, the grouping and order of the runs, the figures read
from a run's JSON, and a release prepared once per commit (no broker: pure functions, and git)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from bench import compare
from bench.__main__ import NEEDS, SECTIONS
from bench.compare import (
    FIGURES,
    ChildRun,
    ReleaseError,
    compare_figures,
    first_and_second,
    group_sections,
    prepare_release,
    relative_range,
    table,
    verdict,
)


def test_a_figure_worse_in_every_round_by_more_than_the_noise_fell() -> None:
    # throughput: this release 20 % down in each round, each side within 2 % over the rounds
    judged = verdict([80, 81, 79], [100, 101, 99], higher_is_better=True)
    assert judged.word == "FELL"
    assert judged.ratio == pytest.approx(0.8, abs=0.01) and judged.noise == compare.MIN_CHANGE


def test_a_lower_is_better_figure_that_rose_fell_and_one_that_dropped_is_better() -> None:
    assert verdict([30, 31, 29], [20, 20, 21], higher_is_better=False).word == "FELL"
    assert verdict([20, 20, 21], [30, 31, 29], higher_is_better=False).word == "better"


def test_a_change_within_the_noise_of_either_side_is_the_same() -> None:
    # 10 % lower in every round, but this release's own values range over 40 % of their median
    judged = verdict([90, 70, 110], [100, 78, 122], higher_is_better=True)
    assert judged.word == "same within noise"
    assert judged.noise == pytest.approx(relative_range([90, 70, 110]))


def test_a_change_not_in_every_round_is_the_same() -> None:
    # far lower by the median, but one round the other way
    assert verdict([50, 50, 105], [100, 100, 100], higher_is_better=True).word == "same within noise"


def test_a_change_below_the_floor_is_the_same_even_without_noise() -> None:
    assert verdict([97, 97, 97], [100, 100, 100], higher_is_better=True).word == "same within noise"
    assert verdict([90, 90, 90], [100, 100, 100], higher_is_better=True).word == "FELL"


def test_one_round_gives_no_verdict_and_missing_rounds_are_left_out() -> None:
    assert verdict([50], [100], higher_is_better=True).word == "no verdict (1 round)"
    judged = verdict([50, None, 49], [100, 100, None], higher_is_better=True)
    assert judged.ratios == (0.5, None, None) and judged.word == "no verdict (1 round)"
    assert verdict([None, None], [1, 2], higher_is_better=True).word == "no round with both"


def test_zeros_compare_as_equal_and_a_rise_from_zero_as_infinite() -> None:
    assert verdict([0, 0], [0, 0], higher_is_better=False).word == "same within noise"
    assert verdict([5, 6], [0, 0], higher_is_better=False).word == "FELL"


def test_a_section_runs_with_the_one_it_is_measured_against() -> None:
    groups = group_sections({"burst", "relay", "hops", "mix", "lateness", "saturation"}, NEEDS, SECTIONS)
    assert groups == [("relay", "hops", "burst"), ("mix",), ("saturation", "lateness")]
    assert group_sections({"skew", "relay"}, NEEDS, SECTIONS) == [("relay",), ("skew",)]


def test_the_release_that_goes_first_alternates_by_round_and_by_group() -> None:
    assert [first_and_second(r, 0) for r in range(4)] == [
        ("this", "other"),
        ("other", "this"),
        ("this", "other"),
        ("other", "this"),
    ]
    assert first_and_second(0, 1) == ("other", "this")


RUN_JSON = {
    "relay": {"aiokafka": [30_000.0], "confluent": [80_000.0], "best": 80_000.0, "bare_hop_loop": [50_000.0]},
    "hops": {"records": 5000, "intermediate": [40_000.0], "delivery_audit": [20_000.0]},
    "saturation": {"delayapp": {"rate": 4_000, "failed_at": 8_000}, "redis": "redis-server not installed"},
    "lateness": [{"p99": 7.0}, {"p99": 30.0}],
    "skew": [{"offset_ms": 5_000, "p99": 12.0}, {"offset_ms": -5_000, "p99": 9.0}],
    "backlog": {"audit_off": [{"waiting": 10_000, "rss_mb": 100.0}, {"waiting": 110_000, "rss_mb": 104.0}]},
}


def test_the_figures_are_read_from_a_runs_json_and_a_missing_one_is_none() -> None:
    read = {figure.name: figure.read(RUN_JSON) for figure in FIGURES}
    assert read["relay, best of the two"] == 80_000
    assert read["intermediate hop / its run's relay"] == 0.5
    assert read["delivery, audit off"] is None  # not in this JSON
    assert read["saturation rate, one worker"] == 4_000
    assert read["saturation rate, Redis tuned (reference)"] is None  # a note instead of a result
    assert (read["lateness p99 at 1,000 rec/s"], read["lateness p99 at half the saturation rate"]) == (7, 30)
    assert (read["lateness p99, worker 5 s ahead"], read["lateness p99, worker 5 s behind"]) == (12, 9)
    assert read["backlog: bytes per waiting record (audit off)"] == pytest.approx(40)
    assert read["recovery: SIGKILL to first delivery"] is None


def test_the_comparison_says_which_figures_a_release_lacks_or_failed_to_measure() -> None:
    older = {"relay": RUN_JSON["relay"], "hops": {"intermediate": [40_000.0]}}  # no delivery figures
    runs = [
        ChildRun(r, ("relay", "hops"), release, 0, data=data)
        for r in range(2)
        for release, data in (("this", RUN_JSON), ("other", older))
    ]
    runs += [ChildRun(r, ("skew",), "other", 0, returncode=2) for r in range(2)]
    runs += [ChildRun(r, ("skew",), "this", 0, data=RUN_JSON) for r in range(2)]
    rows = {row["figure"]: row for row in compare_figures(runs, 2, ["relay", "hops", "skew"], "0.5.0")}
    assert rows["intermediate hop"]["verdict"] == "same within noise"
    assert rows["intermediate hop"]["ratios"] == [1.0, 1.0]
    assert rows["delivery, audit on"]["verdict"] == "not in 0.5.0"
    assert rows["lateness p99, worker 5 s ahead"]["verdict"] == "0.5.0 failed (exit 2)"
    assert "burst: lateness p50" not in rows  # a section not run has no row
    printed = table(list(rows.values()), "0.5.0")
    assert "0.5.0 (median, min-max)" in printed and "not in 0.5.0" in printed


def _repo_with_a_release(tmp_path: Path) -> tuple[Path, Path]:
    """A git repository whose bin/setup makes a stand-in .venv and counts its runs."""
    repo, count = tmp_path / "repo", tmp_path / "setups"
    (repo / "bin").mkdir(parents=True)
    setup = repo / "bin" / "setup"
    setup.write_text(
        '#!/usr/bin/env bash\nset -e\ncd "$(dirname "$0")/.."\nmkdir -p .venv/bin\n'
        'printf "#!/bin/sh\\n" > .venv/bin/python\nchmod +x .venv/bin/python\n'
        f"echo run >> {count}\n"
    )
    setup.chmod(setup.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    for command in (["init", "-q"], ["add", "bin/setup"], ["commit", "-q", "-m", "one"], ["tag", "v1"]):
        subprocess.run(["git", *command], cwd=repo, check=True, env=env)
    return repo, count


def test_a_release_is_prepared_once_per_commit_and_reused(tmp_path: Path) -> None:
    repo, count = _repo_with_a_release(tmp_path)
    cache = tmp_path / "releases"
    first = prepare_release("v1", repo, cache, log=lambda line: None)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert first.root == cache / sha and first.commit == sha
    assert Path(first.python).exists() and (first.root / "bin" / "setup").exists()
    again = prepare_release("HEAD", repo, cache, log=lambda line: None)  # another name for the same commit
    assert again.root == first.root
    assert count.read_text().split() == ["run"]  # its bin/setup ran once
    # the worktree is git's: listed by the repository, outside its tree
    listed = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout
    assert str(first.root) in listed


def test_a_checkout_given_by_path_is_used_as_it_is(tmp_path: Path) -> None:
    repo, count = _repo_with_a_release(tmp_path)
    with pytest.raises(ReleaseError, match="no .venv"):
        prepare_release(str(repo), repo, tmp_path / "releases")
    subprocess.run(["bash", "bin/setup"], cwd=repo, check=True)
    release = prepare_release(str(repo), repo, tmp_path / "releases")
    assert release.root == repo.resolve() and release.python == str(repo / ".venv" / "bin" / "python")
    assert not (tmp_path / "releases").exists()


def test_an_unknown_revision_is_refused(tmp_path: Path) -> None:
    repo, _ = _repo_with_a_release(tmp_path)
    with pytest.raises(ReleaseError):
        prepare_release("no-such-revision", repo, tmp_path / "releases")

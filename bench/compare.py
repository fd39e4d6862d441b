"""``python -m bench --against REV``: this working tree beside another release, in the same run.

The other release is prepared once (:func:`prepare_release`): a git worktree of ``REV`` outside
the tracked tree, with its own virtual environment made by its own ``bin/setup``, kept by
commit under :func:`releases_dir` and reused; a path to a checkout with its ``.venv`` may be
given instead. Each round runs every group of sections (:func:`group_sections`: a section and
the one it is measured against go together) once for each release, as separate processes of
that release's own bench (``python -m bench --sections ... --runs 1 --json ...``) on one shared
broker, the release that goes first alternating round by round and group by group
(:func:`first_and_second`: A B, B A, ...), so that a drift of the machine or the broker over the
run weighs on both alike.

The figures are read from each run's JSON by the explicit table :data:`FIGURES` and set side
by side: each release's median and range over the rounds, the median of the per-round ratios
this/other and their range, and a verdict (:func:`verdict`): a figure FELL when this release
was worse in every round and its median ratio is worse than a factor ``1 + noise``, the noise
being the larger relative range (max - min over median) of the two releases' values over the
rounds, and never less than :data:`MIN_CHANGE`; "better" symmetrically; else "same within noise"
(no verdict from a single round: one round has no noise to compare with).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent  # this working tree
READY = ".delayapp-bench-ready"  # in a prepared release's .venv: its setup finished
#: the smallest change a verdict names, whatever the noise: the rounds of a short run can agree by chance
MIN_CHANGE = 0.05


class ReleaseError(RuntimeError):
    """The other release could not be found or prepared."""


# --- the figures -------------------------------------------------------------------------------


def _at(data: Any, *path: Any) -> Any:
    """``data[path[0]][path[1]]...``, None where a key or index is missing or the value is no container."""
    for key in path:
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value else None  # NaN: no figure


def _median_of(value: Any) -> float | None:
    """The median of a list of runs (the bench keeps each run's value), or a single number."""
    if isinstance(value, list):
        numbers = [n for n in map(_number, value) if n is not None]
        return statistics.median(numbers) if numbers else None
    return _number(value)


def _runs(*path: str) -> Callable[[dict], float | None]:
    return lambda data: _median_of(_at(data, *path))


def _value(*path: Any) -> Callable[[dict], float | None]:
    return lambda data: _number(_at(data, *path))


def _to_relay(*path: str) -> Callable[[dict], float | None]:
    """A rate over its own run's relay (the best of the two relays of the same child process)."""

    def read(data: dict) -> float | None:
        rate, relay = _median_of(_at(data, *path)), _number(_at(data, "relay", "best"))
        return rate / relay if rate is not None and relay else None

    return read


def _skew(ahead: bool) -> Callable[[dict], float | None]:
    def read(data: dict) -> float | None:
        for row in _at(data, "skew") or []:
            if isinstance(row, dict) and ((_number(row.get("offset_ms")) or 0) > 0) == ahead:
                return _number(row.get("p99"))
        return None

    return read


def _backlog_per_record(mode: str) -> Callable[[dict], float | None]:
    """RSS growth per waiting record from the first level to the largest up to 1,000,000, as the
    bench's own table computes it."""

    def read(data: dict) -> float | None:
        rows = [r for r in _at(data, "backlog", mode) or [] if isinstance(r, dict)]
        upto = [r for r in rows if (_number(r.get("waiting")) or 0) <= 1_000_000]
        if len(upto) < 2:
            return None
        first, last = upto[0], upto[-1]
        grown = (_number(last.get("rss_mb")) or 0) - (_number(first.get("rss_mb")) or 0)
        return grown * 1e6 / max(1, last["waiting"] - first["waiting"])

    return read


def _deploy(workers: int, guarantee: str, key: str) -> Callable[[dict], float | None]:
    def read(data: dict) -> float | None:
        for row in _at(data, "deploy") or []:
            if not isinstance(row, dict) or row.get("release", "this") != "this":
                continue  # a row of another release's workers (--deploy-python)
            if row.get("workers") == workers and row.get("guarantee") == guarantee:
                return _number(row.get(key))
        return None

    return read


@dataclass(frozen=True)
class Figure:
    """One compared figure: its name, the section whose JSON holds it, its unit, which way is
    better, and how to read it from a run's JSON (None: not there)."""

    name: str
    section: str
    unit: str
    higher_is_better: bool
    read: Callable[[dict], float | None] = field(repr=False, compare=False)


HIGHER, LOWER = True, False
_HOPS = (
    ("intermediate", "intermediate hop"),
    ("delivery_audit", "delivery, audit on"),
    ("delivery_no_audit", "delivery, audit off"),
)
_DEPLOYS = ((2, "at_least_once"), (2, "exactly_once"), (3, "at_least_once"), (3, "exactly_once"))

#: figure name -> where each release's bench JSON has it; the order of the printed table
FIGURES: tuple[Figure, ...] = (
    Figure("relay, best of the two", "relay", "rec/s", HIGHER, _value("relay", "best")),
    Figure("relay: aiokafka", "relay", "rec/s", HIGHER, _runs("relay", "aiokafka")),
    Figure("relay: confluent-kafka", "relay", "rec/s", HIGHER, _runs("relay", "confluent")),
    Figure("relay of a hop's records", "relay", "rec/s", HIGHER, _runs("relay", "relay_of_hop_records")),
    Figure("bare hop loop", "relay", "rec/s", HIGHER, _runs("relay", "bare_hop_loop")),
    Figure("bare delivery loop", "relay", "rec/s", HIGHER, _runs("relay", "bare_delivery_loop")),
    *(
        figure
        for key, label in _HOPS
        for figure in (
            Figure(label, "hops", "rec/s", HIGHER, _runs("hops", key)),
            Figure(f"{label} / its run's relay", "hops", "x", HIGHER, _to_relay("hops", key)),
        )
    ),
    Figure("mean hops, realistic mix", "mix", "hops", LOWER, _value("mix", "mean_hops")),
    Figure("mean hops, realistic mix, as a worker plans", "mix", "hops", LOWER, _value("mix", "worker_mean_hops")),
    Figure(
        "logical throughput, realistic mix (computed)",
        "mix",
        "rec/s",
        HIGHER,
        _value("mix", "computed_logical_throughput"),
    ),
    Figure("saturation rate, one worker", "saturation", "rec/s", HIGHER, _value("saturation", "delayapp", "rate")),
    Figure(
        "saturation rate, Redis tuned (reference)", "saturation", "rec/s", HIGHER, _value("saturation", "redis", "rate")
    ),
    Figure("saturation rate / Redis tuned", "saturation", "x", HIGHER, _value("saturation", "ratio")),
    Figure("lateness p99 at 1,000 rec/s", "lateness", "ms", LOWER, _value("lateness", 0, "p99")),
    Figure("lateness p99 at half the saturation rate", "lateness", "ms", LOWER, _value("lateness", 1, "p99")),
    Figure("lateness p99, worker 5 s ahead", "skew", "ms", LOWER, _skew(True)),
    Figure("lateness p99, worker 5 s behind", "skew", "ms", LOWER, _skew(False)),
    Figure("burst: first due -> last delivery", "burst", "s", LOWER, _value("burst", "drained_s")),
    Figure("burst: lateness p50", "burst", "ms", LOWER, _value("burst", "p50")),
    *(
        figure
        for mode, label in (("audit_off", "audit off"), ("audit_on", "audit on"))
        for figure in (
            Figure(f"backlog: bytes per waiting record ({label})", "backlog", "B", LOWER, _backlog_per_record(mode)),
            Figure(
                f"backlog: worker RSS, largest level ({label})",
                "backlog",
                "MB",
                LOWER,
                _value("backlog", mode, -1, "rss_mb"),
            ),
            Figure(
                f"backlog: restarted worker serving after ({label})",
                "backlog",
                "s",
                LOWER,
                _value("backlog", mode, -1, "restart", "serving_after_s"),
            ),
        )
    ),
    Figure("recovery: SIGKILL to first delivery", "recovery", "s", LOWER, _value("recovery_s")),
    Figure("Redis tuned throughput (reference)", "redis", "rec/s", HIGHER, _value("redis", "tuned", "throughput")),
    Figure("Redis tuned lateness p99 (reference)", "redis", "ms", LOWER, _value("redis", "lateness_tuned", "p99")),
    Figure("Redis memory per pending record (reference)", "redis", "B", LOWER, _value("redis", "bytes_per_pending")),
    *(
        figure
        for workers, guarantee in _DEPLOYS
        for figure in (
            Figure(
                f"rolling deploy, {workers} workers, {guarantee}: lateness p99",
                "deploy",
                "ms",
                LOWER,
                _deploy(workers, guarantee, "p99_ms"),
            ),
            Figure(
                f"rolling deploy, {workers} workers, {guarantee}: lateness max",
                "deploy",
                "ms",
                LOWER,
                _deploy(workers, guarantee, "max_ms"),
            ),
        )
    ),
)


# --- the verdict -------------------------------------------------------------------------------


def _quotient(a: float, b: float) -> float | None:
    """``a / b`` for non-negative figures; 0 over 0 is 1 (no change), x over 0 infinite; None for negatives."""
    if a < 0 or b < 0:
        return None
    if b == 0:
        return 1.0 if a == 0 else float("inf")
    return a / b


def relative_range(values: Sequence[float]) -> float:
    """(max - min) / median of ``values``: 0 for fewer than two; infinite when the median is 0 and they differ."""
    if len(values) < 2:
        return 0.0
    spread, middle = max(values) - min(values), abs(statistics.median(values))
    if spread == 0:
        return 0.0
    return spread / middle if middle else float("inf")


@dataclass(frozen=True)
class Verdict:
    """One figure of both releases over the rounds, compared (see :func:`verdict`)."""

    ratios: tuple[float | None, ...]  # this / other per round (None: a side missing that round)
    ratio: float | None  # median of the per-round ratios
    ratio_min: float | None
    ratio_max: float | None
    noise: float  # the larger relative range of the two sides' values, at least MIN_CHANGE
    word: str  # "FELL", "better", "same within noise", or why there is no verdict


def verdict(
    this: Sequence[float | None],
    other: Sequence[float | None],
    *,
    higher_is_better: bool,
    min_change: float = MIN_CHANGE,
) -> Verdict:
    """Compare one figure of two releases measured in the same rounds (``this[i]`` beside
    ``other[i]``), pure.

    The ratio of round i is this/other; its gain is that ratio when higher is better, its inverse
    when lower is (a gain above 1: this release did better). The noise is the larger relative
    range (max - min over median) of either release's values over the rounds, at least
    ``min_change``. FELL: the gain is below 1 in every round and its median below
    ``1 / (1 + noise)``; "better": above 1 in every round and its median above ``1 + noise``;
    else "same within noise". Rounds where either value is missing are left out; fewer than two
    left give no verdict (one round has no noise to judge by)."""
    ratios = tuple(_quotient(t, o) if t is not None and o is not None else None for t, o in zip(this, other))
    paired = [r for r in ratios if r is not None]
    ours = [v for v in this if v is not None]
    theirs = [v for v in other if v is not None]
    noise = max(relative_range(ours), relative_range(theirs), min_change)
    if not paired:
        return Verdict(ratios, None, None, None, noise, "no round with both")
    ratio = statistics.median(paired)
    summary = (ratios, ratio, min(paired), max(paired), noise)
    if len(paired) < 2:
        return Verdict(*summary, f"no verdict ({len(paired)} round)")
    gains = [r if higher_is_better else _quotient(1.0, r) or 0.0 for r in paired]
    gain = statistics.median(gains)
    if all(g < 1 for g in gains) and gain < 1 / (1 + noise):
        return Verdict(*summary, "FELL")
    if all(g > 1 for g in gains) and gain > 1 + noise:
        return Verdict(*summary, "better")
    return Verdict(*summary, "same within noise")


# --- the runs ----------------------------------------------------------------------------------


def group_sections(sections: Iterable[str], needs: Mapping[str, str], order: Sequence[str]) -> list[tuple[str, ...]]:
    """The selected sections in groups run by one process each: a section and the one it is
    measured against (``needs``: hops -> relay) together, transitively; in ``order``."""
    chosen = set(sections)
    group_of = {s: {s} for s in chosen}
    for section, needed in needs.items():
        if section in chosen and needed in chosen and group_of[section] is not group_of[needed]:
            merged = group_of[section] | group_of[needed]
            for s in merged:
                group_of[s] = merged
    groups: list[tuple[str, ...]] = []
    for s in order:
        if s in chosen:
            group = tuple(x for x in order if x in group_of[s])
            if group not in groups:
                groups.append(group)
    return groups


def first_and_second(round_index: int, group_index: int) -> tuple[str, str]:
    """Which release runs a group first in a round: this one in even (round + group), the other in
    odd, so each goes first as often as the other (A B, B A over the rounds) and a drift of the
    machine during a round does not always fall on the same release."""
    return ("this", "other") if (round_index + group_index) % 2 == 0 else ("other", "this")


@dataclass
class Release:
    """A checkout whose bench is run: its root and its virtual environment's interpreter."""

    name: str
    root: Path
    python: str
    commit: str = ""


@dataclass
class ChildRun:
    """One bench process: which round, group and release, how it ended, its JSON."""

    round: int
    group: tuple[str, ...]
    release: str  # "this" or "other"
    position: int  # 0: went first in its round and group
    returncode: int = 0
    seconds: float = 0.0
    json_path: str = ""
    log_path: str = ""
    data: dict | None = None
    tail: list[str] = field(default_factory=list)  # its last lines, kept for a run that failed

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.data is not None


def releases_dir() -> Path:
    """Where prepared releases are kept: $DELAYAPP_BENCH_RELEASES, else $XDG_CACHE_HOME (or
    ~/.cache)/delayapp-bench/releases; never inside the tracked tree."""
    given = os.environ.get("DELAYAPP_BENCH_RELEASES")
    if given:
        return Path(given).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "delayapp-bench" / "releases"


def _git(args: list[str], cwd: Path) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode:
        raise ReleaseError(f"git {' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout.strip()


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would make another checkout import this one's code."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(extra)
    return env


def _setup(root: Path, log: Callable[[str], None]) -> None:
    """The release's virtual environment, made by its own bin/setup; where it has none, or it
    fails, a venv with the release installed editable with its bench extra (as its pyproject says)."""
    python = root / ".venv" / "bin" / "python"
    base = getattr(sys, "_base_executable", None) or sys.executable  # the interpreter, not this venv
    env = _clean_env(PYTHON=base)
    setup = root / "bin" / "setup"
    if setup.exists():
        log(f"(preparing {root}: its bin/setup)")
        if subprocess.run(["bash", str(setup)], cwd=root, env=env).returncode == 0 and python.exists():
            return
        log("(its bin/setup failed: a venv and pip install -e instead)")
    if not python.exists():
        subprocess.run([base, "-m", "venv", str(root / ".venv")], cwd=root, env=env, check=True)
    extras = ""
    try:
        import tomllib

        with open(root / "pyproject.toml", "rb") as fh:
            declared = tomllib.load(fh).get("project", {}).get("optional-dependencies", {})
        wanted = [extra for extra in ("test", "bench") if extra in declared]
        extras = f"[{','.join(wanted)}]" if wanted else ""
    except (ImportError, OSError, ValueError):
        pass
    if subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "-e", f".{extras}"], cwd=root, env=env
    ).returncode:
        raise ReleaseError(f"could not install the release at {root} (pip install -e .{extras} failed)")
    if (root / "delayapp" / "dev" / "compile.py").exists():  # its record path compiled, as its bin/setup would
        subprocess.run([str(python), "-m", "delayapp.dev.compile"], cwd=root, env=env)


def prepare_release(
    against: str, repo: Path = REPO, cache: Path | None = None, *, log: Callable[[str], None] = print
) -> Release:
    """The other release, ready to run: ``against`` is an existing checkout with its ``.venv``
    (used as it is, never changed) or a git revision of ``repo``, checked out once per commit with
    ``git worktree add --detach`` under ``cache`` (default :func:`releases_dir`) and set up
    (:func:`_setup`); a release prepared before is reused."""
    given = Path(against).expanduser()
    if given.is_dir():
        python = given / ".venv" / "bin" / "python"
        if not python.exists():
            raise ReleaseError(f"{given} has no .venv/bin/python: run its bin/setup first")
        try:
            commit = _git(["rev-parse", "HEAD"], given)
        except (ReleaseError, OSError):
            commit = ""
        return Release(against, given.resolve(), str(python), commit)
    sha = _git(["rev-parse", "--verify", "--quiet", f"{against}^{{commit}}"], repo)
    root = (cache or releases_dir()) / sha
    python = root / ".venv" / "bin" / "python"
    if (root / ".venv" / READY).exists() and python.exists():
        log(f"(release {against} = {sha[:10]}: prepared before at {root}, reused)")
        return Release(against, root, str(python), sha)
    if root.exists():  # an earlier preparation that did not finish
        subprocess.run(["git", "worktree", "remove", "--force", str(root)], cwd=repo, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=repo, capture_output=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    log(f"(release {against} = {sha[:10]}: a worktree at {root})")
    _git(["worktree", "add", "--detach", str(root), sha], repo)
    _setup(root, log)
    if not python.exists():
        raise ReleaseError(f"the release at {root} has no .venv/bin/python after its setup")
    (root / ".venv" / READY).write_text(sha + "\n")
    return Release(against, root, str(python), sha)


def child_command(
    release: Release, group: Sequence[str], json_path: str, bootstrap: str, *, quick: bool, extra: Sequence[str]
) -> list[str]:
    """A release's own bench on ``group``: one measured run per figure, on the shared broker."""
    command = [release.python, "-m", "bench", "--sections", ",".join(group), "--runs", "1", "--json", json_path]
    if bootstrap:
        command += ["--broker", bootstrap]
    if quick:
        command.append("--quick")
    return [*command, *extra]


def run_child(
    command: list[str], release: Release, workdir: Path, log_path: str, tag: str, *, embedded: bool
) -> tuple[int, list[str]]:
    """Run a release's bench with that release's code first on its path (its checkout on
    PYTHONPATH) from a scratch directory (its workers' data directories land there, never in a
    checkout), printing its output with ``tag``. With the embedded broker shared, its workers get
    the setting that broker needs (the child, given ``--broker``, takes the broker for a real one)."""
    env = _clean_env(PYTHONPATH=str(release.root))
    if embedded:
        env["DELAYAPP_RECOVERY_CONSISTENCY_CHECK"] = "false"
    tail: collections.deque[str] = collections.deque(maxlen=20)
    workdir.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        try:
            assert process.stdout is not None
            for line in process.stdout:
                log.write(line)
                tail.append(line.rstrip("\n"))
                print(f"  [{tag}] {line}", end="", flush=True)
            return process.wait(), list(tail)
        finally:
            if process.poll() is None:
                process.terminate()
                process.wait(30)


# --- the table ---------------------------------------------------------------------------------


def _number_text(value: float, unit: str) -> str:
    if value == float("inf"):
        return "inf"
    if unit in ("x", "hops"):
        return f"{value:.2f}"
    if unit == "s":
        return f"{value:.1f}"
    return f"{value:,.0f}"


def fmt(value: float | None, unit: str) -> str:
    """A figure's value in its unit, as the bench prints it."""
    if value is None:
        return "-"
    return _number_text(value, unit) + ("x" if unit == "x" else f" {unit}")


def _side(values: Sequence[float | None], unit: str) -> str:
    """One release's values over the rounds: the median, and the range when there are several."""
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return fmt(present[0], unit) if present else "-"
    low, high = (_number_text(v, unit) for v in (min(present), max(present)))
    return f"{_number_text(statistics.median(present), unit)} ({low}-{high}){'x' if unit == 'x' else ' ' + unit}"


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else ("inf" if value == float("inf") else f"{value:.2f}")


def compare_figures(
    runs: Sequence[ChildRun], rounds: int, sections: Iterable[str], other_name: str
) -> list[dict[str, Any]]:
    """Each figure of the sections run, per round for both releases, with its verdict."""
    chosen = set(sections)
    by_key = {(run.round, run.release, section): run for run in runs for section in run.group}
    rows = []
    for figure in FIGURES:
        if figure.section not in chosen:
            continue
        values: dict[str, list[float | None]] = {}
        failed: dict[str, list[int]] = {}
        for release in ("this", "other"):
            values[release], failed[release] = [], []
            for r in range(rounds):
                run = by_key.get((r, release, figure.section))
                if run is None or not run.ok:
                    values[release].append(None)
                    if run is not None:
                        failed[release].append(run.returncode)
                    continue
                assert run.data is not None
                values[release].append(figure.read(run.data))
        judged = verdict(values["this"], values["other"], higher_is_better=figure.higher_is_better)
        word = judged.word
        for release, name in (("other", other_name), ("this", "this")):
            if all(v is None for v in values[release]):
                if failed[release] and len(failed[release]) == rounds:
                    word = f"{name} failed (exit {', '.join(map(str, sorted(set(failed[release]))))})"
                else:
                    word = f"not in {name}"
        rows.append(
            {
                "figure": figure.name,
                "section": figure.section,
                "unit": figure.unit,
                "higher_is_better": figure.higher_is_better,
                "this": values["this"],
                "other": values["other"],
                "ratios": list(judged.ratios),
                "ratio": judged.ratio,
                "ratio_min": judged.ratio_min,
                "ratio_max": judged.ratio_max,
                "noise": judged.noise,
                "verdict": word,
            }
        )
    return rows


def table(rows: Sequence[dict[str, Any]], other_name: str) -> str:
    """The printed comparison."""
    head = (
        "figure",
        "this (median, min-max)",
        f"{other_name} (median, min-max)",
        "this/other",
        "ratio min-max",
        "verdict",
    )
    lines = []
    for row in rows:
        arrow = "higher is better" if row["higher_is_better"] else "lower is better"
        spread = "-" if row["ratio_min"] is None else f"{_ratio_text(row['ratio_min'])}-{_ratio_text(row['ratio_max'])}"
        word = row["verdict"]
        if word in ("FELL", "better", "same within noise"):
            word += f" (noise {row['noise']:.0%})"
        lines.append(
            (
                f"{row['figure']} ({arrow})",
                _side(row["this"], row["unit"]),
                _side(row["other"], row["unit"]),
                _ratio_text(row["ratio"]),
                spread,
                word,
            )
        )
    widths = [max(len(r[i]) for r in [head, *lines]) for i in range(len(head))]

    def line(r: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, lines)])


# --- the command -------------------------------------------------------------------------------


def run_against(
    against: str,
    *,
    sections: Iterable[str],
    needs: Mapping[str, str],
    order: Sequence[str],
    rounds: int,
    broker: str | None,
    quick: bool,
    json_path: str,
    extra: Sequence[str] = (),
    offline: Iterable[str] = (),
) -> int:
    """``python -m bench --against``: prepare the other release, run both in alternated rounds on
    one broker (the given one, else one embedded broker started here for both), print the
    comparison and write it as JSON with every round's values. A bench process that fails is
    reported, and its figures are missing from that round."""
    this = Release("this", REPO, sys.executable, _head(REPO))
    try:
        other = prepare_release(against)
    except ReleaseError as exc:
        print(f"bench --against {against}: {exc}", file=sys.stderr)
        return 2
    chosen = [s for s in order if s in set(sections)]
    groups = group_sections(chosen, needs, order)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = (Path(os.path.dirname(json_path) or ".") / f"compare-{stamp}").resolve()  # the children run elsewhere
    out_dir.mkdir(parents=True, exist_ok=True)
    needs_broker = not set(chosen) <= set(offline)
    embedded = None
    if needs_broker and not broker:
        from delayapp.dev.embedded_broker import EmbeddedBroker

        embedded = EmbeddedBroker(log_path=str(out_dir / "broker.log")).start()
    bootstrap = broker or (embedded.bootstrap if embedded else "")
    print(
        f"delayapp bench: this tree ({this.commit[:10] or '?'} + working changes) against {other.name} "
        f"({other.commit[:10] or '?'}, {other.root}), {rounds} round(s) of {' | '.join(','.join(g) for g in groups)}, "
        f"on {bootstrap or 'no broker'} ({'embedded Tansu, shared' if embedded else 'given broker'}); "
        f"each run's JSON and log in {out_dir}",
        flush=True,
    )
    releases = {"this": this, "other": other}
    runs: list[ChildRun] = []
    try:
        for r in range(rounds):
            for g, group in enumerate(groups):
                for position, which in enumerate(first_and_second(r, g)):
                    release = releases[which]
                    name = f"r{r + 1}-{'+'.join(group)}-{which}"
                    run = ChildRun(r, group, which, position)
                    run.json_path, run.log_path = str(out_dir / f"{name}.json"), str(out_dir / f"{name}.log")
                    tag = f"{'this' if which == 'this' else other.name} r{r + 1}"
                    print(f"--- round {r + 1}/{rounds}, {','.join(group)}: {tag} ---", flush=True)
                    command = child_command(release, group, run.json_path, bootstrap, quick=quick, extra=extra)
                    started = time.monotonic()
                    run.returncode, run.tail = run_child(
                        command, release, out_dir / f"work-{which}", run.log_path, tag, embedded=embedded is not None
                    )
                    run.seconds = time.monotonic() - started
                    if run.returncode == 0:
                        try:
                            with open(run.json_path) as fh:
                                run.data = json.load(fh)
                        except (OSError, ValueError) as exc:
                            run.tail.append(f"(its JSON unreadable: {exc})")
                    runs.append(run)
    finally:
        if embedded is not None:
            embedded.stop()
    rows = compare_figures(runs, rounds, chosen, other.name)
    print(f"\nthis tree against {other.name}: median of {rounds} round(s), ratio this/other per round")
    print(table(rows, other.name))
    failed = [run for run in runs if not run.ok]
    for run in failed:
        who = "this tree" if run.release == "this" else other.name
        print(
            f"\n{who}, round {run.round + 1}, sections {','.join(run.group)}: exit {run.returncode} "
            f"(log {run.log_path}); its last lines:\n    " + "\n    ".join(run.tail[-8:])
        )
    result = {
        "started": stamp,
        "this": {"root": str(this.root), "commit": this.commit, "python": this.python},
        "other": {"name": other.name, "root": str(other.root), "commit": other.commit, "python": other.python},
        "broker": broker or ("embedded Tansu" if embedded else None),
        "rounds": rounds,
        "quick": quick,
        "groups": [list(g) for g in groups],
        "min_change": MIN_CHANGE,
        "runs": [
            {
                "round": run.round + 1,
                "sections": list(run.group),
                "release": run.release,
                "position": run.position,
                "returncode": run.returncode,
                "seconds": round(run.seconds, 1),
                "json": run.json_path,
                "log": run.log_path,
            }
            for run in runs
        ],
        "figures": rows,
    }
    os.makedirs(os.path.dirname(json_path) or ".", exist_ok=True)
    with open(json_path, "w") as fh:
        json.dump(result, fh, indent=2, default=str)
    print(f"(comparison written to {json_path})")
    return 0


def _head(root: Path) -> str:
    try:
        return _git(["rev-parse", "HEAD"], root)
    except (ReleaseError, OSError):
        return ""

"""NAB's scoring rules, checked on cases worked by hand, and the stream scorer's contract."""

from __future__ import annotations

import copy
import json
import math
import random
from datetime import datetime, timedelta
from pathlib import Path
from statistics import NormalDist
from typing import Any

import pytest

from evaluations.nab import LOCO_GRID
from evaluations.nab_scoring import (
    STANDARD,
    CostProfile,
    SweptFile,
    best_threshold,
    file_score,
    normalised,
    probation_rows,
    scaled_sigmoid,
    sweep,
)
from fleetloop.cli import main
from models.evidence import rank
from models.univariate import StreamScorer, StreamScorerConfig, WindowedGaussian

T0 = datetime(2024, 1, 1)


def _times(count: int) -> list[datetime]:
    return [T0 + timedelta(minutes=5 * i) for i in range(count)]


def test_scaled_sigmoid_matches_the_documented_values() -> None:
    assert scaled_sigmoid(-1.0) == pytest.approx(0.98661, abs=1e-5)  # window's left edge
    assert scaled_sigmoid(-0.5) == pytest.approx(0.84828, abs=1e-5)
    assert scaled_sigmoid(0.0) == 0.0  # its right edge
    assert scaled_sigmoid(1.0) == pytest.approx(-0.98661, abs=1e-5)
    assert scaled_sigmoid(3.0) == -1.0


def test_probation_is_15_percent_capped_at_750_rows() -> None:
    assert probation_rows(1000) == 150
    assert probation_rows(10_000) == 750


def test_false_positives_before_any_window_cost_the_full_fp_weight() -> None:
    n = 1000
    scores = [0.0] * n
    scores[500] = scores[700] = 1.0
    f = sweep("a.csv", _times(n), scores, [], STANDARD)
    assert file_score(f, 0.5, STANDARD) == pytest.approx(-0.22)  # 2 x -0.11


def test_earliest_detection_in_a_window_scores_and_a_missed_window_costs_fn() -> None:
    n, t = 1000, _times(1000)
    windows = [(t[400], t[499]), (t[700], t[799])]
    scores = [0.0] * n
    scores[400] = 1.0  # left edge of the first window: worth tp (1.0)
    scores[450] = 0.8  # later in the same window: only the best counts
    f = sweep("b.csv", t, scores, windows, STANDARD)
    assert f.windows == 2
    assert file_score(f, 0.5, STANDARD) == pytest.approx(1.0 - 1.0)  # tp, then fn for window 2
    # a detection just past a window costs less than one far away
    near, far = [0.0] * n, [0.0] * n
    near[502], far[650] = 1.0, 1.0
    cost_near = file_score(sweep("c", t, near, windows, STANDARD), 0.5, STANDARD) + 2.0
    cost_far = file_score(sweep("c", t, far, windows, STANDARD), 0.5, STANDARD) + 2.0
    assert -0.11 < cost_far < cost_near < 0
    assert cost_far == pytest.approx(0.11 * scaled_sigmoid(151 / 99))  # 1.5 widths past


def test_probation_rows_and_windows_inside_them_do_not_count() -> None:
    n, t = 1000, _times(1000)
    scores = [0.0] * n
    scores[10] = 1.0  # in probation: neither a detection nor a false positive
    f = sweep("d.csv", t, scores, [(t[5], t[20])], STANDARD)
    assert f.windows == 0 and file_score(f, 0.5, STANDARD) == 0.0


def test_one_threshold_for_the_corpus_chosen_exactly() -> None:
    n, t = 1000, _times(1000)
    a = [0.0] * n
    a[400] = 0.9  # a true detection at 0.9
    b = [0.0] * n
    b[600] = 0.95  # a false positive at 0.95, in a file without windows
    files = [sweep("a", t, a, [(t[400], t[499])], STANDARD), sweep("b", t, b, [], STANDARD)]
    threshold, raw = best_threshold(files, STANDARD)
    assert threshold == 0.9  # taking the FP (-0.11) to gain the TP (+2 over missing it)
    assert raw == pytest.approx(1.0 - 0.11)
    assert normalised(raw, files, STANDARD) == pytest.approx(100 * (0.89 + 1) / 2)
    assert normalised(-1.0, files, STANDARD) == 0.0  # the null detector
    assert normalised(1.0, files, STANDARD) == 100.0  # the perfect one


def test_stream_scorer_scores_before_learning_and_finds_a_level_shift() -> None:
    rng = random.Random(3)
    values = [10.0 + rng.gauss(0, 0.5) + (4.0 if i >= 2500 else 0.0) for i in range(3000)]
    scorer, again = StreamScorer(), StreamScorer()
    scores = _score_then_learn(scorer, values, _times(3000))
    assert scores == _score_then_learn(again, values, _times(3000))
    assert scores[0] == 0.0 and all(0.0 <= s <= 1.0 for s in scores)
    assert max(scores[2500:2510]) > max(scores[1000:2490])  # the shift ranks above the noise
    assert min(scores[2510:2600]) < 0.5  # and is one detection: the refractory damps the rest
    assert scorer.score_one(math.nan) == 0.0 and scorer.score_one(math.inf) == 0.0
    baseline = WindowedGaussian()
    assert max(_score_then_learn(baseline, values, _times(3000))) > 0.99


def test_a_rhythm_that_changes_shape_inside_its_range_is_news() -> None:
    """A sawtooth that starts falling instead of rising: the same values, as often, in the
    same range; only the order is new, which the sequence memory alone sees (no timestamps,
    so no season to compare with). The scorer before the sequence memory ranked the change
    below the noise: 0.77 against 0.79."""
    rng = random.Random(11)
    period, change = 24, 2400
    values = [
        float((i % period) if i < change else (period - 1 - i % period)) + rng.gauss(0, 0.05)
        for i in range(3000)
    ]
    scorer, scores = StreamScorer(), []
    for value in values:
        scores.append(scorer.score_one(value))
        scorer.learn_one(value)
    assert max(scores[change : change + period]) > max(scores[1000:change])
    # the new shape is learned: a day later it is not news any more
    assert max(scores[change + 300 :]) < max(scores[change : change + period])


def test_a_value_the_stream_was_never_near_is_an_anomaly_on_its_own() -> None:
    """One spike past the range seen so far, in a stream whose short-window likelihood
    would average it away: beyond ``outside_margin`` of the range it scores at least the
    alarm's level, higher the further out, and alarms (the refractory period follows)."""
    rng = random.Random(9)
    noise = [50.0 + rng.uniform(-10.0, 10.0) for _ in range(2000)]  # range 40-60: margin 1
    config = StreamScorerConfig()
    alarm_level = rank(NormalDist().inv_cdf(config.alarm))

    def after(value: float) -> tuple[float, StreamScorer]:
        scorer = StreamScorer(config)
        for v in noise:
            scorer.learn_one(v)
        return scorer.score_one(value), scorer

    lo, hi = min(noise), max(noise)
    inside, _ = after(hi + 0.5)  # within the margin: the usual views judge it
    near, _ = after(hi + 1.5)
    far, scorer = after(hi + 30.0)
    assert inside < alarm_level <= near < far < 1.0
    assert after(lo - 1.5)[0] >= alarm_level  # either side
    alarmed = scorer.alarmed_at
    scorer.learn_one(hi + 30.0)
    assert scorer.alarmed_at == scorer.n > alarmed
    assert scorer.score_one(hi + 30.0) < 0.5  # halved: one anomaly, one alarm


@pytest.mark.parametrize(
    ("field", "value"), [("alarm", 1.0), ("alarm", 0.4), ("outside_margin", 0.0)]
)
def test_scorer_settings_out_of_range_are_refused_plainly(field: str, value: float) -> None:
    settings: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=field):
        StreamScorerConfig(**settings)


def _score_then_learn(
    scorer: StreamScorer | WindowedGaussian, values: list[float], times: list[datetime]
) -> list[float]:
    scores = []
    for value, at in zip(values, times, strict=True):
        scores.append(scorer.score_one(value, at))
        scorer.learn_one(value, at)
    return scores


@pytest.mark.parametrize("detector", [StreamScorer, WindowedGaussian])
def test_score_one_changes_nothing_and_learn_one_learns(
    detector: type[StreamScorer] | type[WindowedGaussian],
) -> None:
    rng = random.Random(5)
    scorer = detector()
    for i, at in enumerate(_times(400)):
        value = 3.0 + rng.gauss(0, 0.2) + (5.0 if i > 350 else 0.0)
        before = copy.deepcopy(vars(scorer))
        first = scorer.score_one(value, at)
        assert scorer.score_one(value, at) == first  # scoring twice: the same answer
        assert vars(scorer) == before  # and nothing learned
        scorer.learn_one(value, at)
        assert vars(scorer) != before or not math.isfinite(value)


def _corpus(root: Path) -> None:
    rng = random.Random(7)
    t = _times(2000)
    (root / "data" / "cat").mkdir(parents=True)
    labels = {}
    for name, spike in (("one.csv", 1500), ("two.csv", None)):
        rows = ["timestamp,value"]
        for i, at in enumerate(t):
            v = 5.0 + rng.gauss(0, 0.2) + (2.0 if spike and spike <= i < spike + 30 else 0.0)
            rows.append(f"{at:%Y-%m-%d %H:%M:%S},{v:.3f}")
        (root / "data" / "cat" / name).write_text("\n".join(rows) + "\n")
        labels[f"cat/{name}"] = (
            [[f"{t[1450]:%Y-%m-%d %H:%M:%S}.000000", f"{t[1550]:%Y-%m-%d %H:%M:%S}.000000"]]
            if spike
            else []
        )
    (root / "labels").mkdir()
    (root / "labels" / "combined_windows.json").write_text(json.dumps(labels))


def test_eval_nab_runs_scores_writes_and_rescores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _corpus(tmp_path / "nab")
    out = tmp_path / "results"
    assert main(["eval", "nab", str(tmp_path / "nab"), "--json", "--out", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["per_file"]) == {"cat/one.csv", "cat/two.csv"}
    assert result["score_standard"] > 50  # the one level shift is found early in its window
    assert "baseline_windowed_gaussian" in result
    assert (out / "fleetloop" / "cat" / "fleetloop_one.csv").is_file()
    assert main(["eval", "nab", str(tmp_path / "nab"), "--score-only", str(out), "--json"]) == 0
    rescored = json.loads(capsys.readouterr().out)["fleetloop"]
    assert rescored["per_file"] == result["per_file"]
    assert rescored["score_standard"] == result["score_standard"]


def test_leaving_out_the_only_category_is_refused(tmp_path: Path) -> None:
    # one category leaves none to choose a threshold on: any score would be an artefact
    # (a one-category corpus once scored the windowed Gaussian -726 and ours 0)
    _corpus(tmp_path / "nab")
    with pytest.raises(SystemExit, match=r"two or more; this corpus has \['cat'\]"):
        main(["eval", "nab", str(tmp_path / "nab"), "--loco"])


def test_leave_one_category_out_chooses_on_the_others_and_scores_the_held_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _corpus(tmp_path / "nab")
    other = tmp_path / "nab" / "data" / "dog"
    other.mkdir()
    (other / "three.csv").write_text((tmp_path / "nab" / "data" / "cat" / "one.csv").read_text())
    labels_path = tmp_path / "nab" / "labels" / "combined_windows.json"
    labels = json.loads(labels_path.read_text())
    labels["dog/three.csv"] = labels["cat/one.csv"]
    labels_path.write_text(json.dumps(labels))
    assert main(["eval", "nab", str(tmp_path / "nab"), "--json", "--loco"]) == 0
    loco = json.loads(capsys.readouterr().out)["leave_one_category_out"]
    assert set(loco) == {"cat", "dog"}
    for held in loco.values():
        assert held["windows"] == 1
        assert held["chosen"]["settings"] in LOCO_GRID
        # the same shift in both categories: what one chooses finds the other's
        assert held["defaults"]["score"] > 50 and held["chosen"]["score"] > 50
        assert "score" in held["baseline"]


def test_eval_nab_names_what_is_missing(tmp_path: Path) -> None:
    # the command's own message, not a traceback
    with pytest.raises(SystemExit, match=r"eval nab: .*combined_windows"):
        main(["eval", "nab", str(tmp_path)])


def test_score_by_threshold_matches_a_hand_worked_table() -> None:
    """Two windows (A, B) and two points outside them, with fn weighing 5: the best detection
    of a window replaces its miss, and a lower threshold brings in more rows."""
    profile = CostProfile(tp=1.0, fp=0.11, fn=5.0)
    f = SweptFile(
        "t",
        scores=(0.0, 0.2, 0.3, 0.5, 0.5),
        worth=(-3.0, 20.0, 10.0, 5.0, -3.0),
        window=(-1, 0, 0, 1, -1),
        windows=2,
    )
    table = {1.1: -2 * 5.0, 0.5: 5 - 3 - 5.0, 0.3: 5 - 3 + 10, 0.2: 5 - 3 + 20, 0.0: 5 - 3 + 20 - 3}
    for threshold, expected in table.items():
        assert file_score(f, threshold, profile) == pytest.approx(expected), threshold
    threshold, raw = best_threshold([f], profile)
    assert threshold == 0.2
    assert raw == pytest.approx(22.0)


def test_every_row_in_a_window_is_worth_something_and_every_other_row_costs() -> None:
    n = 100
    t = _times(n)
    f = sweep("e", t, [1.0] * n, [(t[30], t[39]), (t[75], t[95])], STANDARD)
    assert len(f.scores) == n - 15  # probation: 15% of 100 rows
    assert sum(1 for w in f.window if w >= 0) == 10 + 21
    assert all((v > 0) == (w >= 0) for v, w in zip(f.worth, f.window, strict=True))

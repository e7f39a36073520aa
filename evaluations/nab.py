"""`fleetloop eval nab`: the online stream scorer on a NAB-layout corpus, scored as NAB does.

A corpus directory holds ``data/<category>/<name>.csv`` (``timestamp,value``)
and ``labels/combined_windows.json``. Each file is streamed through a fresh
:class:`~models.univariate.StreamScorer` (every score sees only the past).
``--score-only RESULTS`` instead scores detector outputs already in NAB's
results layout (``<detector>/<category>/<detector>_<name>.csv`` with an
``anomaly_score`` column), one corpus score per detector.

``--loco`` validates leaving one category out: for each category, the
settings in :data:`LOCO_GRID` and the threshold are chosen on the other
categories alone, and the held-out category is scored with them. A category
with no windows (``artificialNoAnomaly``) has no normalised score; its raw score
is what its false positives cost.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from evaluations.nab_scoring import (
    STANDARD,
    SweptFile,
    best_threshold,
    file_score,
    normalised,
    sweep,
)
from models.univariate import StreamScorer, StreamScorerConfig, WindowedGaussian, neighbours


@dataclass(frozen=True, slots=True)
class Series:
    name: str  # "<category>/<file>.csv", as the labels name it
    timestamps: list[datetime]
    values: list[float]
    scores: list[float] | None = None


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.strip())


def read_corpus(root: Path) -> tuple[list[Series], dict[str, list[tuple[datetime, datetime]]]]:
    """The corpus's series and their labelled windows; errors name the file."""
    labels_path = root / "labels" / "combined_windows.json"
    if not labels_path.is_file():
        raise FileNotFoundError(f"{root}: no labels/combined_windows.json (is it NAB layout?)")
    raw_labels: dict[str, list[list[str]]] = json.loads(labels_path.read_text())
    windows = {k: [(_when(a), _when(b)) for a, b in v] for k, v in raw_labels.items()}
    series = []
    for path in sorted((root / "data").glob("*/*.csv")):
        name = f"{path.parent.name}/{path.name}"
        timestamps, values = [], []
        with path.open(newline="") as f:
            for line, row in enumerate(csv.DictReader(f), start=2):
                try:
                    timestamps.append(_when(row["timestamp"]))
                    values.append(float(row["value"]))
                except (KeyError, ValueError) as exc:
                    raise ValueError(f"{path}:{line}: {exc}") from None
        series.append(Series(name, timestamps, values))
    if not series:
        raise FileNotFoundError(f"{root}: no data/<category>/*.csv files")
    return series, windows


def read_results(results: Path, detector: str, corpus: list[Series]) -> list[Series]:
    """One detector's published scores for every file of ``corpus``."""
    out = []
    for s in corpus:
        category, file = s.name.split("/")
        path = results / detector / category / f"{detector}_{file}"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing ({detector} has no result for {s.name})")
        timestamps, scores = [], []
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                timestamps.append(_when(row["timestamp"]))
                scores.append(float(row["anomaly_score"]))
        out.append(Series(s.name, timestamps, s.values[: len(scores)], scores))
    return out


DETECTORS = {"fleetloop": StreamScorer, "windowed_gaussian": WindowedGaussian}


def run_detector(
    corpus: list[Series], detector: str = "fleetloop", config: StreamScorerConfig | None = None
) -> list[Series]:
    """Stream every series through a fresh ``detector`` (ours with ``config``, if given):
    each value scored against the past, then learned."""
    out = []
    for series in corpus:
        scorer = StreamScorer(config) if config is not None else DETECTORS[detector]()
        scores = []
        for at, value in zip(series.timestamps, series.values, strict=True):
            scores.append(scorer.score_one(value, at))
            scorer.learn_one(value, at)
        out.append(Series(series.name, series.timestamps, series.values, scores))
    return out


def write_results(scored: list[Series], out: Path, detector: str) -> None:
    """NAB's results layout, so NAB itself (or ``--score-only``) can score them."""
    for s in scored:
        category, file = s.name.split("/")
        path = out / detector / category / f"{detector}_{file}"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["timestamp", "value", "anomaly_score"])
            for t, v, a in zip(s.timestamps, s.values, s.scores or [], strict=True):
                w.writerow([t.isoformat(sep=" "), v, f"{a:.6f}"])


# the settings leave-one-category-out chooses among (models.univariate.neighbours)
LOCO_GRID: dict[str, StreamScorerConfig] = neighbours()


def _category(name: str) -> str:
    return name.split("/", 1)[0]


def _held_out(files: list[SweptFile], held: str, threshold: float) -> tuple[float, float | None]:
    """(raw, normalised or None when it has no windows) of ``held`` at ``threshold``."""
    test = [f for f in files if _category(f.name) == held]
    raw = sum(file_score(f, threshold, STANDARD) for f in test)
    has_windows = any(f.windows for f in test)
    return round(raw, 4), round(normalised(raw, test, STANDARD), 2) if has_windows else None


def _others(files: list[SweptFile], held: str) -> tuple[float, float]:
    """(best threshold, normalised score) on every category but ``held``."""
    train = [f for f in files if _category(f.name) != held]
    threshold, raw = best_threshold(train, STANDARD)
    return threshold, normalised(raw, train, STANDARD)


def loco_categories(corpus: list[Series]) -> list[str]:
    """The corpus's categories, each to be left out in turn. Raises ``ValueError`` on
    fewer than two: no other category to choose a threshold on, so every score would be
    an artefact."""
    categories = sorted({_category(s.name) for s in corpus})
    if len(categories) < 2:
        raise ValueError(
            f"leaving one category out needs two or more; this corpus has {categories}"
        )
    return categories


def leave_one_category_out(
    corpus: list[Series],
    windows: dict[str, list[tuple[datetime, datetime]]],
    grid: dict[str, StreamScorerConfig] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per held-out category, each scored with a threshold chosen on the other categories:
    the settings of ``grid`` best on the others (``chosen``), the defaults as shipped
    (``defaults``) and the windowed-Gaussian baseline (``baseline``)."""
    categories = loco_categories(corpus)
    grid = grid or LOCO_GRID
    runs = {
        name: _swept(run_detector(corpus, config=config), windows) for name, config in grid.items()
    }
    baseline = _swept(run_detector(corpus, "windowed_gaussian"), windows)
    out = {}
    for held in categories:
        ranked = sorted(((_others(files, held), name) for name, files in runs.items()),
                        key=lambda r: -r[0][1])  # fmt: skip
        (threshold, others), name = ranked[0]
        row: dict[str, Any] = {
            "windows": sum(f.windows for f in runs[name] if _category(f.name) == held)
        }
        row["chosen"] = {"settings": name, "score_others": round(others, 2)}
        row["chosen"]["raw"], row["chosen"]["score"] = _held_out(runs[name], held, threshold)
        for label, files in (("defaults", runs.get("defaults")), ("baseline", baseline)):
            if files is not None:
                threshold, _ = _others(files, held)
                raw, score = _held_out(files, held, threshold)
                row[label] = {"raw": raw, "score": score}
        out[held] = row
    return out


def format_loco(result: dict[str, dict[str, Any]]) -> str:
    def cell(scored: dict[str, Any]) -> str:
        raw, score = scored["raw"], scored["score"]
        return f"{raw:.2f} raw" if score is None else f"{score:.2f}"

    lines = [
        "leave one category out: each held-out category scored with a threshold chosen on the"
        " others",
        "",
        f"{'held-out category':<24}{'windows':>8}  {'chosen on the others':<22}{'chosen':>11}"
        f"{'defaults':>11}{'w. Gaussian':>13}",
    ]
    for held, r in result.items():
        lines.append(
            f"{held:<24}{r['windows']:>8}  {r['chosen']['settings']:<22}{cell(r['chosen']):>11}"
            f"{cell(r['defaults']):>11}{cell(r['baseline']):>13}"
        )
    return "\n".join(lines)


def _swept(
    scored: list[Series], windows: dict[str, list[tuple[datetime, datetime]]]
) -> list[SweptFile]:
    """Each scored file's rows, worth and windows under the standard profile."""
    return [
        sweep(s.name, s.timestamps, s.scores or [], windows.get(s.name, []), STANDARD)
        for s in scored
    ]


def score_corpus(
    scored: list[Series], windows: dict[str, list[tuple[datetime, datetime]]]
) -> dict[str, Any]:
    files = _swept(scored, windows)
    threshold, raw = best_threshold(files, STANDARD)
    return {
        "score_standard": round(normalised(raw, files, STANDARD), 2),
        "threshold": threshold,
        "raw_standard": round(raw, 4),
        "windows": sum(f.windows for f in files),
        "per_file": {f.name: round(file_score(f, threshold, STANDARD), 4) for f in files},
    }


def format_nab(title: str, result: dict[str, Any]) -> str:
    lines = [title, "", f"{'file':<60}{'raw score':>10}"]
    lines += [f"{name:<60}{value:>10.3f}" for name, value in result["per_file"].items()]
    lines += [
        "",
        f"windows: {result['windows']}; threshold: {result['threshold']:.6g}; "
        f"raw: {result['raw_standard']}",
        f"NAB standard score (0 null, 100 perfect): {result['score_standard']}",
        "published on the full NAB corpus: Numenta HTM 70.1, CAD OSE 69.9, windowed Gaussian 39.6",
    ]
    return "\n".join(lines)

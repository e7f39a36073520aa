"""`fleetloop eval nab`: the online stream scorer on a NAB-layout corpus, scored as NAB does.

A corpus directory holds ``data/<category>/<name>.csv`` (``timestamp,value``)
and ``labels/combined_windows.json``. Each file is streamed through a fresh
:class:`~models.univariate.StreamScorer` (every score sees only the past).
``--score-only RESULTS`` instead scores detector outputs already in NAB's
results layout (``<detector>/<category>/<detector>_<name>.csv`` with an
``anomaly_score`` column), one corpus score per detector.
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
from models.univariate import StreamScorer, WindowedGaussian


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


def run_detector(corpus: list[Series], detector: str = "fleetloop") -> list[Series]:
    """Stream every series through a fresh ``detector``: each value scored against the
    past, then learned."""
    out = []
    for series in corpus:
        scorer = DETECTORS[detector]()
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


def score_corpus(
    scored: list[Series], windows: dict[str, list[tuple[datetime, datetime]]]
) -> dict[str, Any]:
    files: list[SweptFile] = [
        sweep(s.name, s.timestamps, s.scores or [], windows.get(s.name, []), STANDARD)
        for s in scored
    ]
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

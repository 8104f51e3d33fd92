"""Loaders for the seven STS benchmarks in their original layout (a bad file raises an error naming
file and line), and the unlabeled fit corpora of the calibrations (`fit_corpus_sentences`)."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from flowcore._lines import iter_lines, read_lines

__all__ = ["BadRecord", "DATASETS", "DATA_ENV", "STSDataError", "STSPairs", "checked_score", "checked_sentence",
           "default_data_dir", "fit_corpus_sentences", "load_split", "load_test", "read_sentence_file",
           "semeval_pairs", "splits"]

DATASETS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R")

_SEMEVAL_SUBSETS = {
    "STS12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "STS13": ("FNWN", "headlines", "OnWN"),
    "STS14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "STS15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "STS16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}
_STSB_FILES = {"train": "sts-train.csv", "dev": "sts-dev.csv", "test": "sts-test.csv"}
_SICK_FILES = {"train": "SICK_train.txt", "trial": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}

DATA_ENV = "FLOWCORE_DATA"


class STSDataError(ValueError):
    """A missing or malformed benchmark file; the message names the file and line."""


@dataclass(frozen=True)
class STSPairs:
    """Scored sentence pairs of one dataset split; `subsets[i]` names the subset of pair i; pairs of
    your own file also have its `source` and `skipped_lines`."""

    dataset: str
    split: str
    sentences1: list[str]
    sentences2: list[str]
    scores: np.ndarray
    subsets: list[str]
    source: str | None = None
    skipped_lines: int = 0

    @classmethod
    def from_rows(cls, dataset: str, split: str, rows, **extra) -> "STSPairs":
        """Pairs from (sentence1, sentence2, score, subset) rows; `extra`: `source`, `skipped_lines`."""
        rows = list(rows)
        return cls(dataset, split, [row[0] for row in rows], [row[1] for row in rows],
                   np.asarray([row[2] for row in rows], dtype=np.float64), [row[3] for row in rows], **extra)

    def __len__(self) -> int:
        return len(self.scores)

    def sentences(self) -> list[str]:
        """Both sides of every pair (with repeats), the unlabeled corpus of this split."""
        return self.sentences1 + self.sentences2


def default_data_dir() -> Path:
    """The STS data folder from $FLOWCORE_DATA; an error if it is not set."""
    value = os.environ.get(DATA_ENV)
    if not value:
        raise STSDataError(f"no STS data folder given: pass --data-dir or set {DATA_ENV}")
    return Path(value)


def splits(dataset: str) -> tuple[str, ...]:
    """The splits a dataset is distributed with (STS12–16 have only a test split)."""
    if dataset not in DATASETS:
        raise STSDataError(f"unknown dataset {dataset!r}: choose from {', '.join(DATASETS)}")
    return tuple({"STS-B": _STSB_FILES, "SICK-R": _SICK_FILES}.get(dataset, ("test",)))


def load_split(data_dir: str | os.PathLike, dataset: str, split: str = "test") -> STSPairs:
    """Load the scored pairs of `dataset`'s `split` from `data_dir`."""
    if split not in splits(dataset):
        raise STSDataError(f"{dataset} has no {split!r} split (it has: {', '.join(splits(dataset))})")
    root = Path(data_dir)
    if not root.is_dir():
        raise STSDataError(f"STS data folder not found: {root}")
    if dataset == "STS-B":
        return _load_stsb(root / "STSBenchmark" / _STSB_FILES[split], split)
    if dataset == "SICK-R":
        return _load_sick(root / "SICK" / _SICK_FILES[split], split)
    return _load_semeval(root / f"{dataset}-en-test", dataset)


def load_test(data_dir: str | os.PathLike, dataset: str, sick_split: str = "test") -> STSPairs:
    """The test split, or for SICK-R with `sick_split="all"` all 9927 pairs (MTEB's protocol)."""
    if dataset == "SICK-R" and sick_split == "all":
        parts = [load_split(data_dir, dataset, split) for split in splits(dataset)]
        return STSPairs.from_rows(dataset, "all", (row for part in parts for row in zip(
            part.sentences1, part.sentences2, part.scores, part.subsets)))
    if sick_split not in ("test", "all"):
        raise STSDataError(f"unknown SICK split {sick_split!r}: choose 'test' or 'all'")
    return load_split(data_dir, dataset, "test")


def read_sentence_file(path: str | os.PathLike) -> list[str]:
    """One sentence per line (blank lines skipped), e.g. an NLI corpus used as fit corpus."""
    sentences = [line.strip() for line in read_lines(path, error=STSDataError) if line.strip()]
    if not sentences:
        raise STSDataError(f"{path}: no sentences (expected one sentence per line)")
    return sentences


def fit_corpus_sentences(data_dir, dataset: str, fit_corpus: str) -> tuple[str, list[str]]:
    """The unlabeled sentences a calibration is fitted on, and a label saying what they are: `target`,
    every sentence of the dataset (the paper's); `train`, its train split (else target); else a sentence file."""
    if fit_corpus == "target":
        return "target", [s for split in splits(dataset) for s in load_split(data_dir, dataset, split).sentences()]
    if fit_corpus == "train":
        if "train" in splits(dataset):
            return "train", load_split(data_dir, dataset, "train").sentences()
        _, sentences = fit_corpus_sentences(data_dir, dataset, "target")
        return "train (no train split: target)", sentences
    return str(fit_corpus), read_sentence_file(fit_corpus)


class BadRecord(ValueError):
    """One bad record's problem; the loaders add its file and line."""


def checked_score(value, label: str = "score", column: str = "") -> float:
    """`value` (text or a number) as a finite float, else `BadRecord` naming `label` and `column`."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise BadRecord(f"{label}{column} is {json.dumps(value)}, not a number")
    try:
        score = float(value)
    except ValueError:
        raise BadRecord(f"{label} {value!r}{column} is not a number") from None
    if not math.isfinite(score):
        raise BadRecord(f"{label} {value!r}{column} is not finite")
    return score


def checked_sentence(value, column: str) -> str:
    """`value` if it is non-blank text, else `BadRecord` ("sentence in <column> is empty")."""
    if not isinstance(value, str):
        raise BadRecord(f"sentence in {column} is {type(value).__name__}, not text")
    if not value.strip():
        raise BadRecord(f"sentence in {column} is empty")
    return value


def semeval_pairs(input_path: Path, gold_path: Path,
                  on_bad: Callable[[Path, int, str], None] | None = None) -> Iterator[tuple[str, str, float]]:
    """The scored pairs of one SemEval/SentEval subset: input lines `s1<TAB>s2[<TAB>extra...]` aligned with gold
    lines holding a score or nothing (an unscored pair, skipped). A bad line goes to `on_bad(path, line_number,
    message)` (default: raise `STSDataError`) and is skipped when it returns."""
    for needed in (input_path, gold_path):
        if not needed.is_file():
            raise STSDataError(f"missing file: {needed}")
    inputs, golds = list(iter_lines(input_path)), list(iter_lines(gold_path))
    if len(inputs) != len(golds):
        raise STSDataError(f"{input_path} has {len(inputs)} lines but {gold_path} has {len(golds)}; they must align")
    for line, gold in zip(inputs, golds):
        try:  # `where`: the file of the problem found
            for where, entry in ((input_path, line), (gold_path, gold)):
                if (problem := entry.problem or entry.too_long) is not None:
                    raise BadRecord(problem)
            if not gold.text.strip():
                continue  # an unscored pair
            where, columns = input_path, line.text.split("\t")
            if len(columns) < 2:
                raise BadRecord("expected two tab-separated sentences")
            first, second = (checked_sentence(columns[i], f"column {i + 1}") for i in (0, 1))
            where = gold_path
            score = checked_score(gold.text.strip(), "gold score")
        except BadRecord as bad:
            if on_bad is None:
                raise STSDataError(f"{where}:{line.number}: {bad}") from None
            on_bad(where, line.number, str(bad))
            continue
        yield first, second, score


def _load_semeval(folder: Path, dataset: str) -> STSPairs:
    """STS12–16: each subset's `semeval_pairs`."""
    rows = [(*pair, subset) for subset in _SEMEVAL_SUBSETS[dataset]
            for pair in semeval_pairs(folder / f"STS.input.{subset}.txt", folder / f"STS.gs.{subset}.txt")]
    return STSPairs.from_rows(dataset, "test", rows)


def _load_stsb(path: Path, split: str) -> STSPairs:
    """STS-B: `genre, file, year, id, score, s1, s2[, extra...]`, tab-separated, no quoting."""
    rows = []
    for number, line in enumerate(read_lines(path, error=STSDataError), start=1):
        columns = line.split("\t")
        try:
            if len(columns) < 7:
                raise BadRecord("expected at least 7 tab-separated columns "
                                f"(genre, file, year, id, score, sentence1, sentence2), found {len(columns)}")
            score = checked_score(columns[4], "gold score")
            rows.append((checked_sentence(columns[5], "column 6"), checked_sentence(columns[6], "column 7"), score,
                         columns[0]))
        except BadRecord as bad:
            raise STSDataError(f"{path}:{number}: {bad}") from None
    return STSPairs.from_rows("STS-B", split, rows)


def _load_sick(path: Path, split: str) -> STSPairs:
    """SICK: a header line, then `pair_ID, sentence_A, sentence_B, relatedness_score, ...`."""
    lines = read_lines(path, error=STSDataError)
    if not lines or not lines[0].startswith("pair_ID\tsentence_A\tsentence_B\trelatedness_score"):
        raise STSDataError(f"{path}:1: expected the SICK header "
                           "'pair_ID<TAB>sentence_A<TAB>sentence_B<TAB>relatedness_score...'")
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        columns = line.split("\t")
        try:
            if len(columns) < 4:
                raise BadRecord(f"expected at least 4 tab-separated columns, found {len(columns)}")
            rows.append((checked_sentence(columns[1], "column 2"), checked_sentence(columns[2], "column 3"),
                         checked_score(columns[3], "gold score"), split))
        except BadRecord as bad:
            raise STSDataError(f"{path}:{number}: {bad}") from None
    return STSPairs.from_rows("SICK-R", split, rows)

"""Loaders for the seven STS benchmarks in their original distribution layout.

STS12–16 use the SemEval/SentEval layout (`STS1X-en-test/STS.input.<subset>.txt` with gold in
`STS.gs.<subset>.txt`), STS-B the tab-separated `sts-{train,dev,test}.csv` (read without quote
handling: a `"` is text), SICK-R the `SICK_{train,trial,test_annotated}.txt` files. Every file is
UTF-8, read by `flowcore._lines.read_lines`; a missing or malformed file raises an error naming
the file and the line. Also the unlabeled fit corpora of the calibrations (`fit_corpus_sentences`).
Your own labelled pairs (.tsv/.csv/.jsonl, SentEval files) are read by `flowcore.sts.pairs`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flowcore._lines import read_lines

__all__ = ["DATASETS", "DATA_ENV", "STSDataError", "STSPairs", "concat", "default_data_dir", "fit_corpus_sentences",
           "load_split", "load_test", "read_sentence_file", "splits"]

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
    """Scored sentence pairs of one dataset split; `subsets[i]` names the subset of pair i.
    Pairs read from your own file (`flowcore.sts.pairs`) also have its `source` path and the
    number of bad lines skipped (`skipped_lines`)."""

    dataset: str
    split: str
    sentences1: list[str]
    sentences2: list[str]
    scores: np.ndarray
    subsets: list[str]
    source: str | None = None
    skipped_lines: int = 0

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
    _check_name(dataset)
    if dataset == "STS-B":
        return tuple(_STSB_FILES)
    if dataset == "SICK-R":
        return tuple(_SICK_FILES)
    return ("test",)


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
    """The evaluation pairs: the test split, or for SICK-R with `sick_split="all"` all 9927
    pairs (MTEB's protocol; the paper's is the 4927-pair test set)."""
    if dataset == "SICK-R" and sick_split == "all":
        return concat([load_split(data_dir, dataset, split) for split in splits(dataset)], split="all")
    if sick_split not in ("test", "all"):
        raise STSDataError(f"unknown SICK split {sick_split!r}: choose 'test' or 'all'")
    return load_split(data_dir, dataset, "test")


def concat(parts: list[STSPairs], split: str) -> STSPairs:
    """Several splits of one dataset as one."""
    return STSPairs(
        dataset=parts[0].dataset,
        split=split,
        sentences1=[s for p in parts for s in p.sentences1],
        sentences2=[s for p in parts for s in p.sentences2],
        scores=np.concatenate([p.scores for p in parts]),
        subsets=[s for p in parts for s in p.subsets],
    )


def read_sentence_file(path: str | os.PathLike) -> list[str]:
    """One sentence per line (blank lines skipped), e.g. an NLI corpus used as fit corpus."""
    sentences = [line.strip() for line in read_lines(path, error=STSDataError)]
    sentences = [s for s in sentences if s]
    if not sentences:
        raise STSDataError(f"{path}: no sentences (expected one sentence per line)")
    return sentences


def fit_corpus_sentences(data_dir, dataset: str, fit_corpus: str) -> tuple[str, list[str]]:
    """The unlabeled sentences a calibration is fitted on, and a label saying what they are.

    `target`: every sentence of every split of the dataset (the paper's setting); `train`: the
    train split (datasets without one fall back to target, and the label says so while keeping
    the table row "train"); anything else is a file with one sentence per line.
    """
    if fit_corpus == "target":
        sentences = [s for split in splits(dataset) for s in load_split(data_dir, dataset, split).sentences()]
        return "target", sentences
    if fit_corpus == "train":
        if "train" in splits(dataset):
            return "train", load_split(data_dir, dataset, "train").sentences()
        _, sentences = fit_corpus_sentences(data_dir, dataset, "target")
        return "train (no train split: target)", sentences
    return str(fit_corpus), read_sentence_file(fit_corpus)


def _check_name(dataset: str) -> None:
    if dataset not in DATASETS:
        raise STSDataError(f"unknown dataset {dataset!r}: choose from {', '.join(DATASETS)}")


def _read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 file (the `flowcore._lines` policy), errors as `STSDataError` naming file and line."""
    return read_lines(path, error=STSDataError)


def _score(text: str, path: Path, line_number: int) -> float:
    try:
        value = float(text)
    except ValueError:
        raise STSDataError(f"{path}:{line_number}: gold score {text!r} is not a number") from None
    if not np.isfinite(value):
        raise STSDataError(f"{path}:{line_number}: gold score {text!r} is not finite")
    return value


def _sentence(text: str, path: Path, line_number: int, column: int) -> str:
    if not text.strip():
        raise STSDataError(f"{path}:{line_number}: sentence in column {column} is empty")
    return text


def _load_semeval(folder: Path, dataset: str) -> STSPairs:
    """STS12–16: input lines `s1<TAB>s2[<TAB>extra...]`, gold lines a score or empty (unscored)."""
    sentences1, sentences2, scores, subsets = [], [], [], []
    for subset in _SEMEVAL_SUBSETS[dataset]:
        input_path = folder / f"STS.input.{subset}.txt"
        gold_path = folder / f"STS.gs.{subset}.txt"
        inputs, golds = _read_lines(input_path), _read_lines(gold_path)
        if len(inputs) != len(golds):
            raise STSDataError(
                f"{input_path} has {len(inputs)} lines but {gold_path} has {len(golds)}; they must align"
            )
        for number, (line, gold) in enumerate(zip(inputs, golds), start=1):
            if not gold.strip():
                continue
            columns = line.split("\t")
            if len(columns) < 2:
                raise STSDataError(f"{input_path}:{number}: expected two tab-separated sentences")
            sentences1.append(_sentence(columns[0], input_path, number, 1))
            sentences2.append(_sentence(columns[1], input_path, number, 2))
            scores.append(_score(gold.strip(), gold_path, number))
            subsets.append(subset)
    return STSPairs(dataset, "test", sentences1, sentences2, np.asarray(scores), subsets)


def _load_stsb(path: Path, split: str) -> STSPairs:
    """STS-B: `genre, file, year, id, score, s1, s2[, extra...]`, tab-separated, no quoting."""
    sentences1, sentences2, scores, subsets = [], [], [], []
    for number, line in enumerate(_read_lines(path), start=1):
        columns = line.split("\t")
        if len(columns) < 7:
            raise STSDataError(
                f"{path}:{number}: expected at least 7 tab-separated columns "
                f"(genre, file, year, id, score, sentence1, sentence2), found {len(columns)}"
            )
        scores.append(_score(columns[4], path, number))
        sentences1.append(_sentence(columns[5], path, number, 6))
        sentences2.append(_sentence(columns[6], path, number, 7))
        subsets.append(columns[0])
    return STSPairs("STS-B", split, sentences1, sentences2, np.asarray(scores), subsets)


def _load_sick(path: Path, split: str) -> STSPairs:
    """SICK: a header line, then `pair_ID, sentence_A, sentence_B, relatedness_score, ...`."""
    lines = _read_lines(path)
    if not lines or not lines[0].startswith("pair_ID\tsentence_A\tsentence_B\trelatedness_score"):
        raise STSDataError(f"{path}:1: expected the SICK header "
                           "'pair_ID<TAB>sentence_A<TAB>sentence_B<TAB>relatedness_score...'")
    sentences1, sentences2, scores = [], [], []
    for number, line in enumerate(lines[1:], start=2):
        columns = line.split("\t")
        if len(columns) < 4:
            raise STSDataError(f"{path}:{number}: expected at least 4 tab-separated columns, found {len(columns)}")
        sentences1.append(_sentence(columns[1], path, number, 2))
        sentences2.append(_sentence(columns[2], path, number, 3))
        scores.append(_score(columns[3], path, number))
    return STSPairs("SICK-R", split, sentences1, sentences2, np.asarray(scores), [split] * len(scores))

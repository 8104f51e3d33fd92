"""The one parser of JSON that flowcore did not write itself (jsonl rows, pairs files, calibrator file
headers): every problem is a `JSONProblem` in words, never another exception type, so that a reader can
reject the row or name the file. Refused besides broken syntax: an integer beyond Python's digit limit,
nesting too deep for the parser, and a key given twice (JSON readers disagree on which value counts)."""
from __future__ import annotations

import json
import sys

__all__ = ["JSONProblem", "parse_json"]


class JSONProblem(ValueError):
    """Why a text is not usable JSON, in words (e.g. "duplicate key 'text'"); `duplicate`: the problem is a
    key given twice in an object (the text is otherwise JSON)."""

    def __init__(self, message: str, duplicate: bool = False):
        super().__init__(message)
        self.duplicate = duplicate


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    record = dict(pairs)
    if len(record) != len(pairs):
        seen = set()
        repeated = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise JSONProblem(f"duplicate key {repeated!r}", duplicate=True)
    return record


def parse_json(text: str | bytes):
    """The value of the JSON `text`, or a `JSONProblem` saying what is wrong with it.

    Example:
        >>> parse_json('{"text": "a", "text": "b"}')
        Traceback (most recent call last):
        flowcore._json.JSONProblem: duplicate key 'text'
    """
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except JSONProblem:
        raise
    except RecursionError:
        raise JSONProblem("broken JSON: nested too deeply") from None
    except ValueError as error:  # a JSONDecodeError, or an integer longer than the interpreter converts
        limit = sys.get_int_max_str_digits()
        raise JSONProblem(f"invalid number: an integer of more than {limit:,} digits" if "digits" in str(error)
                          else f"broken JSON: {error}") from None

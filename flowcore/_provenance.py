"""Which encoder made an array: `Encoder.encode` records its (model, pooling) for the array it returns, and a
calibrator fitted on that array (or a view of it, e.g. `X[:1000]`) records them, so that the CLI later embeds text
the same way. The record lives as long as the array; a copy (`X.astype(...)`, `np.load`) has no known encoder."""
from __future__ import annotations

import threading
import weakref

__all__ = ["made_by", "record"]

_RECORDS: dict[int, tuple[weakref.ref, tuple[str, str]]] = {}
_LOCK = threading.Lock()


def record(array, model: str, pooling: str) -> None:
    """Remember that `model` with `pooling` made `array` (until the array is freed)."""
    key = id(array)

    def forget(_, key=key) -> None:
        with _LOCK:
            _RECORDS.pop(key, None)

    with _LOCK:
        _RECORDS[key] = (weakref.ref(array, forget), (str(model), str(pooling)))


def made_by(array) -> tuple[str, str] | None:
    """(model, pooling) of the encoder that made `array` or the array it is a view of; None when unknown."""
    while array is not None:
        with _LOCK:
            entry = _RECORDS.get(id(array))
        if entry is not None and entry[0]() is array:
            return entry[1]
        array = getattr(array, "base", None)
    return None

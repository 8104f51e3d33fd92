"""A frozen Hugging Face encoder and its pooling as one torch module, token ids in, for export: it runs
the model no deeper than the pooling needs and pools with `flowcore.text.pooling` (the `Encoder`'s math)."""
from __future__ import annotations

import torch
from torch import nn

from flowcore.text.loading import _find_layer_stack, quiet_transformers
from flowcore.text.pooling import Pooling

__all__ = ["PooledEncoder", "PooledTokenStates", "example_inputs", "load_model_for_export"]


def load_model_for_export(source: str, pooling: Pooling) -> tuple[nn.Module, int]:
    """(a fresh float32 copy of the model in `source` cut after the deepest layer the pooling needs, its
    number of transformer layers before the cut); never shared with `Encoder`s, never downloaded."""
    from transformers import AutoModel

    with quiet_transformers():
        model = AutoModel.from_pretrained(source, local_files_only=True, use_safetensors=True)
    if getattr(model, "pooler", None) is not None:
        model.pooler = None  # sentence vectors never use it
    num_layers = int(model.config.num_hidden_layers)
    deepest = max(pooling.hidden_states)
    if deepest < num_layers:  # keep layer `deepest` itself: its input is hidden state `deepest`
        del _find_layer_stack(model, num_layers)[deepest + 1:]
    return model.float().eval().requires_grad_(False), num_layers


def example_inputs(names) -> dict[str, torch.Tensor]:
    """Two rows of token ids (the second padded) under each input name in `names`, to trace an export with."""
    ids = torch.tensor([[2, 3, 4, 5, 6], [2, 3, 4, 0, 0]])
    example = {"input_ids": ids, "attention_mask": (ids > 0).long(), "token_type_ids": torch.zeros_like(ids)}
    return {name: example[name] for name in names}


class PooledEncoder(nn.Module):
    """Token ids -> float32 (batch, dim) sentence vectors, as `Encoder.encode` computes them.

    Args:
        model: a Hugging Face encoder (e.g. from `load_model_for_export`).
        pooling: the bound `Pooling`.
        num_layers: the encoder's number of transformer layers (hidden state `num_layers` is its output).

    Example:
        >>> vectors = PooledEncoder(*load_model_for_export(source, pooling)[:1], pooling, 6)(ids, mask)
    """

    def __init__(self, model: nn.Module, pooling: Pooling, num_layers: int):
        super().__init__()
        self.model, self.pooling, self.num_layers = model, pooling, int(num_layers)

    def states(self, input_ids, attention_mask, token_type_ids=None) -> list[torch.Tensor]:
        """The hidden states the pooling reads, in its order (the last is the model's output)."""
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        wanted = self.pooling.hidden_states
        output = self.model(**{name: value for name, value in inputs.items() if value is not None},
                            output_hidden_states=any(index < self.num_layers for index in wanted), return_dict=True)
        return [output.last_hidden_state if index == self.num_layers else output.hidden_states[index]
                for index in wanted]

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        return self.pooling(self.states(input_ids, attention_mask, token_type_ids), attention_mask)


class PooledTokenStates(PooledEncoder):
    """Token ids -> the float32 (batch, tokens, dim) states the pooling averages (`Pooling.token_states`):
    what a sentence-transformers ONNX graph returns as `last_hidden_state`."""

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        return self.pooling.token_states(self.states(input_ids, attention_mask, token_type_ids))

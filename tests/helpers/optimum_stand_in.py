"""A stand-in for optimum's `optimum.onnxruntime`, which sentence-transformers' `backend="onnx"` imports.
optimum-onnx (0.1) needs transformers < 4.58 and sentence-transformers 6 needs transformers >= 5, so the two
cannot be installed together; this module does what optimum's ORTModelForFeatureExtraction does on the CPU
for an exported folder: load `<folder>/<subfolder>/<file_name>` in an ONNX Runtime session and return its
`last_hidden_state` (optimum returns no other output). Exporting on the fly is not offered."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import torch

ONNX_WEIGHTS_NAME = "model.onnx"


class ORTModelForFeatureExtraction(torch.nn.Module):
    def __init__(self, path: Path, config):
        import onnxruntime

        super().__init__()
        self.config = config
        self.path = path
        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.input_names = [node.name for node in self.session.get_inputs()]

    @classmethod
    def from_pretrained(cls, model_id, config=None, export=False, file_name=ONNX_WEIGHTS_NAME, subfolder="",
                        **_):
        if export:
            raise NotImplementedError("the stand-in loads exported graphs only")
        return cls(Path(model_id) / (subfolder or "") / file_name, config)

    def _save_pretrained(self, save_directory):
        raise NotImplementedError("the stand-in does not save")

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, **_):
        from transformers.modeling_outputs import BaseModelOutput

        given = {"input_ids": input_ids, "attention_mask": attention_mask,
                 "token_type_ids": torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids}
        states = self.session.run(None, {name: given[name].cpu().numpy() for name in self.input_names})[0]
        return BaseModelOutput(last_hidden_state=torch.from_numpy(states))


def install(monkeypatch) -> None:
    """Put the stand-in where `from optimum.onnxruntime import ...` finds it, for one test."""
    package, module = types.ModuleType("optimum"), types.ModuleType("optimum.onnxruntime")
    module.ONNX_WEIGHTS_NAME = ONNX_WEIGHTS_NAME
    for name in ("ORTModelForFeatureExtraction", "ORTModelForCausalLM", "ORTModelForMaskedLM",
                 "ORTModelForSequenceClassification"):
        setattr(module, name, ORTModelForFeatureExtraction)
    package.onnxruntime = module
    monkeypatch.setitem(sys.modules, "optimum", package)
    monkeypatch.setitem(sys.modules, "optimum.onnxruntime", module)

"""The opt-in fast CPU mode of `Encoder` (`quantize="int8"`): the encoder exported to ONNX as one graph returning
every hidden state, its MatMuls (but the feed-forward up-projections) dynamically quantised to int8 per channel
and run by ONNX Runtime, which is more accurate than torch's `quantize_dynamic`."""
from __future__ import annotations

import contextlib
import os
import tempfile
import threading

import torch

from flowcore.extras import require
from flowcore.text.loading import shared
from flowcore.text.pooled_encoder import example_inputs

__all__ = ["QUANTIZE_MODES", "QuantizedModel", "check_quantize", "load_quantized", "quantize_matmuls", "weight_type",
           "widening_matmuls"]

QUANTIZE_MODES = ("int8",)
_FEATURE = "quantize='int8' (--quantize int8)"


def check_quantize(quantize, device: torch.device, dtype) -> str | None:
    """`quantize` checked: None (fp32, any device) or "int8" (CPU only, the model's own float32)."""
    if quantize is None:
        return None
    if quantize not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be None or one of {', '.join(QUANTIZE_MODES)}, got {quantize!r}")
    if device.type != "cpu":
        raise ValueError(f"quantize={quantize!r} is a CPU mode (ONNX Runtime); device {str(device)!r} was asked "
                         "for: drop quantize on CUDA, where bf16/fp16 autocast is the fast path")
    if dtype is not None and dtype != torch.float32:
        raise ValueError(f"quantize={quantize!r} quantises the float32 model; dtype {dtype} cannot be combined with it")
    for module in ("onnxruntime", "onnx", "onnxscript"):
        require(module, _FEATURE, "onnx")
    return quantize


def cpu_flags() -> set[str]:
    """The CPU feature flags Linux reports (/proc/cpuinfo); empty where they cannot be read."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
        for line in handle:
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    return set()


def weight_type(flags: set[str]) -> str:
    """"int8" weights where the CPU has VNNI (u8 x s8 dot products), else "uint8" (no saturation on AVX2)."""
    return "int8" if flags & {"avx512_vnni", "avx_vnni", "amx_int8"} else "uint8"


class QuantizedModel:
    """An int8 ONNX graph of a model returning every hidden state, with a session per thread count."""

    def __init__(self, onnx_model: bytes, input_names: tuple[str, ...], weights: str):
        self._onnx_model = onnx_model
        self.input_names = input_names
        self.weights = weights
        self._sessions: dict[int, object] = {}
        self._lock = threading.Lock()

    def describe(self) -> str:
        """The engine and settings, for a manifest."""
        import onnxruntime

        return (f"onnxruntime=={onnxruntime.__version__} dynamic int8 MatMul, {self.weights} weights per channel "
                f"symmetric, uint8 activations")

    def run(self, inputs: dict, wanted: tuple[int, ...], threads: int) -> list[torch.Tensor]:
        """Hidden states `wanted` (float32 torch tensors) for `inputs` (torch tensors by input name)."""
        feed = {name: inputs[name].numpy() for name in self.input_names}
        states = self._session(threads).run(None, feed)
        return [torch.from_numpy(states[index]) for index in wanted]

    def _session(self, threads: int):
        with self._lock:
            if threads not in self._sessions:
                import onnxruntime

                options = onnxruntime.SessionOptions()
                options.intra_op_num_threads = threads  # the Encoder's fixed count: reproducible output
                options.inter_op_num_threads = 1
                self._sessions[threads] = onnxruntime.InferenceSession(self._onnx_model, options,
                                                                       providers=["CPUExecutionProvider"])
            return self._sessions[threads]


class _HiddenStates(torch.nn.Module):
    """The model's forward returning every hidden state (the last one after any final norm)."""

    def __init__(self, model: torch.nn.Module, num_layers: int):
        super().__init__()
        self.model, self.num_layers = model, num_layers

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        output = self.model(**{name: value for name, value in inputs.items() if value is not None},
                            output_hidden_states=True, return_dict=True)
        return (*output.hidden_states[:self.num_layers], output.last_hidden_state)


@shared
def load_quantized(source: str, input_names: tuple[str, ...], num_layers: int) -> QuantizedModel:
    """The int8 graph of the model in `source`, built once and shared while any Encoder uses it."""
    require("onnx", _FEATURE, "onnx")  # check_quantize has required onnxscript too
    require("onnxruntime.quantization", _FEATURE, "onnx")
    from transformers import AutoModel

    model = AutoModel.from_pretrained(source, local_files_only=True, use_safetensors=True).eval()
    batch, length = torch.export.Dim("batch"), torch.export.Dim("sequence", min=1)
    with tempfile.TemporaryDirectory(prefix="flowcore-int8-") as folder:
        fp32, int8 = os.path.join(folder, "model.onnx"), os.path.join(folder, "model_int8.onnx")
        with torch.no_grad():
            torch.onnx.export(_HiddenStates(model, num_layers).eval(), (), fp32, kwargs=example_inputs(input_names),
                              input_names=list(input_names),
                              dynamic_shapes={name: {0: batch, 1: length} for name in input_names},
                              dynamo=True, external_data=False, verbose=False, report=False)
        weights = quantize_matmuls(fp32, int8)
        with open(int8, "rb") as handle:
            return QuantizedModel(handle.read(), input_names, weights)


def quantize_matmuls(source, target, keep_float: tuple[str, ...] = ()) -> str:
    """Write the ONNX file `source` to `target` with its MatMuls dynamically quantised to int8, weights per channel,
    but `widening_matmuls` and those reading a tensor named with a `keep_float` prefix; returns the weight type."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(source))
    kept = [node.name for node in graph.graph.node
            if node.op_type == "MatMul" and any(name.startswith(keep_float) for name in node.input)]
    weights = weight_type(cpu_flags())
    quantize_dynamic(str(source), str(target), op_types_to_quantize=["MatMul"], per_channel=True,
                     reduce_range=False, nodes_to_exclude=widening_matmuls(graph) + kept,
                     weight_type=QuantType.QUInt8 if weights == "uint8" else QuantType.QInt8,
                     extra_options={"WeightSymmetric": True, "ActivationSymmetric": False})
    return weights


def widening_matmuls(graph_model) -> list[str]:
    """The MatMuls whose weight widens the hidden size (the feed-forward up-projections), kept in float32:
    their input, a LayerNorm output under one scale for the batch, loses the most accuracy."""
    shapes = {tensor.name: tuple(tensor.dims) for tensor in graph_model.graph.initializer}
    return [node.name for node in graph_model.graph.node if node.op_type == "MatMul" and len(
        shapes.get(node.input[1], ())) == 2 and shapes[node.input[1]][0] < shapes[node.input[1]][1]]

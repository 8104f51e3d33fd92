"""Calibrated sentence vectors from a folder written by `flowcore export --format onnx`, with onnxruntime,
tokenizers and numpy only: no torch, no flowcore.

    python deploy_onnx.py onnx-model
"""
import json
import sys

import numpy as np
import onnxruntime
from tokenizers import Tokenizer

folder = sys.argv[1] if len(sys.argv) > 1 else "onnx-model"
sentences = ["A man is playing a guitar.", "A woman is slicing an onion.", "A dog runs in the park."]

tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")  # truncates and pads as flowcore does
model = onnxruntime.InferenceSession(f"{folder}/model.onnx", providers=["CPUExecutionProvider"])
encoded = tokenizer.encode_batch(sentences)
columns = {"input_ids": [e.ids for e in encoded], "attention_mask": [e.attention_mask for e in encoded],
           "token_type_ids": [e.type_ids for e in encoded]}
feed = {node.name: np.array(columns[node.name], dtype=np.int64) for node in model.get_inputs()}
vectors = model.run(["sentence_embedding"], feed)[0]  # float32 (3, output dim)

with open(f"{folder}/flowcore.json", encoding="utf-8") as stream:
    manifest = json.load(stream)
print(f"{vectors.shape[0]} vectors of {vectors.shape[1]} dims, {manifest['calibrator']['method']} calibration")
unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
print("cosine of the first two:", float(unit[0] @ unit[1]))

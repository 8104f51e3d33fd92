"""Tiny random Hugging Face encoders for fast tests, saved like hub model folders."""
from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = "the a cat dog sat on mat ran fast slow big small red blue house tree runs jumps over under".split()
"""The tiny models' word vocabulary (after the special tokens)."""
SENTENCE_WORDS = "a man dog cat runs plays guitar the is on with red blue green big small house car tree".split()
"""The vocabulary of the export tests' tiny BERT: words of STS-like sentences."""


def save_tiny_bert(folder: Path, words: list[str], hidden_size: int, num_layers: int, seed: int = 0) -> str:
    """A random BERT over a small word vocabulary (tokenizer included) in `folder`; returns its path."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(SPECIAL_TOKENS + list(words)) + "\n")
    tokenizer = BertTokenizerFast.from_pretrained(folder, model_max_length=64)
    config = BertConfig(vocab_size=len(words) + len(SPECIAL_TOKENS), hidden_size=hidden_size,
                        num_hidden_layers=num_layers, num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=64)
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


class StandInEncoder:
    """The `Encoder` interface (model_id, pooling, dim, threads, encode) without a model: each sentence's
    vector is a fixed function of its length, `len % 7 + i - 3` in column i."""

    def __init__(self, model: str = "stand-in", pooling: str = "mean", dim: int = 8, threads: int | None = None):
        self.model_id, self.pooling, self.dim, self.threads = model, pooling, dim, threads

    def encode(self, sentences, batch_size=32, show_progress_bar=False):
        import numpy as np

        return np.array([[len(s) % 7 + i - 3 for i in range(self.dim)] for s in sentences],
                        dtype=np.float32)

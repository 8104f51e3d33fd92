"""GPU encoder throughput: flowcore.Encoder vs sentence-transformers' `SentenceTransformer.encode`
on CUDA, the same random BERT of all-MiniLM-L6-v2's shape (hidden 384, 6 layers, 12 heads,
intermediate 1536; built and saved offline, no wheel or download needed), the same 10,000
distinct synthetic sentences (3-60 words, median 11, about STS-B's lengths), the same batch size
(128), mean pooling, no normalisation.

Each library runs as its users run it fastest on a GPU:
- `flowcore`: `Encoder(device="cuda")`, the default: float32 weights, bf16 autocast (fp16 on GPUs
  without bf16), SDPA attention, length-sorted batches with a token budget;
- `flowcore-half-weights`: the same with `dtype=` bf16 (fp16), the weights converted;
- `sentence-transformers`: `SentenceTransformer(folder, device="cuda").bfloat16()` (`.half()` on
  GPUs without bf16), as its efficiency docs advise: half-precision weights, SDPA attention (its
  default), length-sorted batches.

The three are warmed up on every sentence once, then timed in interleaved rounds (the order
reversed every other round, so clock and thermal drift fall on all of them); the group
`encoder-gpu` records each one's median and min seconds and sentences/s. Goal: flowcore's default
>= 1.2x sentence-transformers' sentences/s (the CPU encoder goal, applied on the GPU). Skipped
without CUDA or without sentence-transformers; about 10-20 s of GPU time.

    pytest bench/test_bench_encoder_gpu.py        # FLOWCORE_BENCH_ROUNDS=7 by default
"""
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from flowcore.text.encoder import Encoder  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU benchmarks need CUDA")]

ROUNDS = int(os.environ.get("FLOWCORE_BENCH_ROUNDS", "7"))
SENTENCES = 10_000
BATCH_SIZE = 128
GOAL = 1.2
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _words(count: int) -> list[str]:
    """`count` distinct pronounceable words (two or three consonant-vowel syllables)."""
    syllables = [c + v for c in "bcdfghjklmnprstvz" for v in "aeiou"]
    words = [a + b for a in syllables for b in syllables]
    words += [a + b + c for a in syllables[:20] for b in syllables for c in syllables[:20]]
    return words[:count]


@pytest.fixture(scope="module")
def minilm_sized_bert(tmp_path_factory) -> tuple[str, list[str]]:
    """(folder, vocabulary) of a random BERT shaped like all-MiniLM-L6-v2, saved like a hub model
    folder with a WordPiece tokenizer over 8,000 words (each word one token)."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = tmp_path_factory.mktemp("minilm-sized-bert")
    words = _words(8000)
    (folder / "vocab.txt").write_text("\n".join(SPECIAL_TOKENS + words + ["."]) + "\n")
    tokenizer = BertTokenizerFast.from_pretrained(folder, model_max_length=512)
    config = BertConfig(vocab_size=len(SPECIAL_TOKENS) + len(words) + 1, hidden_size=384, num_hidden_layers=6,
                        num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder), words


def _sentences(words: list[str], count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(np.log(11), 0.5, count)), 3, 60).astype(int)
    return [" ".join(rng.choice(words, size=length)) + "." for length in lengths]


def _interleaved_seconds(encoders: dict, sentences: list[str], rounds: int) -> tuple[dict, dict]:
    """Seconds per encode of every sentence, per label, over `rounds` interleaved rounds, and
    each label's vectors from its last round."""
    seconds = {label: [] for label in encoders}
    vectors = {}
    for round_index in range(rounds):
        for label in list(encoders)[::1 if round_index % 2 == 0 else -1]:
            torch.cuda.synchronize()
            start = time.perf_counter()
            vectors[label] = np.asarray(encoders[label](sentences), dtype=np.float32)
            torch.cuda.synchronize()
            seconds[label].append(time.perf_counter() - start)
    return seconds, vectors


def test_gpu_encode_throughput(record, goal, minilm_sized_bert):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    folder, words = minilm_sized_bert
    half = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    flowcore = Encoder(folder, pooling="mean", device="cuda")
    flowcore_half = Encoder(folder, pooling="mean", device="cuda", dtype=half)
    st_model = sentence_transformers.SentenceTransformer(folder, device="cuda")
    st_model = st_model.bfloat16() if half == torch.bfloat16 else st_model.half()
    assert {parameter.dtype for parameter in st_model.parameters()} == {half}
    assert flowcore.describe()["attention"] == "sdpa"
    encoders = {
        "flowcore": lambda texts: flowcore.encode(texts, batch_size=BATCH_SIZE, show_progress_bar=False),
        "flowcore-half-weights": lambda texts: flowcore_half.encode(texts, batch_size=BATCH_SIZE,
                                                                    show_progress_bar=False),
        "sentence-transformers": lambda texts: st_model.encode(texts, batch_size=BATCH_SIZE,
                                                               show_progress_bar=False),
    }
    sentences = _sentences(words, SENTENCES)
    assert len(set(sentences)) == len(sentences)  # distinct: flowcore's once-per-text encoding saves nothing
    _interleaved_seconds(encoders, sentences, rounds=1)  # warm-up: kernels, cuBLAS plans, the allocator
    seconds, vectors = _interleaved_seconds(encoders, sentences, ROUNDS)

    center = vectors["flowcore"].astype(np.float64).mean(axis=0)
    reference = vectors["flowcore"] - center
    for label, vector in vectors.items():  # the same model, pooling and row order: the same vectors to half precision
        # centered: a random BERT's rows share one large direction (raw cosines between different
        # sentences are ~0.99; centered, < 0.5), so a swapped row or another pooling would fail here
        centered = vector - center
        cosines = (centered * reference).sum(1) / (np.linalg.norm(centered, axis=1) * np.linalg.norm(reference, axis=1))
        assert vector.shape == (SENTENCES, 384) and cosines.min() > 0.98, (label, cosines.min())
    medians = {}
    for label, times in seconds.items():
        medians[label] = record("encoder-gpu", label, median=statistics.median(times),
                                **{f"{label}_min_s": round(min(times), 4),
                                   f"{label}_sentences_per_s": round(SENTENCES / statistics.median(times)),
                                   "sentences": SENTENCES, "batch_size": BATCH_SIZE, "rounds": ROUNDS,
                                   "dtype": str(half).removeprefix("torch."), "gpu": torch.cuda.get_device_name()})
    goal("encoder GPU: flowcore / sentence-transformers (half weights)",
         medians["sentence-transformers"] / medians["flowcore"], GOAL,
         how=f"sentences/s, median of {ROUNDS} interleaved rounds, MiniLM-L6-sized random BERT, "
             f"{SENTENCES} sentences, batch {BATCH_SIZE}; flowcore's bf16 autocast vs sentence-transformers "
             f"{str(half).removeprefix('torch.')} weights")

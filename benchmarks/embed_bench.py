"""Text embeddings served against a plain ONNX Runtime loop over the same model and
tokenizer: texts/s for texts of mixed lengths, one text a request, at 1 and 32 in flight.

    python benchmarks/embed_bench.py [--in-flight 1,32] [--rounds 3] [--texts 256]

The model: a sentence-transformers folder of all-MiniLM-L6-v2's shape (BERT, 384 hidden,
6 layers, random weights, mean pooling, Normalize; built by tests/st_models.py, cached in
build/), with its onnx/model.onnx as the Hub has it, max_seq_length 256. The texts: words
of the folder's vocabulary, 8 to 250 tokens each (uniform), the same in every run.

The limit, in this process: ONNX Runtime's default session (every core) with the folder's
tokenizer and mean pooling in NumPy, over the texts in arrival order: one at a time (for 1
in flight), or in batches of 32 padded to their longest (for 32 in flight; and sorted by
length first, as sentence-transformers' encode does: the better of the two is the limit).
Served: `tensord serve` on a repository holding only that folder (no model.toml), N
clients each sending one text an Embed call, in rounds that alternate with the limit's;
each served vector is checked against the loop's (cosine >= 0.9999). Target: at 32 in
flight the served rate is at least 0.85 of the limit (the median of the rounds' ratios).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import use_venv
from generate_bench import _wait_ready
from machine import write_results
from procs import ProcessGroup, exit_on_signals
from servers import start_tensord

from tensord.eventloop import run
from tensord.processing.pooling import pool
from tensord_client import AsyncClient

REPO = use_venv.REPO
MODEL = "minilm"
MAX_SEQ_LENGTH = 256
TARGET = 0.85
BATCH = 32


def build_folder(cache: Path) -> Path:
    """The MiniLM-shaped folder (built once, kept in build/)."""
    folder = cache / "bert-hub-mean-norm-len256"
    if (folder / "onnx" / "model.onnx").exists():
        return folder
    import sys

    sys.path.insert(0, str(REPO))
    from tests.st_models import build_st_folder

    cache.mkdir(parents=True, exist_ok=True)
    return build_st_folder(cache, "bert", "hub", max_seq_length=MAX_SEQ_LENGTH, size="minilm")


def make_texts(folder: Path, count: int) -> list[str]:
    """`count` texts of 8 to 250 tokens (uniform), of the folder's own words."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    words = [w for w in (folder / "vocab.txt").read_text().split() if w.isalpha() and len(w) > 2]
    rng = random.Random(7)
    texts = []
    for _ in range(count):
        want = rng.randint(8, 250)
        text = " ".join(rng.choices(words, k=want))
        ids = tokenizer.encode(text).ids
        while len(ids) > want and " " in text:
            text = text.rsplit(" ", max(1, (len(ids) - want) // 2))[0]
            ids = tokenizer.encode(text).ids
        texts.append(text)
    return texts


class Loop:
    """The plain loop: tokenizer, ONNX Runtime (default threads), mean pooling."""

    def __init__(self, folder: Path) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_SEQ_LENGTH)
        self.session = ort.InferenceSession(
            str(folder / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"]
        )

    def batch(self, texts: list[str]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(texts)
        longest = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(texts), longest), np.int64)
        mask = np.zeros_like(ids)
        for i, e in enumerate(encodings):
            ids[i, : len(e.ids)] = e.ids
            mask[i, : len(e.ids)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        (hidden,) = self.session.run(["last_hidden_state"], feeds)
        return pool(hidden, mask, ["mean"], True)

    def rate(self, texts: list[str], in_flight: int) -> tuple[float, np.ndarray]:
        """texts/s and the vectors in the texts' order."""
        start = time.perf_counter()
        if in_flight == 1:
            vectors = np.concatenate([self.batch([t]) for t in texts])
            return len(texts) / (time.perf_counter() - start), vectors
        arrival = np.concatenate(
            [self.batch(texts[i : i + BATCH]) for i in range(0, len(texts), BATCH)]
        )
        arrival_s = time.perf_counter() - start
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        start = time.perf_counter()
        parts = [self.batch([texts[j] for j in order[i : i + BATCH]])
                 for i in range(0, len(texts), BATCH)]  # fmt: skip
        sorted_s = time.perf_counter() - start
        del parts
        return len(texts) / min(arrival_s, sorted_s), arrival


async def served_rate(target: str, texts: list[str], in_flight: int) -> tuple[float, np.ndarray]:
    """texts/s with `in_flight` clients each sending one text a call, and the vectors."""
    vectors: list[Any] = [None] * len(texts)
    async with AsyncClient(target, timeout=600, retries=0) as client:
        queue = list(range(len(texts)))[::-1]

        async def worker() -> None:
            while queue:
                i = queue.pop()
                vectors[i] = (await client.embed(MODEL, [texts[i]]))[0]

        await asyncio.gather(*(worker() for _ in range(in_flight)))  # warm-up
        queue = list(range(len(texts)))[::-1]
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        elapsed = time.perf_counter() - start
    return len(texts) / elapsed, np.array(vectors)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--in-flight", default="1,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--model-toml", default="", help="a model.toml for the served folder")
    parser.add_argument("--results-dir", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    exit_on_signals()
    started = datetime.now(UTC)
    folder = build_folder(REPO / "build" / "embed-bench")
    texts = make_texts(folder, args.texts)
    loop = Loop(folder)
    points = []
    with tempfile.TemporaryDirectory() as repo, ProcessGroup() as procs:
        # Hard links: the folder as built, and a model.toml of this run's own.
        shutil.copytree(folder, Path(repo) / MODEL, copy_function=os.link)
        if args.model_toml:
            (Path(repo) / MODEL / "model.toml").write_text(args.model_toml + "\n")
        with tempfile.TemporaryFile("w+") as log:
            server = start_tensord(procs, Path(repo), log)
            run(_wait_ready(server.target))
            for n in (int(s) for s in args.in_flight.split(",")):
                rounds = []
                for r in range(args.rounds):
                    got: dict[str, tuple[float, np.ndarray]] = {}
                    for side in ("served", "loop") if r % 2 == 0 else ("loop", "served"):
                        got[side] = (
                            run(served_rate(server.target, texts, n))
                            if side == "served"
                            else loop.rate(texts, n)
                        )
                    a, b = got["served"][1], got["loop"][1]
                    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
                    assert cos.min() >= 0.9999, cos.min()
                    rates = {k: v[0] for k, v in got.items()}
                    rounds.append({**rates, "ratio": rates["served"] / rates["loop"]})
                    print(f"  {n:>2} in flight, round {r + 1}: served {rates['served']:,.1f}, "
                          f"loop {rates['loop']:,.1f} texts/s", flush=True)  # fmt: skip
                points.append({
                    "in_flight": n, "rounds": rounds,
                    "served": statistics.median(x["served"] for x in rounds),
                    "loop": statistics.median(x["loop"] for x in rounds),
                    "ratio": statistics.median(x["ratio"] for x in rounds),
                })  # fmt: skip
    print("\n| in flight | served texts/s | ONNX Runtime loop texts/s | ratio | target |")
    print("| --- | --- | --- | --- | --- |")
    for p in points:
        goal = f">= {TARGET}" if p["in_flight"] >= BATCH else ""
        print(f"| {p['in_flight']} | {p['served']:,.1f} | {p['loop']:,.1f} | {p['ratio']:.3f} "
              f"| {goal} |")  # fmt: skip
    write_results(REPO, args.results_dir, "embed", started, {"points": points})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

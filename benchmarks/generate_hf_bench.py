"""Generate on real exports: tensord against onnxruntime-genai and the plain loop.

    python benchmarks/generate_hf_bench.py [--model builder|optimum] [--streams 1,16]
                                           [--rounds 5] [--threads 1] [--no-genai]

--model builder (the default): tensord serves onnxruntime-genai's model-builder folder of
the tiny Llama below (KV slots, GroupQueryAttention), against onnxruntime-genai's own greedy
loop, a static batch of N, over the same folder and the same ONNX Runtime release, in the
same run. Modes: genai, together, continuous (as below); ratios are to genai. It also
prints each side's ONNX Runtime time per step (genai: its profiler's model_run events;
tensord: Info's model_seconds / steps) and tensord's own critical path per step (Info's
step_seconds - model_seconds, over steps: scheduling, binding, sampling, bookkeeping).
Targets: ORT time per step <= 1.05x genai's; critical path <= 0.15 ms; end to end >= 0.85x
genai at 16 streams under continuous arrivals, >= 0.8x at 1 stream.

--model optimum: the Optimum export of the same checkpoint (its attention rewritten at load
onto KV slots; `--batch-layout padded|equal_length|single` keeps it on the paged path):

The model is a tiny Llama exported with Optimum exactly as users export theirs
(benchmarks/hf_llama.py: hidden 256, 4 layers, 4 heads, 2 KV heads), served unchanged by
`tensord serve`. Prompts of 32 tokens, 64 new tokens each, greedy, ignore_eos. For each
stream count N, each round measures back to back, on the same cores:

  loop        the plain ONNX Runtime batched greedy loop over the same model.onnx, batch N
              (benchmarks/generate_limit.py), with the daemon's intra-op threads
  loop-cont   the same loop under continuous arrivals (greedy_continuous): N slots whose
              requests end and restart at different steps, pasts right-aligned, each
              newcomer's prompt run alone: the floor of any server over this graph when
              sequences join and leave
  genai       onnxruntime-genai's greedy loop, batch N, on its model builder's export of the
              same checkpoint (its own venv and onnxruntime; benchmarks/genai_loop.py)
  together    tensord, N clients starting their requests at once, batch after batch
  continuous  tensord, N clients each sending its next request as soon as its last ends,
              their first requests cut to 1/N, 2/N, ... of the length, so sequences join
              and leave at different steps as in service; tokens/s over a steady window

from an independent Python gRPC client. Ratios are to the loop, per round, and for
continuous arrivals also to loop-cont (like for like); the median over rounds counts.
Targets on a 2-core host: tensord >= 0.8 of the loop at 16 streams and >= 0.75 at 1. Results go to
benchmarks/results/generate-hf-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import use_venv
from generate_bench import _wait_ready
from generate_limit import greedy_continuous, greedy_with_past, make_session, sample_prompts
from hf_llama import ROOT, genai_llama, optimum_llama
from machine import write_results
from procs import BENCH_DIR, ProcessGroup, exit_on_signals
from servers import start_tensord

from tensord.eventloop import run
from tensord.generate.model.model_dir import read_generator_spec
from tensord.modelconfig.generator import GeneratorConfig
from tensord_client import AsyncClient

REPO = use_venv.REPO
RESULTS_DIR = REPO / "benchmarks" / "results"
MODEL = "llama"
TARGETS = {1: 0.75, 16: 0.8}
MODES = ("loop", "loop-cont", "genai", "together", "continuous")


@dataclass(slots=True)
class Point:
    """One stream count: every round's tokens/s per mode, and the median ratios."""

    streams: int
    rounds: list[dict[str, float]] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    """Median over rounds of mode / loop."""
    tokens_per_s: dict[str, float] = field(default_factory=dict)
    """Median over rounds."""


async def _stream(
    client: AsyncClient, prompt: list[int], new_tokens: int, stamps: list[float]
) -> None:
    """One request; the arrival time of each of its tokens goes into `stamps`."""
    async for chunk in client.generate(
        MODEL, token_ids=prompt, max_tokens=new_tokens, temperature=0, ignore_eos=True
    ):
        now = time.perf_counter()
        stamps.extend([now] * len(chunk.token_ids))


async def _together(target: str, prompts: list[list[int]], new_tokens: int, batches: int) -> float:
    """Tokens/s of `batches` rounds of len(prompts) requests started at once."""
    async with AsyncClient(target, timeout=600) as client:
        stamps: list[float] = []
        start = time.perf_counter()
        for _ in range(batches):
            await asyncio.gather(*(_stream(client, p, new_tokens, stamps) for p in prompts))
        return len(stamps) / (time.perf_counter() - start)


async def _continuous(
    target: str, prompts: list[list[int]], new_tokens: int, window_s: float
) -> float:
    """Tokens/s over a steady window of clients that each send requests back to back,
    staggered by their first request's length."""
    n = len(prompts)
    async with AsyncClient(target, timeout=600) as client:
        stamps: list[float] = []
        staggered = [asyncio.Event() for _ in prompts]
        stop = False

        async def loop(i: int) -> None:
            length = max(1, new_tokens * i // n)
            while not stop:
                await _stream(client, prompts[i], length, stamps)
                staggered[i].set()
                length = new_tokens

        tasks = [asyncio.create_task(loop(i)) for i in range(n)]
        await asyncio.gather(*(e.wait() for e in staggered))
        # Once every client has sent a full-length request, the arrivals are spread.
        await asyncio.sleep(new_tokens / n * 0.002)
        begin = time.perf_counter()
        await asyncio.sleep(window_s)
        end = time.perf_counter()
        stop = True
        await asyncio.gather(*tasks)
    return sum(begin <= t < end for t in stamps) / (end - begin)


def _genai(python: Path, model_dir: Path, batch: int, prompt_len: int, new_tokens: int) -> float:
    """onnxruntime-genai's median tokens/s over three runs (after its warm-up)."""
    out = subprocess.run(
        [str(python), str(BENCH_DIR / "genai_loop.py"), str(model_dir), "--batch", str(batch),
         "--prompt-len", str(prompt_len), "--new-tokens", str(new_tokens)],
        check=True,
        capture_output=True,
        text=True,
    )  # fmt: skip
    return statistics.median(json.loads(line)["tokens_per_s"] for line in out.stdout.splitlines())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", default="1,16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--window-s", type=float, default=3.0, help="continuous window")
    parser.add_argument("--no-genai", action="store_true", help="skip onnxruntime-genai")
    parser.add_argument(
        "--batch-layout",
        choices=("auto", "padded", "equal_length", "single"),
        default="auto",
        help="[generator] batch_layout of the served model (what each layout costs)",
    )
    parser.add_argument("--model", choices=("builder", "optimum"), default="builder")
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads of both sides (0: one per core)"
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds, 1.5 s windows")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    return parser.parse_args(argv)


def _repository(export: Path, where: Path, layout: str = "auto") -> Path:
    """A model repository holding the export unchanged, as `llama` (with a model.toml
    only when a batch layout is forced)."""
    shutil.copytree(export, where / MODEL, ignore=shutil.ignore_patterns(".built"))
    if layout != "auto":
        (where / MODEL / "model.toml").write_text(f'[generator]\nbatch_layout = "{layout}"\n')
    return where


def _render(points: list[Point], modes: list[str]) -> str:
    head = f"{'streams':>7} " + " ".join(f"{m + ' tok/s':>16}" for m in modes)
    lines = [head + "   ratios to the loop"]
    for p in points:
        rates = " ".join(f"{p.tokens_per_s[m]:>16.0f}" for m in modes)
        ratios = ", ".join(f"{m} {v:.2f}" for m, v in p.ratios.items() if m != "loop")
        target = TARGETS.get(p.streams)
        verdict = ""
        if target is not None:
            worst = min(p.ratios["together"], p.ratios["continuous"])
            verdict = " ok" if worst >= target else f" (target {target} of the loop)"
        lines.append(f"{p.streams:>7} {rates}   {ratios}{verdict}")
    lines.append("(medians over the rounds; each ratio is per round, then the median)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_signals()
    if args.model == "builder":
        from builder_bench import run_builder

        return run_builder(args)
    rounds, window = (2, 1.5) if args.quick else (max(1, args.rounds), args.window_s)
    export = optimum_llama()
    spec = read_generator_spec(export)
    threads = GeneratorConfig().intra_op_threads
    session = make_session(spec, threads)
    modes = [m for m in MODES if not (m == "genai" and args.no_genai)]
    genai = None if args.no_genai else genai_llama(threads)
    started = datetime.now(UTC)
    points: list[Point] = []
    counts = [int(s) for s in args.streams.split(",")]
    with (
        tempfile.TemporaryDirectory() as repo_dir,
        ProcessGroup() as procs,
        tempfile.TemporaryFile("w+") as log,
    ):
        repository = _repository(export, Path(repo_dir), args.batch_layout)
        server = start_tensord(procs, repository, log)
        run(_wait_ready(server.target))
        for n in counts:
            prompts = sample_prompts(spec, n, args.prompt_len, seed=n)
            batches = max(2, 1024 // (n * args.new_tokens))
            greedy_with_past(session, spec, prompts, args.new_tokens)  # arenas, page-in
            run(_together(server.target, prompts, args.new_tokens, 1))
            point = Point(n)
            for _ in range(rounds):
                loops = [greedy_with_past(session, spec, prompts, args.new_tokens)
                         for _ in range(batches)]  # fmt: skip
                rates = {"loop": n * args.new_tokens * batches / sum(r.total_s for r in loops)}
                rates["loop-cont"] = greedy_continuous(
                    session, spec, prompts, args.new_tokens, batches * args.new_tokens
                )
                if genai is not None:
                    rates["genai"] = _genai(*genai, n, args.prompt_len, args.new_tokens)
                rates["together"] = run(_together(server.target, prompts, args.new_tokens, batches))
                rates["continuous"] = run(
                    _continuous(server.target, prompts, args.new_tokens, window)
                )
                point.rounds.append(rates)
                print(
                    f"{n} streams: " + ", ".join(f"{m} {rates[m]:.0f}" for m in modes) + " tok/s",
                    flush=True,
                )
            for mode in modes:
                point.tokens_per_s[mode] = statistics.median(r[mode] for r in point.rounds)
                point.ratios[mode] = statistics.median(r[mode] / r["loop"] for r in point.rounds)
            point.ratios["continuous/loop-cont"] = statistics.median(
                r["continuous"] / r["loop-cont"] for r in point.rounds
            )
            points.append(point)
        procs.stop_all()
    print(_render(points, modes))
    write_results(
        REPO,
        args.results_dir,
        "generate-hf",
        started,
        {
            "model": str(ROOT),
            "settings": {
                "streams": counts,
                "rounds": rounds,
                "prompt_len": args.prompt_len,
                "new_tokens": args.new_tokens,
                "window_s": window,
                "intra_op_threads": threads,
                "batch_layout": args.batch_layout,
                "targets": TARGETS,
            },
            "points": [asdict(p) for p in points],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

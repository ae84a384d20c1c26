"""The daemon against another commit of itself: no regression, measured (one process, or
with `--frontends N` both daemons with N frontend processes and an engine).

    python benchmarks/ab_bench.py --base REV [--rounds 9] [--concurrency 1,32] [--duration 3]
        [--streams 1,16] [--requests N] [--only predict|generate] [--frontends N]

Checks REV out into build/ab/<sha> (a detached git worktree, kept for later runs), starts
the daemon of that checkout and of this one side by side on the demo repository, and loads
them in turn with the same load generator: `--rounds` paired rounds per concurrency, the
order alternating within each pair. Prints each one's median requests/s and p50, and the
median of the paired ratios (this checkout / REV): 1.00 means no change, below 1 slower.

Then, by default in addition (`--only predict` leaves it out, `--only generate` runs it
alone), Generate: at each `--streams` count N, N concurrent streams of greedy requests
(generate_bench.py's client: seeded `--prompt-len` token prompts, `--new-tokens` new
tokens each, ignore_eos, back to back; `--requests` per stream and round, by default
generate_bench.py's: at least 3, and enough for 1024 tokens a window) to the demo
`tinylm` of each daemon, after an untimed warm-up window of each; `--rounds` paired rounds,
the order alternating the same way. Prints each one's median tokens/s and inter-token
latency p50, the median of the paired ratios (this / REV), and whether every request's
tokens were the same on both sides (greedy: they should be).
The results go to benchmarks/results/ab-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import use_venv
from generate_bench import MODEL, _streams, _wait_ready, requests_per_stream
from generate_limit import sample_prompts
from machine import write_results
from point import LoadSpec, measure
from procs import ProcessGroup, exit_on_signals
from servers import Server, checkout, checkout_pythonpath, foreign_tensord_note, start_tensord
from stats import percentile

from tensord.eventloop import run
from tensord.generate.model.model_dir import read_generator_spec

REPO = use_venv.REPO


def _p50_ms(seconds: list[float]) -> float | None:
    return percentile(sorted(seconds), 50) * 1e3 if seconds else None


def generate(args: argparse.Namespace, old: Server, new: Server) -> list[dict[str, Any]]:
    """Generate's paired rounds at each stream count, printed as they end."""
    spec = read_generator_spec(args.repository / MODEL)
    for s in (old, new):
        run(_wait_ready(s.target))
    points: list[dict[str, Any]] = []
    for n in (int(c) for c in args.streams.split(",")):
        prompts = sample_prompts(spec, n, args.prompt_len, seed=n)
        per_stream = args.requests or requests_per_stream(n, args.new_tokens)
        # Untimed: ONNX Runtime's arenas grow on the first passes at a new batch size.
        for s in (old, new):
            run(_streams(s.target, prompts, 1, args.new_tokens, True))
        rounds: list[dict[str, dict[str, Any]]] = []
        compared = differ = errors = 0
        for r in range(args.rounds):
            order = (old, new) if r % 2 == 0 else (new, old)
            got = {
                s.name: run(_streams(s.target, prompts, per_stream, args.new_tokens, True))
                for s in order
            }
            rounds.append(
                {name: {"tokens_per_s": w.tokens_per_s, "itl_p50_ms": _p50_ms(w.itl_s),
                        "ttft_p50_ms": _p50_ms(w.ttft_s), "failed": len(w.errors),
                        "first_error": w.errors[0] if w.errors else None}
                 for name, w in got.items()}
            )  # fmt: skip
            base_tokens = dict(got["base"].outputs)
            compared += sum(1 for i, _ in got["this"].outputs if i in base_tokens)
            differ += sum(1 for i, t in got["this"].outputs if base_tokens.get(i, t) != t)
            errors += len(got["base"].errors) + len(got["this"].errors)
            print(f"  {n:>3} streams, round {r + 1}: base {got['base'].tokens_per_s:,.0f}, "
                  f"this {got['this'].tokens_per_s:,.0f} tok/s", flush=True)  # fmt: skip
        ratio = statistics.median(
            x["this"]["tokens_per_s"] / x["base"]["tokens_per_s"] for x in rounds
        )
        points.append({
            "streams": n, "requests_per_stream": per_stream, "rounds": rounds, "ratio": ratio,
            "requests_compared": compared, "requests_differing": differ,
            "failed_requests": errors,
        })  # fmt: skip
    return points


def _generate_table(points: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"Generate (demo {MODEL}, greedy streams):",
        "| streams | base tok/s | this tok/s | base ITL p50 ms | this ITL p50 ms | ratio |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for p in points:
        med = {
            (name, m): statistics.median(x[name][m] or 0 for x in p["rounds"])
            for name in ("base", "this")
            for m in ("tokens_per_s", "itl_p50_ms")
        }
        lines.append(
            f"| {p['streams']} | {med['base', 'tokens_per_s']:,.0f} "
            f"| {med['this', 'tokens_per_s']:,.0f} | {med['base', 'itl_p50_ms']:.2f} "
            f"| {med['this', 'itl_p50_ms']:.2f} | {p['ratio']:.3f} |"
        )
    compared = sum(p["requests_compared"] for p in points)
    differ = sum(p["requests_differing"] for p in points)
    failed = sum(p["failed_requests"] for p in points)
    lines.append(
        f"tokens: {differ} of {compared} requests differ from the base's for the same prompt"
        + (f"; {failed} requests failed" if failed else "")
    )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per window")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument(
        "--only", choices=("predict", "generate"), help="run only Predict or only Generate"
    )
    parser.add_argument("--streams", default="1,16", help="Generate: concurrent stream counts")
    parser.add_argument(
        "--requests", type=int, default=0, help="Generate: requests per stream and round"
    )
    parser.add_argument("--prompt-len", type=int, default=32, help="Generate: prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=64, help="Generate: tokens a request")
    parser.add_argument(
        "--frontends", type=int, default=0, help="frontend processes of both daemons (0: one)"
    )
    parser.add_argument("--repository", type=Path, default=REPO / "build" / "demo-models")
    parser.add_argument("--results-dir", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    base = checkout(args.base)
    started = datetime.now(UTC)
    exit_on_signals()
    if note := foreign_tensord_note():
        print(note, flush=True)
    points: list[dict[str, Any]] = []
    generated: list[dict[str, Any]] = []
    with ProcessGroup() as procs, tempfile.TemporaryDirectory() as logs:
        path = checkout_pythonpath(base)
        old, new = (
            start_tensord(
                procs, args.repository, open(Path(logs) / f"{name}.log", "w+"),  # noqa: SIM115
                "info" if args.frontends else "warning", frontends=args.frontends or None,
                name=name, pythonpath=pythonpath,
            )
            for name, pythonpath in (("base", path), ("this", ""))
        )  # fmt: skip
        time.sleep(1.0)
        for n in (int(c) for c in args.concurrency.split(",") if args.only != "generate"):
            client = "sync" if n == 1 else "aio"
            spec = LoadSpec(n, client, 1, args.warmup, args.duration, 30.0)
            rounds = []
            for r in range(args.rounds):
                order = (old, new) if r % 2 == 0 else (new, old)
                got = {s.name: measure(procs, s, spec, []) for s in order}
                rounds.append(
                    {name: {"rps": g["rps"], "p50_us": g["latency_us"].get("p50")}
                     for name, g in got.items()}
                )  # fmt: skip
                print(f"  {n:>3} in flight, round {r + 1}: base {got['base']['rps']:,.0f}, "
                      f"this {got['this']['rps']:,.0f} req/s", flush=True)  # fmt: skip
            ratio = statistics.median(x["this"]["rps"] / x["base"]["rps"] for x in rounds)
            points.append({"concurrency": n, "rounds": rounds, "ratio": ratio})
        if args.only != "predict":
            generated = generate(args, old, new)
    mode = f"{args.frontends} frontends" if args.frontends else "one process"
    print(f"\nthis checkout against {args.base} ({base.name}), {mode}, medians of {args.rounds} "
          "rounds:")  # fmt: skip
    if points:
        print("| in flight | base req/s | this req/s | base p50 ms | this p50 ms | ratio |")
        print("| --- | --- | --- | --- | --- | --- |")
    for p in points:
        med = {
            k: statistics.median(x[name][m] or 0 for x in p["rounds"])
            for k, name, m in (
                ("b", "base", "rps"), ("t", "this", "rps"),
                ("bl", "base", "p50_us"), ("tl", "this", "p50_us"),
            )
        }  # fmt: skip
        print(f"| {p['concurrency']} | {med['b']:,.0f} | {med['t']:,.0f} | {med['bl'] / 1e3:.3f} "
              f"| {med['tl'] / 1e3:.3f} | {p['ratio']:.3f} |")  # fmt: skip
    if generated:
        print(("\n" if points else "") + "\n".join(_generate_table(generated)))
    write_results(
        REPO,
        args.results_dir,
        "ab",
        started,
        {"base": args.base, "frontends": args.frontends, "points": points, "generate": generated},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

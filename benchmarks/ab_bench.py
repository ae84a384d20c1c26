"""The one-process daemon against another commit of itself: no regression, measured.

    python benchmarks/ab_bench.py --base REV [--rounds 9] [--concurrency 1,32] [--duration 3]

Checks REV out into build/ab/<sha> (a detached git worktree, kept for later runs), starts
the daemon of that checkout and of this one side by side on the demo repository, and loads
them in turn with the same load generator: `--rounds` paired rounds per concurrency, the
order alternating within each pair. Prints each one's median requests/s and p50, and the
median of the paired ratios (this checkout / REV): 1.00 means no change, below 1 slower.
The results go to benchmarks/results/ab-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import use_venv
from machine import write_results
from point import LoadSpec, measure
from procs import ProcessGroup, exit_on_signals
from servers import checkout, checkout_pythonpath, foreign_tensord_note, start_tensord

REPO = use_venv.REPO


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per window")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--repository", type=Path, default=REPO / "build" / "demo-models")
    parser.add_argument("--results-dir", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    base = checkout(args.base)
    started = datetime.now(UTC)
    exit_on_signals()
    if note := foreign_tensord_note():
        print(note, flush=True)
    points: list[dict[str, Any]] = []
    with ProcessGroup() as procs, open(os.devnull, "w") as log:
        path = checkout_pythonpath(base)
        old = start_tensord(procs, args.repository, log, name="base", pythonpath=path)
        new = start_tensord(procs, args.repository, log, name="this")
        time.sleep(1.0)
        for n in (int(c) for c in args.concurrency.split(",")):
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
    print(f"\nthis checkout against {args.base} ({base.name}), medians of {args.rounds} rounds:")
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
    write_results(REPO, args.results_dir, "ab", started, {"base": args.base, "points": points})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

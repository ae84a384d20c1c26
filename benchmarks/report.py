"""The human-readable summary of a results dict: limits, the sweep table, CPU per request."""

from __future__ import annotations

from typing import Any

TARGET_RATIO = 0.7
TARGET_SPREAD = 2.5
"""Batched serving: p99 at most this many times p50 at the target point."""
UNBATCHED_TARGETS = (1, 32)
"""In-flight counts where the unbatched target applies (the foundation issue)."""
BATCHED_TARGETS = (64,)
"""In-flight counts where the batched target applies (the batching issue)."""
# Machine CPU that is not ours, in cores, above which a point is flagged as disturbed.
OTHER_CPU_WARN_CORES = 0.10
# The server not under test should sleep; more than this means it was busy (start-up).
IDLE_SERVER_WARN_CORES = 0.05


def _ms(latency: dict[str, float] | None, key: str) -> str:
    return f"{latency[key] / 1e3:.2f}" if latency else "-"


def spread(latency: dict[str, float] | None) -> float | None:
    """p99 / p50 of a latency summary (None without one)."""
    return latency["p99"] / latency["p50"] if latency and latency["p50"] else None


def _num(value: float | None, fmt: str = ",.0f") -> str:
    return format(value, fmt) if value is not None else "-"


def limits_lines(ort: dict[str, Any], runs: dict[str, Any] | None = None) -> list[str]:
    """The compute limit block: ORT batch 1 (and in parallel), and the big batch."""
    session = ort["session"]
    b1, big, par = ort["batch1"], ort["big_batch"], ort.get("batch1_parallel")
    lines = [
        f"Compute limit: ONNX Runtime in-process, {ort['provider']}, "
        f"intra_op_threads={session['intra_op_threads']} "
        f"inter_op_threads={session['inter_op_threads']} "
        f"allow_spinning={str(session['allow_spinning']).lower()}",
        f"  batch 1,  1 thread : {b1['runs_per_s']:>9,.0f} runs/s      "
        f"p50 {_ms(b1['latency_us'], 'p50')} ms  p99 {_ms(b1['latency_us'], 'p99')} ms",
    ]
    if runs:
        rates = [f"{runs[k]['batch1']['runs_per_s']:,.0f}" for k in ("before", "after")]
        lines.append(
            f"    (before / after the sweep: {' / '.join(rates)} runs/s; the faster counts)"
        )
    if par:
        lines.append(
            f"  batch 1, {par['threads']} threads: {par['runs_per_s']:>9,.0f} runs/s      "
            f"(instance_count={session['instance_count']}: the limit above 1 in flight)"
        )
    for m in ort.get("big_batches") or [big]:
        best = " (the best)" if m is big and len(ort.get("big_batches") or []) > 1 else ""
        lines.append(
            f"  batch {m['batch']}, 1 thread: {m['samples_per_s']:>9,.0f} samples/s   "
            f"({m['runs_per_s']:,.0f} runs/s, p50 {_ms(m['latency_us'], 'p50')} ms){best}"
        )
    lines.append("  each limit takes the faster of the runs before and after the sweep")
    return lines


def sweep_lines(points: list[dict[str, Any]]) -> list[str]:
    """One row per concurrency: echo, tensord, the limit, the ratio, p99/p50."""
    head = (
        f"{'in':>6} | {'echo (transport limit)':^30} | {'tensord':^35} | "
        f"{'limit':>7} | {'ratio':>5} {'>=' + str(TARGET_RATIO):>6}"
    )
    sub = (
        f"{'flight':>6} | {'client':<6} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} | "
        f"{'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'p99/p50':>8} | {'req/s':>7} | "
        f"{'':>5} {'':>6}"
    )
    rows = [head, sub, "-" * len(sub)]
    for p in points:
        echo, td = p["echo"], p["tensord"]
        lat = td["latency_us"]
        client = echo["client"] + (f"x{echo['client_procs']}" if echo["client_procs"] > 1 else "")
        rows.append(
            f"{p['concurrency']:>6} | {client:<6} {echo['rps']:>7,.0f} "
            f"{_ms(echo['latency_us'], 'p50'):>7} {_ms(echo['latency_us'], 'p99'):>7} | "
            f"{td['rps']:>7,.0f} {_ms(lat, 'p50'):>7} {_ms(lat, 'p99'):>7} "
            f"{_num(spread(lat), '.1f'):>8} | {p['limit_rps']:>7,.0f} | "
            f"{p['ratio']:>5.2f} {_verdict(p.get('meets_target')):>6}"
        )
    return rows


def floor_lines(points: list[dict[str, Any]]) -> list[str]:
    """With --floor: the bare grpc.aio server around the same session, against the limit."""
    if not any("floor" in p for p in points):
        return []
    head = (
        f"{'in':>6} | {'floor: bare grpc.aio + thread pool':^35} | "
        f"{'ratio to limit':^16} | {'tensord':>8}"
    )
    sub = (
        f"{'flight':>6} | {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'p99/p50':>8}  | "
        f"{'floor':>7} {'tensord':>8} | {'/ floor':>8}"
    )
    rows = ["", head, sub, "-" * len(sub)]
    for p in points:
        if "floor" not in p:
            continue
        fl, lat = p["floor"], p["floor"]["latency_us"]
        share = p["tensord"]["rps"] / fl["rps"] if fl["rps"] else None
        rows.append(
            f"{p['concurrency']:>6} | {fl['rps']:>7,.0f} {_ms(lat, 'p50'):>7} "
            f"{_ms(lat, 'p99'):>7} {_num(spread(lat), '.1f'):>8}  | "
            f"{p['floor_ratio']:>7.2f} {p['ratio']:>8.2f} | {_num(share, '.2f'):>8}"
        )
    return rows


def _verdict(met: bool | None) -> str:
    return "-" if met is None else ("yes" if met else "NO")


def cpu_lines(points: list[dict[str, Any]]) -> list[str]:
    """Where the two cores went: CPU us per request by process, busy cores, foreign load."""
    head = (
        f"{'in':>6} | {'echo: CPU us/req, busy':^24} | {'tensord: CPU us/req, busy':^25} | "
        f"{'tensord-echo':>12} | {'other load':^16}"
    )
    sub = (
        f"{'flight':>6} | {'server':>7} {'client':>7} {'cores':>6}   | "
        f"{'server':>7} {'client':>7} {'cores':>6}    | {'server us':>12} | "
        f"{'echo':>7} {'tensord':>8}"
    )
    rows = [head, sub, "-" * len(sub)]
    for p in points:
        e, t = p["echo"], p["tensord"]
        ep, tp = e["cpu_per_request"], t["cpu_per_request"]
        extra = (
            tp["server_us"] - ep["server_us"]
            if tp["server_us"] is not None and ep["server_us"] is not None
            else None
        )
        rows.append(
            f"{p['concurrency']:>6} | {_num(ep['server_us']):>7} {_num(ep['client_us']):>7} "
            f"{_busy(e):>6.2f}   | {_num(tp['server_us']):>7} {_num(tp['client_us']):>7} "
            f"{_busy(t):>6.2f}    | {_num(extra):>12} | "
            f"{e['other_cpu_cores']:>7.2f} {t['other_cpu_cores']:>8.2f}"
        )
    return rows


def _busy(measurement: dict[str, Any]) -> float:
    """Machine-wide busy cores during the window (2.00 is a saturated 2-core host)."""
    return float(measurement["cpu_s"]["machine"] / measurement["window_s"])


def warnings(results: dict[str, Any]) -> list[str]:
    """Errors and disturbed points, one line each."""
    out = []
    for p in results["points"]:
        for name in ("echo", "tensord", "floor"):
            if name not in p:
                continue
            m = p[name]
            if m["errors"]:
                out.append(f"{name} @ {p['concurrency']}: errors {m['errors']}")
            idle = m["cpu_s"].get("idle_servers", 0.0) / m["window_s"]
            if idle > IDLE_SERVER_WARN_CORES:
                out.append(
                    f"{name} @ {p['concurrency']}: the idle server used {idle:.2f} cores "
                    "during the window"
                )
            if m["other_cpu_cores"] > OTHER_CPU_WARN_CORES:
                out.append(
                    f"{name} @ {p['concurrency']}: {m['other_cpu_cores']:.2f} cores of other "
                    "load during the window; the point may be off"
                )
    ort_other = results["ort"]["batch1"]["cpu_s"]["other"] / results["ort"]["batch1"]["window_s"]
    if ort_other > OTHER_CPU_WARN_CORES:
        out.append(f"ORT batch 1: {ort_other:.2f} cores of other load; the limit may be off")
    return out


def render(results: dict[str, Any]) -> str:
    """The whole summary printed at the end of a run."""
    s = results["settings"]
    m = results["machine"]
    lines = [
        f"tensord Predict, batch 1, model {s['model']!r}: {s['duration_s']:g} s per point "
        f"after {s['warmup_s']:g} s warm-up; {m['cpu_model']}, {m['usable_cores']} cores",
        *limits_lines(results["ort"], results.get("ort_runs")),
        f"Payload: request {results['payload']['request_bytes']} B, reply "
        f"{results['payload']['reply_bytes_echo']} B (echo) / "
        f"{results['payload']['reply_bytes_tensord']} B (tensord). "
        "limit = 1 / (1/echo + 1/compute): "
        + (
            "compute = ORT samples/s at its best batch (batching on)"
            if s.get("batching")
            else "compute = ORT batch 1 on one thread at 1 in flight, on instance_count "
            "threads above"
        ),
        "",
        *sweep_lines(results["points"]),
        *floor_lines(results["points"]),
        "",
        *cpu_lines(results["points"]),
    ]
    notes = warnings(results)
    if notes:
        lines += ["", "Warnings:", *(f"  {n}" for n in notes)]
    met = [p["concurrency"] for p in results["points"] if p.get("meets_target") is True]
    missed = [p["concurrency"] for p in results["points"] if p.get("meets_target") is False]
    rule = f"ratio >= {TARGET_RATIO}" + (
        f" and p99/p50 <= {TARGET_SPREAD}" if s.get("batching") else ""
    )
    targets = BATCHED_TARGETS if s.get("batching") else UNBATCHED_TARGETS
    lines += [
        "",
        f"targets ({rule}) at {list(targets)} in flight: met at {met or 'none'}; "
        f"missed at {missed or 'none'}",
        f"results: {results['results_file']}",
    ]
    return "\n".join(lines)

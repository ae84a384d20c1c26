"""CPU time from /proc: per process (all threads) and for the whole machine.

The benchmark samples both at the start and end of each measurement window. Per-process
CPU per request shows where the two cores went (client, server); the machine's busy time
minus ours is CPU that something else took, which makes a point unreliable on a shared
2-core host, so it is recorded and warned about.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process (all its threads); 0.0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    # The command name may hold spaces: fields start after the last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / _TICK


@dataclass(frozen=True, slots=True)
class MachineCpu:
    """Cumulative machine-wide CPU seconds, summed over all cores."""

    busy_s: float
    steal_s: float

    @staticmethod
    def read() -> MachineCpu:
        """Read the aggregate `cpu` line of /proc/stat."""
        with open("/proc/stat") as f:
            first = f.readline().split()
        # user nice system idle iowait irq softirq steal ...; idle and iowait are not busy.
        values = [int(v) / _TICK for v in first[1:9]] + [0.0] * 8
        busy = sum(values[i] for i in (0, 1, 2, 5, 6))
        return MachineCpu(busy, values[7])


@dataclass(frozen=True, slots=True)
class CpuSample:
    """One snapshot: machine totals and each watched process's CPU seconds."""

    machine: MachineCpu
    processes: dict[str, float]

    @staticmethod
    def take(pids: Iterable[tuple[str, int]]) -> CpuSample:
        """Snapshot the machine and the named pids (names may repeat: values add up)."""
        processes: dict[str, float] = {}
        for name, pid in pids:
            processes[name] = processes.get(name, 0.0) + process_cpu_s(pid)
        return CpuSample(MachineCpu.read(), processes)


def cpu_between(before: CpuSample, after: CpuSample) -> dict[str, float]:
    """CPU seconds spent between two samples: per watched name, `ours`, `machine`, `other`.

    `other` is machine busy time that none of the watched processes account for: other
    programs, the kernel's own work, and the benchmark's orchestrator (which sleeps).
    """
    spent = {
        name: after.processes[name] - before.processes.get(name, 0.0) for name in after.processes
    }
    ours = sum(spent.values())
    machine = after.machine.busy_s - before.machine.busy_s
    spent["ours"] = ours
    spent["machine"] = machine
    spent["other"] = max(machine - ours, 0.0)
    spent["steal"] = after.machine.steal_s - before.machine.steal_s
    return spent


@dataclass(frozen=True, slots=True)
class ThreadCpu:
    """One thread's cumulative CPU seconds and context switches."""

    name: str
    user_s: float
    system_s: float
    switches: int


def thread_cpu(pid: int) -> dict[int, ThreadCpu]:
    """Every thread of a process by OS thread id (threads that vanish are skipped)."""
    threads: dict[int, ThreadCpu] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return threads
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        switches = sum(
            int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line
        )
        threads[int(tid)] = ThreadCpu(
            name, int(fields[11]) / _TICK, int(fields[12]) / _TICK, switches
        )
    return threads

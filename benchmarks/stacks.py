"""Summaries of py-spy's collapsed stacks (`py-spy record --format raw --threads`).

Each line is `thread (TID): NAME;frame;frame;... COUNT`. Grouped by thread name, the
leaf frames say where CPU was spent (self) and every frame on the stack where it was
spent beneath (inclusive); both are shares of that thread's samples.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

_THREAD = re.compile(r"^thread \((\d+)\): (.*)$")


@dataclass(slots=True)
class ThreadStacks:
    """The samples of one thread (or of all threads of one name)."""

    name: str
    samples: int = 0
    self_counts: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)

    def top(self, counts: Counter[str], n: int) -> list[tuple[str, float]]:
        """The n most frequent frames with their share of this thread's samples."""
        return [(frame, c / self.samples) for frame, c in counts.most_common(n)]


def thread_group(name: str) -> str:
    """Threads of one pool (lane-mlp_0, lane-mlp_1) summed under one name (lane-mlp_*)."""
    return re.sub(r"_\d+$", "_*", name)


def parse(lines: Iterable[str]) -> dict[str, ThreadStacks]:
    """Collapsed stacks grouped by thread group name."""
    groups: dict[str, ThreadStacks] = {}
    for line in lines:
        stack, _, count_text = line.rstrip("\n").rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = stack.split(";")
        match = _THREAD.match(frames[0])
        name = thread_group(match.group(2)) if match else "?"
        body = frames[1:] if match else frames
        group = groups.setdefault(name, ThreadStacks(name))
        count = int(count_text)
        group.samples += count
        if body:
            group.self_counts[body[-1]] += count
        for frame in set(body):
            group.inclusive[frame] += count
    return groups


def render(groups: dict[str, ThreadStacks], n_self: int = 8, n_incl: int = 12) -> list[str]:
    """Text lines: per thread group its samples, top self frames and top inclusive frames."""
    total = sum(g.samples for g in groups.values()) or 1
    lines = []
    for group in sorted(groups.values(), key=lambda g: -g.samples):
        lines.append(f"  {group.name}: {group.samples} samples ({group.samples / total:.0%})")
        for frame, share in group.top(group.self_counts, n_self):
            lines.append(f"    self {share:6.1%}  {frame}")
        inclusive = Counter({f: c for f, c in group.inclusive.items() if "threading.py" not in f})
        for frame, share in group.top(inclusive, n_incl):
            lines.append(f"    incl {share:6.1%}  {frame}")
    return lines

"""Choosing ONNX Runtime execution providers: a priority list, a preferred one, CPU last."""

from __future__ import annotations

from dataclasses import dataclass

from tensord.modelconfig.providers import CPU, PRIORITY


@dataclass(slots=True, frozen=True)
class ProviderPlan:
    """The providers to ask ONNX Runtime for, in order, and why."""

    providers: tuple[str, ...]
    reason: str


def plan_providers(
    available: list[str], preferred: str | None = None, order: list[str] | None = None
) -> ProviderPlan:
    """Filter the order by what this build has, put an available preferred one first."""
    wanted = list(order) if order else list(PRIORITY)
    chosen = [p for p in wanted if p in available]
    if CPU not in chosen:
        chosen.append(CPU)
    if preferred is None:
        reason = f"highest priority available: {chosen[0]}"
    elif preferred in available:
        chosen = [preferred, *(p for p in chosen if p != preferred)]
        reason = f"preferred provider {preferred} is available"
    else:
        reason = (
            f"preferred provider {preferred} is not available in this ONNX Runtime build "
            f"(available: {', '.join(available)}); using {chosen[0]}"
        )
    return ProviderPlan(tuple(chosen), reason)


def explain_actual(plan: ProviderPlan, actual: list[str]) -> str:
    """The reason to report once the session exists, noticing ONNX Runtime's silent fallback."""
    first = actual[0] if actual else CPU
    if first == plan.providers[0]:
        return plan.reason
    return (
        f"{plan.reason}; {plan.providers[0]} failed to start in ONNX Runtime, which fell "
        f"back to {first} (see the ONNX Runtime warnings in the log)"
    )

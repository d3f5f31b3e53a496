"""The printed plan: per component its storage, compute, what trains (and in what dtype), islands, the rule."""

from __future__ import annotations

from typing import Any

from ..recipe.recognise import recipes_planning
from .methods import method_of
from .quantized import base_lines

__all__ = ["plan_table"]


def _unplanned_row(tp: Any, name: str, module: Any) -> tuple[str, ...]:
    """A component the recipe does not plan: left in the dtype it was given, said so with the recipes that plan it."""
    cls = type(module).__name__
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in module.parameters()}) or ["-"]
    params = [p for n, p in tp.named_parameters() if n.startswith(name + ".")]
    trained = f"{sum(p.numel() for p in params):,}" if params else "-"
    others = recipes_planning(name, cls)
    fix = (f"recipe={others[0]!r} plans it" + (f" ({', '.join(others[1:])} too)" if others[1:] else "")
           if others else "no shipped recipe plans it; pin its dtype yourself")
    return (name, tp.kinds.get(name, "frozen"), "/".join(dtypes), "/".join(dtypes), trained, "-",
            f"not in recipe {tp.recipe.name}: {cls} left as it was given; {fix}")


def plan_table(tp: Any) -> str:
    """One line per component, then the objective, the loss scaling and every downgrade with its reason."""
    recipe = tp.recipe
    comps = tp.components
    head = ("component", "train", "storage", "compute", "trainable", "fp32 islands", "rule")
    rows = []
    for plan in recipe.policies:
        if plan.name not in comps:
            continue
        method = method_of(tp.kinds.get(plan.name, "frozen"))
        params = [p for n, p in tp.named_parameters() if n.startswith(plan.name + ".")]
        dtypes = "/".join(sorted({str(p.dtype).removeprefix("torch.") for p in params}))
        trained = f"{sum(p.numel() for p in params):,} {dtypes}" if params else "-"
        label = method.label(tp, plan.name)
        choice = tp.choices.get(plan.name)
        rule = choice.rule if choice else next((f"{d.rule} [{d.source}]" for d in plan.decisions if d.field == "compute"), "")
        islands = ", ".join(tp.applied.islands.get(plan.name, [])) or "-"
        storage = method.storage_text(plan)
        rows.append((plan.name, label, storage, plan.compute, trained, islands, rule))
    rows += [_unplanned_row(tp, name, module) for name, module in comps.items() if name not in recipe]
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head) - 1)]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1]
    scaler = "GradScaler on (fp16 compute)" if tp.scaler is not None else "no loss scaling"
    out = [f"hf_precision training plan: recipe {recipe.name} for {recipe.device.label()}, on {tp.device}; "
           f"objective {tp.objective}; {scaler}; masters {tp.master}; skipped steps {tp.skipped_steps}",
           line(head), *map(line, rows)]
    downgrades = [c.downgrade for c in tp.choices.values() if c.downgrade]
    out += [f"downgrade: {d}" for d in downgrades]
    out += base_lines(tp)
    if tp.objective == "flow" and tp.sigma_range is not None:  # training.experts: Wan 2.2's two experts
        lo, hi = tp.sigma_range
        out.append(f"denoiser: {tp.denoiser_name}, on noise levels sigma in [{lo:g}, {hi:g}) only: the pipeline's "
                   f"boundary_ratio gives the other levels to the other expert (train it in a run of its own)")
    if getattr(tp, "shard", None) is not None:
        out.append(str(tp.shard))
    return "\n".join(out)

"""Tiny pipelines with planted fp16 overflows, for ``hf_precision.diagnose.calibrate`` and its tests.

Each ``plant_*`` function scales the weights of known modules so that an intermediate activation leaves fp16's
range (max 65504) while the module tree around it stays in range: the float32 run is finite and sane, the all-fp16
run is not, and the smallest fp32 island that fixes it is known in advance. The pipelines are the registry's
(:data:`hf_precision.testing.registry.PIPELINES`: ``sd3``, ``wan``, ``sdxl``, ...)::

    >>> import torch
    >>> pipe = plant_fp16_overflow(make_pipeline("wan"), "wan")
    >>> mlp = pipe.transformer.condition_embedder.time_embedder
    >>> x = torch.ones(1, mlp.linear_1.in_features)
    >>> bool(torch.isfinite(mlp(x)).all()), bool(torch.isfinite(mlp.half()(x.half())).all())
    (True, False)
"""

from __future__ import annotations

import math
from typing import Any

from .registry import PIPELINES, make_pipeline

__all__ = ["module_bytes", "plant_fp16_overflow", "plant_overflow", "plant_t5_feed_forward", "plant_time_embedding",
           "plant_vae_up_block"]


def _scale(module, weight: float, bias: float | None = None, fill_bias: float | None = None) -> None:
    import torch

    with torch.no_grad():
        module.weight.mul_(weight)
        if module.bias is not None:
            if fill_bias is not None:
                module.bias.fill_(fill_bias)
            elif bias is not None:
                module.bias.mul_(bias)


def plant_vae_up_block(vae, block: int = 0, resnets: tuple[int, ...] = (0, 1), scale: float = 1e5) -> list[str]:
    """Make ``decoder.up_blocks.<block>.resnets.<i>.conv1`` overflow fp16 (weight and bias times ``scale``); the
    GroupNorm after it (``norm2``) normalises again, so every resnet hands on ordinary values. Returns the planted names.
    """
    names = []
    for i in resnets:
        _scale(vae.decoder.up_blocks[block].resnets[i].conv1, scale, scale)
        names.append(f"decoder.up_blocks.{block}.resnets.{i}.conv1")
    return names


def plant_t5_feed_forward(t5, block: int = 1, scale: float = 1e3) -> list[str]:
    """Make the gated feed-forward of T5 block ``block`` overflow fp16 at the input of its ``wo``: ``wi_0`` and ``wi_1``
    times ``scale`` (each output below 65504) make ``gelu(wi_0(x)) * wi_1(x)`` about ``scale**2`` larger, and ``wo``
    times ``1 / scale**2`` takes it back, so the block's output is unchanged. Returns ``[wo]``.
    """
    ff = t5.encoder.block[block].layer[-1].DenseReluDense
    _scale(ff.wi_0, scale)
    _scale(ff.wi_1, scale)
    _scale(ff.wo, 1.0 / scale**2)
    return [f"encoder.block.{block}.layer.{len(t5.encoder.block[block].layer) - 1}.DenseReluDense.wo"]


def plant_time_embedding(transformer, path: str = "condition_embedder.time_embedder") -> list[str]:
    """Make a time-embedding MLP (``linear_1 -> SiLU -> linear_2``) overflow fp16 between its layers: ``linear_1.weight``
    x1e5 with bias 6.5e4 reaches fp16's maximum, ``linear_2.weight`` x1.5e-5 brings it back (sane in fp32, inf/NaN in
    fp16). Returns ``[path.linear_1]``.
    """
    mlp = transformer.get_submodule(path)
    _scale(mlp.linear_1, 1e5, fill_bias=6.5e4)
    _scale(mlp.linear_2, 1.5e-5)
    return [f"{path}.linear_1"]


def plant_fp16_overflow(pipe, name: str):
    """:func:`plant_time_embedding` on the denoiser of registry pipeline ``name`` (its row's ``time_mlp``), in place;
    returns ``pipe``. Real models overflow in the same place (Wan keeps ``time_embedder`` in fp32:
    ``_keep_in_fp32_modules`` in diffusers' transformer_wan.py)."""
    plant_time_embedding(pipe.transformer, PIPELINES[name].time_mlp)
    return pipe


def module_bytes(module, itemsize: int = 4) -> int:
    """Bytes of a module's floating parameters and buffers at ``itemsize`` bytes per value."""
    return itemsize * sum(t.numel() for t in (*module.parameters(), *module.buffers()) if t.is_floating_point())


# Attention projections whose product or linear map makes a planted scale cancel exactly: q.k^T is unchanged when
# q is scaled by s and k by 1/s; softmax(qk)v is linear in v, so the output projection can divide what v multiplied.
_PARTNERS = (("to_q", "to_k", "k"), ("add_q_proj", "add_k_proj", "k"), ("q_proj", "k_proj", "k"), ("q", "k", "k"),
             ("to_v", "to_out.0", "out"), ("add_v_proj", "to_add_out", "out"), ("v_proj", "out_proj", "out"),
             ("v", "o", "out"))


def _consumers(root, name: str, run) -> tuple[float, list[str]]:
    """Max |output| of ``root.<name>`` in one float32 run, and the weighted leaf modules that read that very tensor (or a
    parameterless module's output of it, an activation).
    """
    import torch

    watched: set[int] = set()
    found: dict[str, None] = {}
    peak = [0.0]
    keep: list[Any] = []  # the watched tensors stay alive, so their ids are not reused

    def flat(tree, depth=0):
        if isinstance(tree, torch.Tensor):
            yield tree
        elif depth < 3 and isinstance(tree, (tuple, list)):
            for x in tree:
                yield from flat(x, depth + 1)
        elif depth < 3 and isinstance(tree, dict):
            for x in tree.values():
                yield from flat(x, depth + 1)

    handles = []
    for n, m in root.named_modules():
        own = bool(m._parameters) and any(p is not None for p in m._parameters.values())
        leaf = not any(True for _ in m.children())

        def pre(mod, args, kwargs, n=n, own=own, leaf=leaf):
            if n != name and own and any(id(t) in watched for t in flat((args, kwargs))):
                found[n] = None

        def post(mod, args, kwargs, out, n=n, own=own, leaf=leaf):
            ts = list(flat(out))
            if n == name:
                peak[0] = max([peak[0], *(float(t.detach().abs().max()) for t in ts if t.numel())])
                watched.update(id(t) for t in ts)
                keep.extend(ts)
            elif leaf and not own and "norm" not in type(mod).__name__.lower() and any(
                    id(t) in watched for t in flat((args, kwargs))):  # an activation hands the scale on, a norm does not
                watched.update(id(t) for t in ts)
                keep.extend(ts)

        handles += [m.register_forward_pre_hook(pre, with_kwargs=True), m.register_forward_hook(post, with_kwargs=True)]
    _run_hooked(run, handles)
    return peak[0], list(found)


def _maxima(root, run) -> tuple[dict[str, float], list[str]]:
    """Max |output| per module with a weight in one float32 run, and the order in which they first finished."""
    import torch

    peaks: dict[str, float] = {}
    handles = []
    for n, m in root.named_modules():
        def post(mod, args, out, n=n):
            ts = [out] if isinstance(out, torch.Tensor) else [t for t in (out if isinstance(out, (tuple, list)) else
                                                                          getattr(out, "values", lambda: [])())
                                                                if isinstance(t, torch.Tensor)]
            v = max([0.0, *(float(t.detach().abs().float().max()) for t in ts if t.numel() and t.is_floating_point())])
            peaks[n] = max(peaks.get(n, 0.0), v)
        handles.append(m.register_forward_hook(post))
    _run_hooked(run, handles)
    return peaks, list(peaks)


def _run_hooked(run, handles) -> None:
    """Call ``run()`` without gradients, then remove the recording hooks whatever happened."""
    import torch

    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()


def plant_overflow(pipe, component: str, name: str, run, *, peak: float = 3e5) -> dict[str, Any]:
    """Scale ``pipe.<component>.<name>`` so its output reaches ``peak`` (beyond fp16's 65504), and undo the scale where
    the output is read, so the float32 run stays sane: a generic planted fp16 overflow.

    Weight and bias are multiplied by ``s = peak / max|output|``, taken back by the reader: a norm (scale-invariant), a
    linear or convolution (weight divided by ``s``), the partner attention projection (``to_q``/``to_k``: ``q.k``
    unchanged; ``to_v``/``to_out.0``: linear in ``v``), else the first later layer whose output grew, by its measured
    growth (a gated feed-forward's ``hidden * gelu(gate)``). ``run()`` calls the pipeline once (float32). Returns
    ``{"module", "scale", "compensated", "how", "spread"}``; ``spread``: modules outside the planted one still beyond
    fp16 in float32 (a residual stream carries the scale on: no island smaller than the component holds it).

    Example:
        >>> import torch
        >>> from hf_precision.testing.pipelines import example_call_kwargs, make_sd15
        >>> pipe = make_sd15()
        >>> run = lambda: pipe(**example_call_kwargs("sd15"), generator=torch.Generator().manual_seed(0))
        >>> plant_overflow(pipe, "vae", "decoder.up_blocks.0.resnets.0.conv1", run)["spread"]
        []
    """
    import torch

    root = getattr(pipe, component)
    target = root.get_submodule(name)
    base, order = _maxima(root, run)
    before, readers = _consumers(root, name, run)
    if name not in base:
        raise ValueError(f"{component}.{name} does not run in this call")
    if not before or not math.isfinite(before):
        raise ValueError(f"{component}.{name} produced no finite output in the float32 run")
    scale = peak / before
    names = dict(root.named_modules())
    compensated, how = [], "none"
    for a, b, kind in _PARTNERS:
        if name == a or name.endswith("." + a):
            partner = name[: len(name) - len(a)] + b
            if partner in names:
                compensated, how = [partner], kind
            break
    if not compensated and readers:
        compensated, how = readers, "consumers"
    with torch.no_grad():
        target.weight.mul_(scale)
        if getattr(target, "bias", None) is not None:
            target.bias.mul_(scale)
        for r in compensated:
            reader = names[r]
            if "norm" in type(reader).__name__.lower():
                continue  # a norm reads a scaled input as it read the original one
            reader.weight.div_(scale)
            if how == "k" and getattr(reader, "bias", None) is not None:
                reader.bias.div_(scale)

    def related(n: str) -> bool:
        return n == name or n.startswith(name + ".") or name.startswith(n + ".") or not n

    for _ in range(3):  # functional code between the module and its reader: divide the first grown layer by its growth
        now, _ = _maxima(root, run)
        grown = [n for n in order if not related(n) and n in now and base.get(n, 0) > 0
                 and now[n] > 10 * base[n] and not any(True for _ in names[n].children())
                 and isinstance(getattr(names[n], "weight", None), torch.nn.Parameter)
                 and "norm" not in type(names[n]).__name__.lower()]
        if not grown:
            break
        with torch.no_grad():
            names[grown[0]].weight.div_(now[grown[0]] / base[grown[0]])
        compensated.append(grown[0])
        how = how if how != "none" else "measured"
    now, _ = _maxima(root, run)
    spread = [n for n in order if not related(n) and now.get(n, 0) > 65504  # an activation's output is its input's
              and (names[n]._parameters.get("weight") is not None or any(True for _ in names[n].children()))]
    return {"module": name, "scale": scale, "compensated": compensated, "how": how, "spread": spread}

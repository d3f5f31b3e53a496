"""Which linear layers of the real models bitsandbytes' AVX512-BF16 CPU kernel cannot take in 4 bits.

Usage: python benchmarks/bnb_cpu_shapes.py [ALIAS ...]

Every shipped real config (hf_precision/model_configs) is built on the meta device; each ``nn.Linear`` of each model
component is checked with :func:`hf_precision.runtime.kernel_guards.bnb_cpu_packable` (output rows a multiple of 32,
input width a multiple of bitsandbytes' 64-weight block), the shapes its repacking takes. One line per component:
linear layers, how many the fused kernel cannot take, and up to three of them with their shapes. Such layers run
bitsandbytes' generic dequantizing path under hf_precision (the guard); without it their first call fails.
"""

from __future__ import annotations

import sys

import torch


def main(argv: list[str]) -> int:
    from hf_precision.runtime.kernel_guards import bnb_cpu_packable
    from hf_precision.runtime.meta import build_on_meta
    from hf_precision.runtime.source import configs_of, listed_components, shipped_configs

    shipped = shipped_configs()
    aliases = argv or sorted({folder: alias for alias, folder in sorted(shipped.items(), reverse=True)}.values())
    total = odd_total = 0
    for alias in aliases:
        _, index, configs = configs_of(alias)
        for comp, (library, cls) in sorted(listed_components(index).items()):
            if comp not in configs or library not in ("diffusers", "transformers"):
                continue
            try:
                module = build_on_meta(library, cls, configs[comp])
            except Exception as err:  # a class this diffusers lacks: say so, go on
                print(f"{alias:14} {comp:16} not built: {type(err).__name__}")
                continue
            linears = [(n, m) for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)]
            odd = [f"{n} {m.out_features}x{m.in_features}" for n, m in linears
                   if not bnb_cpu_packable(m.out_features, m.in_features)]
            total, odd_total = total + len(linears), odd_total + len(odd)
            print(f"{alias:14} {comp:16} {len(linears):5} linear, {len(odd):4} not packable"
                  + (f": {', '.join(odd[:3])}" if odd else ""))
    print(f"all: {total} linear layers, {odd_total} the fused kernel cannot take")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

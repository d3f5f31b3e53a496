"""The pieces of ``benchmarks/benchmark.py`` (one module per concern; the command itself only wires them).

- ``common``: statistics, formatting, machine description;
- ``progress``: a line per measurement with the estimated time left;
- ``speed``: which dtypes this CPU computes slowly, decided by a short measured probe;
- ``pipeline``: the random-weight pipeline under test (tiny, mid, custom or the real SDXL configs);
- ``memory``: load in fresh processes, peak RSS and peak anonymous memory; weight bytes via ``hf_precision.plan``;
- ``runtime``: denoiser overhead, the hooks' own time, 166-island stress, re-apply and apply scaling;
- ``fidelity``: image and denoiser output against fp32, on a model trained by ``trained`` and on random weights;
- ``trained``: small models fitted by ``hf-precision train`` (cached under ``<out>/trained/``);
- ``report``: the markdown report.

Only the package's public functions are used (``hf_precision.load_pipeline``, ``apply_recipe``, ``applied``,
``plan``, ``get_recipe``, ``hf_precision.runtime.load.from_pretrained_dtypes``,
``hf_precision.runtime.layout.component_islands``, ``hf_precision.runtime.hooks.EntryHook``/``IslandHook``).
"""

"""Quantized and fp8 storage as recipe choices (torchao, optimum-quanto and bitsandbytes for transformers models on
CPU; bitsandbytes for diffusers models and fp8 matmuls on GPU).

Each case loads a tiny Flux (a diffusers transformer and a transformers T5 with fp32 `wo` islands) through
``load_pipeline(..., quantize=...)`` and checks: the backend quantized exactly the layers the plan counted (plan
bytes == measured bytes), islands stay unquantized and float32, and the output is finite.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import hf_precision as hp
from hf_precision.errors import RecipeError
from hf_precision.recipe.overrides import Override, parse_set
from hf_precision.runtime.quantize import module_bytes
from hf_precision.runtime.quantize_load import quantized_in

pytest.importorskip("torchao")
pytest.importorskip("optimum.quanto")

CALL = dict(prompt="a cat", num_inference_steps=2, height=32, width=32, output_type="np", max_sequence_length=16,
            guidance_scale=3.5)


@pytest.fixture(scope="module")
def flux_folder(tmp_path_factory):
    from hf_precision.testing import save_pipeline
    from hf_precision.testing import make_pipeline

    return save_pipeline(make_pipeline("flux"), tmp_path_factory.mktemp("flux"))


def _run(pipe):
    out = pipe(**CALL, generator=torch.Generator().manual_seed(0)).images
    return torch.as_tensor(out)


# (component, storage, layout): fp32, bf16 and fp16 compute; the T5 case keeps its `wo` islands in fp32 (t4 layout).
# bitsandbytes quantizes the transformers T5 on the CPU (its 4-bit code tables and absmax counted too; fp4 is nf4's
# code path with another table: docs/quantization.md has its bytes).
CASES = [
    ("transformer", "int8", "cpu-amx"),
    ("transformer", "quanto-int8", "t4"),
    ("text_encoder_2", "int8", "t4"),
    ("text_encoder_2", "quanto-int8", None),
    ("text_encoder_2", "nf4", "cpu-amx"),
    ("text_encoder_2", "bnb-int8", None),
    pytest.param("transformer", "quanto-int4", "cpu-amx", marks=pytest.mark.heavy),
    pytest.param("text_encoder_2", "quanto-int2", None, marks=pytest.mark.heavy),  # builds quanto's C++ unpacker
]


def _load_quantized(folder, component, storage, layout):
    """The pipeline loaded on the CPU with ``component`` in ``storage``; None where a GPU is present and LLM.int8 is
    refused there (test_bnb_int8_on_cpu_beside_a_gpu_is_refused_before_loading, after asserting the refusal)."""
    if storage in ("nf4", "bnb-int8"):
        pytest.importorskip("bitsandbytes")
    if storage == "bnb-int8" and torch.cuda.is_available():
        with pytest.raises(hp.RecipeError, match="beside a CUDA GPU"):
            hp.load_pipeline(folder, "cpu", layout=layout, quantize={component: storage})
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hp.load_pipeline(folder, "cpu", layout=layout, quantize={component: storage})


@pytest.mark.parametrize("component,storage,layout", CASES)
def test_quantized_component_loads_plans_exactly_and_runs(flux_folder, component, storage, layout):
    pipe = _load_quantized(flux_folder, component, storage, layout)
    if pipe is None:
        return
    module = getattr(pipe, component)
    record = hp.applied(pipe)
    plan = record.recipe[component]
    assert plan.storage == storage
    quantized = quantized_in(module)
    assert quantized, "the backend quantized nothing"
    assert f"{component}: {storage} via" in "\n".join(record.actions) and "as planned" in "\n".join(record.actions)
    # plan() counts the backend's bytes exactly (data + scales + zero points + quanto's scalar buffers)
    planned = hp.plan(flux_folder, device=layout or "cpu", overrides={component: {"storage": storage}})[component]
    assert planned.total_bytes == module_bytes(module)
    assert planned.bytes_by_dtype[storage] > 0
    # islands, norms, embeddings and the final projection stay plain tensors; islands in float32
    for island in record.islands[component]:
        assert not any(n == island or n.startswith(island + ".") for n in quantized)
        assert all(p.dtype == torch.float32 for p in module.get_submodule(island).parameters())
    if component == "transformer":  # embedders always; the final layers too where the backend takes exact names
        kept = {"x_embedder", "context_embedder"} | ({"proj_out", "norm_out.linear"} if storage == "int8" else set())
        assert not kept & quantized
    report = hp.check(pipe, call=lambda p: p(**CALL))  # no mismatch, no drift from the plan, islands intact
    assert report.ok, str(report)
    assert torch.isfinite(_run(pipe)).all()
    if storage in ("nf4", "fp4"):  # repacked for the fused kernel exactly where bitsandbytes' CPU path can take it
        from bitsandbytes.functional import has_avx512bf16

        from hf_precision.runtime.kernel_guards import bnb_cpu_packable

        layers = {n: m for n, m in module.named_modules() if n in quantized}
        packed = {n for n, m in layers.items() if getattr(m.weight.quant_state, "packing_format_for_cpu", False)}
        packable = {n for n, m in layers.items() if bnb_cpu_packable(*m.weight.quant_state.shape, m.weight.quant_state.blocksize)}
        assert packed == (packable if has_avx512bf16() else set())


@pytest.fixture(scope="module")
def pixart_folder(tmp_path_factory):
    from hf_precision.testing import make_pipeline, save_pipeline

    return save_pipeline(make_pipeline("pixart"), tmp_path_factory.mktemp("pixart"))


# Every storage that runs on the CPU, each in a compute layout it is used with (fp32, bf16, fp16 compute).
CPU_STORAGES = [("transformer", "int8", "cpu-amx"), ("transformer", "quanto-int8", None),
                ("transformer", "quanto-float8", "cpu-amx"), ("transformer", "quanto-int4", "cpu-amx"),
                ("transformer", "quanto-int2", None), ("transformer", "float8_e4m3fn", "cpu-amx"),
                ("transformer", "float8_e5m2", "t4"), ("text_encoder", "nf4", None), ("text_encoder", "bnb-int8", "t4")]


@pytest.mark.parametrize("component,storage,layout", CPU_STORAGES)
def test_every_cpu_storage_plans_every_byte_the_loaded_pixart_holds(pixart_folder, component, storage, layout):
    """PixArt's sin-cos position table (``pos_embed.pos_embed``) is a non-persistent buffer: in no checkpoint, held in
    memory all the same (18.9 MB fp32 on PixArt-XL-2-1024); the plan left it out, short by 5.5% with quanto-int4."""
    from checks import assert_plan_bytes

    pipe = _load_quantized(pixart_folder, component, storage, layout)
    if pipe is None:
        return
    table = pipe.transformer.pos_embed.pos_embed
    assert "pos_embed.pos_embed" not in pipe.transformer.state_dict() and table.numel() > 0
    assert quantized_in(getattr(pipe, component)) or storage.startswith("float8")
    assert_plan_bytes(pipe, pixart_folder, layout or "cpu", overrides={component: {"storage": storage}})


def test_bnb_int8_on_cpu_beside_a_gpu_is_refused_before_loading(flux_folder, monkeypatch):
    """On the H200 machine a CPU-placed LLM.int8 T5 (loaded onto the GPU by transformers, then moved) failed with
    'invalid argument to getCurrentStream' and broke the CUDA context for every later test of the process; with a GPU
    present it is refused before a weight is read, naming the storages that run there."""
    import transformers

    pytest.importorskip("bitsandbytes")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    loads = []
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(lambda *a, **k: loads.append(a)))
    with pytest.raises(hp.RecipeError) as info:
        hp.load_pipeline(flux_folder, "cpu", quantize={"text_encoder_2": "bnb-int8"})
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "text_encoder_2.storage=bnb-int8 on cpu beside a CUDA GPU" in message
    assert "--set text_encoder_2.storage=int8" in message and not loads


def test_a_stale_quanto_build_lock_is_refused_before_loading(flux_folder, tmp_path, monkeypatch):
    """An interrupted first build of quanto's C++ extension leaves ``build/lock``, and torch's FileBaton waits on it
    forever: a later quanto load of that environment hung with no word (a whole suite run did). A lock older than any
    build is refused before a weight is read, naming the file and the fix; a fresh one (a build under way) is not."""
    import os
    import time

    import transformers

    from hf_precision.runtime import kernel_guards

    lock = tmp_path / "cpp" / "build" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    monkeypatch.setattr(kernel_guards, "_quanto_extensions", lambda: tmp_path)
    assert kernel_guards.stale_build_locks() == []  # a build under way holds a fresh lock
    old = time.time() - 2 * kernel_guards._STALE_LOCK_S
    os.utime(lock, (old, old))
    assert kernel_guards.stale_build_locks() == [lock]
    loads = []
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(lambda *a, **k: loads.append(a)))
    with pytest.raises(hp.RecipeError) as info:
        hp.load_pipeline(flux_folder, "cpu", quantize={"text_encoder_2": "quanto-int8"})
    message = str(info.value)
    assert len(message.splitlines()) == 1 and f"rm {lock}" in message and "text_encoder_2.storage=quanto-int8" in message
    assert not loads


def test_quanto_int4_in_bf16_keeps_the_layers_tinygemm_cannot_pack():
    """quanto packs qint4 with bf16 scales in torch's tinygemm layout when a row is whole 128-input groups, and that
    needs out_features % 16 == 0: such a layer would fail the load, so it is kept (and planned) unquantized."""
    from optimum.quanto import freeze, qint4, quantize

    from hf_precision.runtime.quantize import kept_layers

    layers = torch.nn.ModuleDict({"a": torch.nn.Linear(256, 24), "b": torch.nn.Linear(256, 32),
                                  "c": torch.nn.Linear(128, 24)})
    bf16 = hp.get_recipe("flux", device="cpu-amx", overrides={"transformer": {"storage": "quanto-int4"}})["transformer"]
    fp32 = hp.get_recipe("flux", device="cpu-avx2", overrides={"transformer": {"storage": "quanto-int4"}})["transformer"]
    assert kept_layers(layers, bf16, []) == ["a"] and kept_layers(layers, fp32, []) == []
    plain = torch.nn.Sequential(torch.nn.Linear(256, 24)).to(torch.bfloat16)
    quantize(plain, weights=qint4)
    with pytest.raises(RuntimeError, match="dividable by 16"):
        freeze(plain)


def test_quantize_keyword_and_set_flag_are_one_request():
    by_flag = hp.get_recipe("flux", device="cpu", overrides=[Override("--set", parse_set(["transformer.storage=int8"]))])
    by_dict = hp.get_recipe("flux", device="cpu", overrides={"transformer": {"storage": "int8wo"}})
    assert by_flag["transformer"].storage == by_dict["transformer"].storage == "int8"
    assert "torchao Int8WeightOnlyConfig" in next(d.rule for d in by_flag["transformer"].decisions if d.field == "storage")


# fp8 on a transformers text encoder: its `.dtype` (the first parameter's) must stay the compute dtype, since Flux
# casts the CLIP embeddings and the latents to it; T5 casts into `wo.weight.dtype` (not an island in fp32 compute).
@pytest.mark.parametrize("component,layout", [("transformer", "cpu-amx"), ("text_encoder", "cpu-amx"),
                                              ("text_encoder_2", None)])
@pytest.mark.probe
def test_fp8_storage_through_quantize_runs(flux_folder, component, layout):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = hp.load_pipeline(flux_folder, "cpu", layout=layout, quantize={component: "float8_e4m3fn"})
    request = {component: {"storage": "float8_e4m3fn"}}
    # layout None is this CPU's own: float32, or bfloat16 where the device rules pick it unasked (an AMX CPU)
    compute = getattr(torch, hp.get_recipe("flux", device=layout or "cpu", overrides=request)[component].compute)
    module = getattr(pipe, component)
    dtypes = {p.dtype for p in module.parameters()}
    assert torch.float8_e4m3fn in dtypes and compute in dtypes  # norms/embedders stay in the compute dtype
    assert module.dtype == compute
    planned = hp.plan(flux_folder, device=layout or "cpu", overrides=request)
    assert planned[component].total_bytes == module_bytes(module)
    assert torch.isfinite(_run(pipe)).all()


def test_users_own_quantization_config_passes_through_and_is_reported(flux_folder):
    from diffusers import PipelineQuantizationConfig, QuantoConfig

    config = PipelineQuantizationConfig(quant_mapping={"transformer": QuantoConfig("int8")})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = hp.load_pipeline(flux_folder, "cpu", quantization_config=config)
    assert quantized_in(pipe.transformer)
    assert any("quantization_config from the caller (PipelineQuantizationConfig)" in a for a in hp.applied(pipe).actions)
    assert torch.isfinite(_run(pipe)).all()
    with pytest.raises(RecipeError, match="both ask how to quantize"):
        hp.load_pipeline(flux_folder, "cpu", quantization_config=config, quantize={"transformer": "int8"})


@pytest.mark.parametrize("device,storage,words", [
    ("cpu-avx2", "nf4", "diffusers' bitsandbytes quantizer needs a GPU"),  # diffusers v0.42.1 bnb_quantizer.py:64
    ("t4", "bnb-int8", "planned on a machine without a CUDA, XPU or MPS GPU"),
    ("m1-macos13", "float8_e4m3fn", "MPS has no float8 dtypes"),
    ("t4", "fp8-compute", "CUDA compute capability 8.9"),
])
def test_a_choice_the_device_cannot_do_is_refused_before_loading(flux_folder, monkeypatch, device, storage, words):
    from diffusers import DiffusionPipeline

    if "without a CUDA" in words and (torch.cuda.is_available() or torch.backends.mps.is_available()):
        pytest.skip("this machine has a GPU for diffusers' bitsandbytes quantizer")

    def never(*a, **k):
        raise AssertionError("from_pretrained was reached")

    monkeypatch.setattr(DiffusionPipeline, "from_pretrained", never)
    if device == "cpu-avx2":  # plan() refuses it too: the planned device's rule, not this machine
        with pytest.raises(RecipeError, match=words):
            hp.plan(flux_folder, device=device, overrides={"transformer": {"storage": storage}})
    with pytest.raises(RecipeError) as info:
        hp.load_pipeline(flux_folder, "cpu", layout=device, quantize={"transformer": storage})
    msg = str(info.value)
    assert words in msg and "--set transformer.storage=" in msg and "allowed" in msg  # a Python caller's fix first
    fix = msg.split("--set transformer.storage=")[1].split()[0].rstrip(")")
    hp.get_recipe("flux", device=device, overrides={"transformer": {"storage": fix}})  # the fix resolves


def test_bad_storage_names_and_quantize_keys_get_close_names(flux_folder):
    with pytest.raises(RecipeError, match="unknown storage 'int9'.*did you mean 'int8'"):
        hp.get_recipe("flux", device="cpu", overrides={"transformer": {"storage": "int9"}})
    with pytest.raises(RecipeError, match=r"quantize\.storag: unknown key.*did you mean 'storage'"):
        hp.get_recipe("flux", device="cpu", overrides={"transformer": {"quantize": {"storag": ["int8"]}}})
    with pytest.raises(RecipeError, match="quantize='int8': expected component -> storage"):
        hp.load_pipeline(flux_folder, "cpu", quantize="int8")
    with pytest.raises(RecipeError, match="unknown component 'transfomer'.*did you mean 'transformer'"):
        hp.load_pipeline(flux_folder, "cpu", quantize={"transfomer": "int8"})


def test_recipes_say_what_may_be_quantized():
    flux = hp.get_recipe("flux", device="rtx4090")
    assert {"float8_e4m3fn", "int8", "nf4", "fp8-compute"} <= set(flux["transformer"].quantize)
    assert "float8_e4m3fn" not in hp.get_recipe("flux", device="cpu")["vae"].quantize  # the VAE tolerates none
    wan = hp.get_recipe("wan", device="t4")["transformer"]
    assert wan.quantize and wan.keep_fp32  # quantized around its fp32 islands


def test_fp8_weights_used_directly_fail_plainly_and_are_explained(flux_folder):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(flux_folder, torch_dtype=torch.bfloat16)
    pipe.transformer.to(torch.float8_e4m3fn)  # "fp8 base" done by hand
    with pytest.raises(RuntimeError) as plain:
        _run(pipe)
    assert "Float8_e4m3fn" in str(plain.value)
    with pytest.raises(hp.diagnose.mismatch.MismatchError) as info:
        with hp.explain(pipe):
            _run(pipe)
    assert "--set transformer.storage=float8_e4m3fn" in info.value.fix and "agree on" not in info.value.fix


@pytest.mark.parametrize("op,message", [
    (lambda: torch.ones(2).to(torch.float8_e4m3fn) + torch.ones(2, dtype=torch.bfloat16),
     "Promotion for Float8 Types is not supported"),
    (lambda: torch.nn.functional.layer_norm(torch.ones(2, 4).to(torch.float8_e4m3fn), (4,)), "not implemented for"),
])
def test_fp8_kernel_errors_are_explained(op, message):
    class Block(torch.nn.Module):
        def forward(self, x):
            return op()

    with pytest.raises(RuntimeError if "Promotion" in message else NotImplementedError) as plain:
        Block()(None)
    assert message in str(plain.value)
    err = hp.explain_error(plain.value)
    assert err is not None and "storage=float8_e4m3fn" in err.fix


@pytest.mark.parametrize("message,fix", [
    ('"cat_cuda" not implemented for \'Float8_e4m3fn\'', "storage=float8_e4m3fn"),       # bmaltais/kohya_ss#2733
    ("Promotion for Float8 Types is not supported", "storage=float8_e4m3fn"),             # as OneTrainer#442 quotes it
    ("Expected is_sm80 || is_sm90 to be true, but got false.", "storage=int8"),           # bmaltais/kohya_ss#2717
    ("Trying to convert Float8_e4m3fn to the MPS backend but it does not have support for that dtype.",
     "storage=quanto-int8"),                                                             # Nerogar/OneTrainer#1689
    ("No GPU found. A GPU is needed for quantization.", "storage=int8"),  # diffusers' bnb quantizer without a GPU
])
def test_gpu_and_mps_fp8_messages_get_a_fix_that_resolves(message, fix):
    from hf_precision.diagnose.mismatch import explain_error

    err = explain_error(RuntimeError(message), "transformer.blocks.0")
    assert err is not None and fix in err.fix
    device = {"storage=quanto-int8": "m2-macos15", "storage=int8": "rtx2080"}.get(fix, "t4")
    value = fix.split("=")[1]
    assert hp.get_recipe("flux", device=device, overrides={"transformer": {"storage": value}})["transformer"].storage == value


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("storage", ["nf4", "bnb-int8", "fp8-compute"])
def test_cuda_backends_plan_exactly_and_run(flux_folder, storage):
    pytest.importorskip("bitsandbytes") if storage != "fp8-compute" else None
    if storage == "fp8-compute" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 matmuls need sm 8.9")
    pipe = hp.load_pipeline(flux_folder, "cuda", quantize={"transformer": storage})
    planned = hp.plan(flux_folder, device="cuda", overrides={"transformer": {"storage": storage}})["transformer"]
    assert quantized_in(pipe.transformer)
    assert planned.total_bytes == module_bytes(pipe.transformer)
    assert torch.isfinite(_run(pipe)).all()


def test_video_memory_plan_chooses_quantized_storage_that_fits_and_loads_it(tmp_path):
    """On a CPU (no offload) a budget below the all-bf16 peak is met by the fp8 storage the Wan recipe tolerates;
    the chosen layout loads as planned: the transformer's measured bytes are the bytes the plan counted."""
    from hf_precision.apps.video import load_video_pipeline, model_spec
    from hf_precision.apps.video.plan import choose
    from hf_precision.testing import make_pipeline, save_pipeline

    folder = save_pipeline(make_pipeline("wan"), tmp_path / "wan")
    where, spec = model_spec(str(folder))
    sizes = {"height": 16, "width": 16, "frames": 5, "accelerator": False, "layout": "cpu-amx"}
    plain = choose(where, spec, budget=10**12, quantize=False, **sizes)
    assert plain.settings.quantize == ()
    budget = plain.prediction.peak - 1  # the plain layout no longer fits
    chosen = choose(where, spec, budget=budget, **sizes)
    assert chosen.fits and chosen.prediction.peak <= budget
    assert chosen.settings.quantize and chosen.settings.quantize[0][0] == "transformer"
    assert "transformer" in chosen.settings.label() and chosen.settings.quantize[0][1] in chosen.settings.label()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = load_video_pipeline(where, "cpu", settings=chosen.settings, layout="cpu-amx")
    storage = dict(chosen.settings.quantize)["transformer"]
    assert hp.applied(pipe).recipe["transformer"].storage == storage
    assert module_bytes(pipe.transformer) == chosen.prediction.weights["transformer"]


def test_image_memory_plan_fits_flux_on_a_12gb_t4_with_quantized_storage():
    """Real FLUX.1-schnell configs (meta device): bf16/fp16 weights (36 GB) do not fit 12 GB, even offloaded; the plan
    names offload plus the quantized storage the Flux recipes tolerate on a T4, counted exactly."""
    from hf_precision.apps.image_plan import choose_image_layout

    c = choose_image_layout("FLUX.1-schnell", "t4", 12 * 10**9)
    assert c.fits and c.resident <= 12 * 10**9 - c.reserve and c.quantize
    assert all(storage in hp.get_recipe("flux", device="t4")[comp].quantize for comp, storage in c.quantize)
    assert c.tried[0][0] == "none" and c.tried[0][1] == () and c.tried[0][2] > 12 * 10**9


def test_generate_with_max_memory_loads_the_chosen_layout(flux_folder, tmp_path):
    from hf_precision.apps.image import generate
    from hf_precision.apps.image_plan import choose_image_layout

    plain = choose_image_layout(str(flux_folder), "cpu", 10**12)
    budget = int((plain.resident - 100) / (1 - 0.2))  # the plain weights no longer fit beside the reserve
    lines = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = generate(str(flux_folder), "a cat", tmp_path / "cat.png", device="cpu", steps=1, height=32, width=32,
                       max_memory=budget, say=lines.append)
    assert out.is_file() and "memory plan: chosen" in lines[0] and "transformer" in lines[0]


def test_nan_guard_on_a_quantized_component_says_how_to_store_it_unquantized(flux_folder):
    """The guard re-runs a component in a wider dtype; quantized weights cannot be: it warns with the storage fix
    once, instead of looping or dequantizing behind the user's back."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = hp.load_pipeline(flux_folder, "cpu", layout="cpu-amx", quantize={"transformer": "int8"},
                                overrides={"transformer": {"nan_guard": True}})
    with torch.no_grad():
        pipe.transformer.proj_out.bias.fill_(float("inf"))  # kept unquantized: the output overflows
    with pytest.warns(RuntimeWarning, match=r"quantized weights.*--set transformer.storage=bfloat16"):
        _run(pipe)  # returns: the guard neither loops nor re-casts quantized tensors
    assert quantized_in(pipe.transformer)  # still quantized: nothing was dequantized silently


def test_nan_guard_reruns_an_fp8_stored_component_in_float32(flux_folder):
    """fp8 storage is no backend tensor: the guard re-runs it wider, its layerwise hooks computing in float32 too
    (they computed in bf16, and the re-run failed with 'mat1 and mat2 must have the same dtype')."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = hp.load_pipeline(flux_folder, "cpu", layout="cpu-amx", quantize={"transformer": "float8_e4m3fn"},
                                overrides={"transformer": {"nan_guard": True}})
    with torch.no_grad():
        pipe.transformer.norm_out.linear.bias.fill_(float("inf"))  # bf16 (layerwise casting skips *norm*)
    with pytest.warns(RuntimeWarning, match="transformer produced non-finite values in bfloat16; re-ran it in float32"):
        _run(pipe)
    assert pipe.transformer.dtype == torch.float32
    assert any(p.dtype == torch.float8_e4m3fn for p in pipe.transformer.parameters())  # still stored fp8


@pytest.mark.parametrize("folder,component,storage", [("flux_folder", "transformer", "int8"),
                                                     ("sdxl_inpaint_folder", "unet", "quanto-int8")])
@pytest.mark.probe
def test_calibrate_runs_on_a_quantized_component(request, folder, component, storage):
    """calibrate reads each weight's peak; a torchao int8 weight has no abs() (it is read dequantized). Its fp16 runs
    re-apply the component in another compute dtype: quanto's weights, loaded in float32, kept that dtype and gave
    float32 outputs beside fp16 GroupNorms ('mixed dtype (CPU)', SDXL's UNet)."""
    from hf_precision.testing import PIPELINES

    row = PIPELINES["flux" if folder == "flux_folder" else "sdxl_inpaint"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = hp.load_pipeline(request.getfixturevalue(folder), "cpu", quantize={component: storage})
        row.ready(pipe)
        module = getattr(pipe, component)
        loaded = {p.dtype for p in module.parameters()}
        compute = getattr(torch, hp.applied(pipe).recipe[component].compute)
        result = hp.calibrate(pipe, "t4", row.call_kwargs(), progress=False, rounds=1, steps=1)
    assert result.finite and quantized_in(module)
    # this CPU's compute dtype (float32, or bfloat16 where its device rules pick it) and float32 islands
    assert compute in loaded and loaded <= {compute, torch.float32}
    assert {p.dtype for p in module.parameters()} == loaded  # handed back as loaded


def test_calibrated_islands_are_kept_out_of_quantization():
    """calibrate writes islands as keep_fp32 overrides; with a quantized storage those modules stay plain fp32."""
    from hf_precision.diagnose.planner import build_on_meta
    from hf_precision.runtime.quantize import quantized_layers
    from hf_precision.runtime.source import configs_of

    _, _, configs = configs_of("FLUX.1-schnell")
    meta = build_on_meta("diffusers", "FluxTransformer2DModel", configs["transformer"])
    island = "single_transformer_blocks.3"
    for storage in ("int8", "quanto-int8", "nf4"):
        plan = hp.get_recipe("flux", device="rtx4090", overrides={"transformer": {
            "storage": storage, "keep_fp32": [island]}})["transformer"]
        converted = quantized_layers(meta, plan, [island])
        assert converted and not [n for n in converted if n.startswith(island + ".")]
        # quanto and diffusers' bitsandbytes match child names: an island's layers are kept whatever that costs (its
        # proj_out keeps every block's proj_out), counted exactly; torchao takes exact names
        assert ("single_transformer_blocks.30.proj_out" in converted) == (storage == "int8")
        # a layer kept only by default (the final proj_out) is not handed over by child name: that would keep all 38
        # single-block proj_out layers (1.8B parameters) out too
        plain = hp.get_recipe("flux", device="rtx4090", overrides={"transformer": {"storage": storage}})["transformer"]
        assert ("proj_out" in quantized_layers(meta, plain, [])) == (storage != "int8")


def test_bnb_plan_counts_only_what_transformers_converts():
    """transformers' bitsandbytes converts `type(m) is nn.Linear` only (integrations/bitsandbytes.py:189), so the
    plan must not count nn.MultiheadAttention's out_proj (a Linear subclass: SigLIP's pooling head, in LTX-2's
    Gemma 3); it did, and check warned 'quantized 22 layers where the plan counted 23' on every LTX-2 nf4 load."""
    from transformers import SiglipVisionConfig, SiglipVisionModel

    from hf_precision.runtime.quantize import quantized_layers

    config = SiglipVisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                                image_size=16, patch_size=4, vision_use_head=True)
    with torch.device("meta"):
        model = SiglipVisionModel(config)
    plan = hp.get_recipe("ltx2", device="cpu", overrides={"text_encoder": {"storage": "nf4"}})["text_encoder"]
    counted = quantized_layers(model, plan, [])
    heads = [n.rpartition("head.")[2] for n in counted if "head." in n]
    assert heads == ["mlp.fc1", "mlp.fc2"]  # the pooling head's own Linear layers, not its attention's out_proj


def test_check_passes_wan_in_bf16():
    """Wan's blocks feed `hidden_states.float()` to their bf16 FP32LayerNorm `norm2` on purpose (it computes in fp32
    itself, transformer_wan.py): check reports no mismatch there."""
    from hf_precision.testing import PIPELINES, make_pipeline

    pipe = make_pipeline("wan")
    recipe = hp.get_recipe("wan", device="cpu-amx")
    hp.apply_recipe(pipe, recipe, device="cpu")
    report = hp.check(pipe, call=lambda p: p(**PIPELINES["wan"].call_kwargs(num_inference_steps=1)))
    assert report.ok, str(report)


@pytest.mark.parametrize("name, qtypes", [("sdxl", ("BF16", "Q8_0")), ("wan", ("Q8_0",)), ("sd3", ("Q8_0",)),
                                           ("cascade_prior", ("Q8_0",))])
def test_gguf_denoiser_plans_exactly_and_runs(tmp_path, name, qtypes):
    """plan(file, base=...) counts what loading a GGUF denoiser gives, every component, from the file's header.
    SDXL BF16: diffusers leaves convolutions packed, the loader unpacks them ('expected scalar type BFloat16 but found
    Byte' before); its Q8_0 island layers become plain fp32. Wan: its transformer (None by default in WanPipeline)
    was loaded again from the base folder over the GGUF one. SD3: the file's pos_embed buffer is no weight, and ran
    packed. Stable Cascade's prior: the pipeline makes latents in its first parameter's dtype (was uint8)."""
    from hf_precision.testing import PIPELINES, make_pipeline, save_pipeline
    from hf_precision.testing.gguf_file import write_gguf

    row = PIPELINES[name]
    source = make_pipeline(name)
    folder = save_pipeline(source, tmp_path / name)
    comp = hp.get_recipe(row.recipe, device="cpu").denoiser
    for qtype in qtypes:
        path = tmp_path / f"{comp}-{qtype}.gguf"
        write_gguf(getattr(source, comp), path, qtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pipe = hp.load_pipeline(path, "cpu", base=folder, layout="cpu-amx")
        row.ready(pipe)
        assert quantized_in(getattr(pipe, comp)) or qtype == "BF16"  # the GGUF model, not the base folder's
        islands = hp.applied(pipe).islands[comp]
        assert not [n for n in quantized_in(getattr(pipe, comp)) if any(n.startswith(i + ".") for i in islands)]
        planned = hp.plan(path, device="cpu-amx", base=folder)
        assert {c: module_bytes(getattr(pipe, c)) for c in planned.components} == \
            {c: p.total_bytes for c, p in planned.components.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = pipe(**row.call_kwargs(num_inference_steps=1), generator=torch.Generator().manual_seed(0))
        res = row.result(out)
        res = res if isinstance(res, torch.Tensor) else torch.as_tensor(__import__("numpy").asarray(res))
        assert torch.isfinite(res.float()).all()


@pytest.mark.parametrize("storage", ["int8", "float8_e4m3fn"])
def test_hunyuandit_text_pooler_stays_out_of_quantization(tmp_path, storage):
    """HunyuanDiT's `time_extra_emb.pooler` reads its projection weights itself (F.multi_head_attention_forward):
    quantized it failed ('Int8Tensor dispatch: ... aten.t', fp8 weights used directly); the recipe keeps it out."""
    from hf_precision.testing import PIPELINES, make_pipeline, save_pipeline

    folder = save_pipeline(make_pipeline("hunyuandit"), tmp_path / "hunyuandit")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = hp.load_pipeline(folder, "cpu", layout="cpu-amx", quantize={"transformer": storage})
    pooler = pipe.transformer.time_extra_emb.pooler
    assert all(p.dtype == torch.bfloat16 and type(p) is torch.nn.Parameter for p in pooler.parameters())
    planned = hp.plan(folder, device="cpu-amx", overrides={"transformer": {"storage": storage}})["transformer"]
    assert planned.total_bytes == module_bytes(pipe.transformer)
    out = pipe(**PIPELINES["hunyuandit"].call_kwargs(num_inference_steps=1), generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(torch.as_tensor(out.images)).all()


@pytest.mark.probe
def test_fp8_stable_cascade_prior_makes_its_latents_in_the_compute_dtype(tmp_path):
    """The prior pipeline takes its latents' dtype from the prior's first parameter; fp8 storage keeps that layer
    (`clip_txt_pooled_mapper`) in the compute dtype ('"normal_kernel_cpu" not implemented for Float8_e5m2' before)."""
    from hf_precision.testing import PIPELINES, make_pipeline, save_pipeline

    folder = save_pipeline(make_pipeline("cascade_prior"), tmp_path / "prior")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = hp.load_pipeline(folder, "cpu", quantize={"prior": "float8_e5m2"})
    request = {"prior": {"storage": "float8_e5m2"}}
    recipe = hp.get_recipe(PIPELINES["cascade_prior"].recipe, device="cpu", overrides=request)
    assert next(pipe.prior.parameters()).dtype == getattr(torch, recipe["prior"].compute)  # this CPU's
    assert any(p.dtype == torch.float8_e5m2 for p in pipe.prior.parameters())
    planned = hp.plan(folder, device="cpu", overrides=request)["prior"]
    assert planned.total_bytes == module_bytes(pipe.prior)
    out = pipe(**PIPELINES["cascade_prior"].call_kwargs(num_inference_steps=1))
    assert torch.isfinite(torch.as_tensor(PIPELINES["cascade_prior"].result(out))).all()


@pytest.fixture(scope="module")
def flux_missing_weight(flux_folder, tmp_path_factory):
    """The tiny Flux with one text-encoder Linear weight left out of the checkpoint (HunyuanDiT's BertModel pooler
    is such a layer: transformers initializes it anew) and a zero-initialized transformer layer (adaLN-Zero,
    Kandinsky 3's ``context_mlp``)."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("flux_missing") / "flux"
    shutil.copytree(flux_folder, folder)
    path = folder / "text_encoder" / "model.safetensors"
    state = load_file(path)
    del state[next(k for k in state if k.endswith("layers.0.self_attn.q_proj.weight"))]
    save_file(state, path, metadata={"format": "pt"})
    path = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    state = load_file(path)
    state["transformer_blocks.0.norm1.linear.weight"].zero_()
    save_file(state, path, metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("component,storage,layout", [("text_encoder", "int8", "cpu-amx"),
                                                      ("text_encoder", "quanto-int8", None),
                                                      ("text_encoder", "quanto-float8", "cpu-amx"),
                                                      ("text_encoder", "nf4", None),
                                                      ("transformer", "quanto-float8", "cpu-amx")])
def test_missing_and_zero_weights_are_quantized_as_planned_and_stay_finite(flux_missing_weight, component, storage,
                                                                          layout):
    """The backends quantize weights as they read them, so a newly initialized layer stayed plain (torchao), held
    float weights (quanto) or a float Parameter in a Linear4bit (bitsandbytes nf4: "FP4 quantization state not
    initialized" on its first call) while plan() counted it quantized: HunyuanDiT's text encoder was 864-2936 B off.
    quanto's float8 wrote an all-zero weight row as NaN (0/0): Kandinsky 3's UNet gave all-NaN output."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = hp.load_pipeline(flux_missing_weight, "cpu", layout=layout, quantize={component: storage})
    module = getattr(pipe, component)
    layer = "layers.0.self_attn.q_proj" if component == "text_encoder" else "transformer_blocks.0.norm1.linear"
    assert any(n.endswith(layer) for n in quantized_in(module))
    assert "as planned" in "\n".join(hp.applied(pipe).actions)
    planned = hp.plan(flux_missing_weight, device=layout or "cpu", overrides={component: {"storage": storage}})
    assert planned[component].total_bytes == module_bytes(module)
    if storage.startswith("quanto-"):  # the type asked for (transformers' QuantoConfig ignored `weights_dtype`: int8)
        want = torch.float8_e4m3fn if storage == "quanto-float8" else torch.int8
        assert {p._data.dtype for p in module.parameters() if hasattr(p, "_data")} == {want}
    assert torch.isfinite(_run(pipe)).all()


@pytest.fixture(scope="module")
def sdxl_inpaint_folder(tmp_path_factory):
    from hf_precision.testing import make_pipeline, save_pipeline

    return save_pipeline(make_pipeline("sdxl_inpaint"), tmp_path_factory.mktemp("sdxl_inpaint"))


@pytest.mark.parametrize("component,storage,layout", [("vae", "int8", "cpu-amx"), ("vae", "float8_e5m2", None),
                                                      ("unet", "int8", "t4")])
def test_img2img_vae_round_trip_keeps_the_planned_layout(sdxl_inpaint_folder, component, storage, layout):
    """SDXL img2img/inpaint run vae.to(float32) and vae.to(the UNet's dtype) when force_upcast is set: 'Casting a
    quantized model to a new dtype is unsupported', fp8 storage lost, a float32 VAE left in fp16 beside an fp16 UNet."""
    from hf_precision.testing import PIPELINES

    row = PIPELINES["sdxl_inpaint"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = hp.load_pipeline(sdxl_inpaint_folder, "cpu", layout=layout, quantize={component: storage})
    row.ready(pipe)
    outs = []
    report = hp.check(pipe, call=lambda p: outs.append(p(**row.call_kwargs(num_inference_steps=1))))
    assert report.ok, str(report)
    assert torch.isfinite(torch.as_tensor(row.result(outs[0]))).all()


def test_nan_guard_reruns_an_fp8_stored_unet_with_islands(sdxl_inpaint_folder):
    """The islands' output casts follow the guard's switch to float32 as the entry does: they kept handing bf16 to
    the fp8-stored layers now computing in float32 ('mat1 and mat2 must have the same dtype', SDXL's UNet)."""
    from hf_precision.testing import PIPELINES

    row = PIPELINES["sdxl_inpaint"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = hp.load_pipeline(sdxl_inpaint_folder, "cpu", layout="cpu-amx", quantize={"unet": "float8_e4m3fn"},
                                overrides={"unet": {"nan_guard": True}})
    row.ready(pipe)
    with torch.no_grad():
        pipe.unet.add_embedding.linear_2.bias.fill_(float("inf"))  # an fp32 island: no dtype fixes it, fp32 is tried
    with pytest.warns(RuntimeWarning, match="unet produced non-finite values in bfloat16; re-ran it in float32"):
        pipe(**row.call_kwargs(num_inference_steps=1))
    assert pipe.unet.dtype == torch.float32


def test_fp8_storage_keeps_the_vae_layer_pipelines_read_the_latents_dtype_from():
    """The x4 upscaler (and SDXL) cast latents to `post_quant_conv`'s parameter dtype before decoding: stored fp8 it
    made fp8 latents ('"div_cpu_reduced_float" not implemented for Float8_e5m2'); it stays in the compute dtype."""
    from hf_precision.runtime.layout import planned_dtypes
    from hf_precision.testing import make_pipeline

    vae = make_pipeline("sd_upscale").vae
    plan = hp.get_recipe("sd_upscale", device="cpu", overrides={"vae": {"storage": "float8_e5m2"}})["vae"]
    planned = planned_dtypes(vae, plan, [])
    assert planned["post_quant_conv.weight"] == plan.compute and "float8_e5m2" in planned.values()


def test_torchao_config_of_a_diffusers_model_says_nothing_of_torchaos_own():
    """`--set unet.storage=int8` printed torchao 0.18's 'Config Deprecation: _default is deprecated' UserWarning
    (a path into site-packages) on every generate and train; `_default` is what its FqnToConfig documents for 'every
    Linear but these', so the config is built with that one warning silenced and nothing else."""
    from hf_precision import get_recipe
    from hf_precision.runtime.quantize import backend_config

    plan = get_recipe("unet.sdxl", device="cpu", overrides={"unet": {"storage": "int8"}})["unet"]
    module = torch.nn.ModuleDict({"proj_out": torch.nn.Linear(2, 2), "blocks": torch.nn.Linear(2, 2)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = backend_config(plan, module, [])
    assert [str(w.message) for w in caught] == []
    assert type(config).__name__ == "TorchAoConfig" and config.quant_type.fqn_to_config["proj_out"] is None

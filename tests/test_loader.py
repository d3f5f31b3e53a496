"""load_pipeline / apply_recipe end to end on tiny pipelines saved to disk and loaded offline."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import hf_precision as hp
from hf_precision.recipe import resolve
from hf_precision.testing.pipelines import example_call_kwargs, example_img2img_kwargs
from checks import assert_finite, assert_plan_bytes, assert_plan_dtypes, group_id, same_load

# The device table of the foundation issue: CPU without native bf16, CPU with AMX, CUDA 7.0, 7.5 (T4),
# GTX 1660, 8.0, 8.9, 9.0, MPS on macOS 13 and 15, XPU. Every layout runs here on the CPU.
DEVICES = ["cpu-avx512", "cpu-amx", "v100", "t4", "gtx1660", "a100", "l4", "h100", "m1-macos13", "m2-macos15", "arc-a770"]
KINDS = ["sdxl", "sdxl-img2img", "svd", "pixart", "dit", "sd15"]


def _run(pipe, kind):
    kwargs = example_img2img_kwargs() if kind == "sdxl-img2img" else example_call_kwargs(kind)
    return pipe(**kwargs, generator=torch.Generator().manual_seed(0))


GROUPS = [(kind, group) for kind in KINDS for group in same_load(kind.split("-")[0], DEVICES)]


@pytest.mark.parametrize("kind, devices", GROUPS, ids=group_id)
def test_every_recipe_on_every_device_layout(kind, devices, saved_pipeline):
    """Every kind under the recipe of every device of ``DEVICES``, one run per group of devices whose recipes load
    the same (tests/checks.py ``same_load``): 66 runs were 36."""
    from diffusers import StableDiffusionXLImg2ImgPipeline

    base, device = kind.split("-")[0], devices[0]
    recipe = hp.get_recipe(base, device=device)
    cls = StableDiffusionXLImg2ImgPipeline if kind == "sdxl-img2img" else None
    pipe = hp.load_pipeline(saved_pipeline(base), "cpu", recipe=recipe, pipeline_class=cls)
    for other in devices:  # the plan the others resolve to is the one loaded
        assert_plan_dtypes(pipe, hp.get_recipe(base, device=other))
    if device in ("t4", "cpu-avx512"):  # a half and a float32 layout: buffers follow the compute dtype
        assert_plan_bytes(pipe, saved_pipeline(base), device)
    assert_finite(_run(pipe, kind))
    if kind == "sdxl-img2img":
        assert type(pipe).__name__ == "StableDiffusionXLImg2ImgPipeline"


@pytest.mark.probe
def test_recipe_chosen_from_model_index_and_this_machine(saved_pipeline):
    """No recipe given: the sdxl recipe (from model_index.json) for this CPU, whose dtypes the cpu rules of
    devices.yaml pick from the flags the probe reads (bf16 with AMX, float32 without)."""
    pipe = hp.load_pipeline(saved_pipeline("sdxl"), "cpu")
    applied = hp.applied(pipe)
    assert applied.recipe.name == "sdxl"
    assert applied.recipe.device.present and applied.recipe.device == hp.device_profile("cpu")
    expected = hp.get_recipe("sdxl", device="cpu")
    assert {p.name: p.compute for p in applied.recipe.policies} == {p.name: p.compute for p in expected.policies}
    auto = hp.device_caps("cpu").auto[0]
    assert applied.recipe["unet"].compute == auto  # the UNet tolerates every dtype: it gets the CPU's first pick
    assert_plan_dtypes(pipe, applied.recipe)
    assert_finite(_run(pipe, "sdxl"))


def test_islands_hold_exact_checkpoint_values_even_from_the_fp16_variant(saved_pipeline, tiny_pipes):
    folder = saved_pipeline("sdxl", fp16_variant=True)
    pipe = hp.load_pipeline(folder, "cpu", recipe=hp.get_recipe("sdxl", device="t4"))
    reference = tiny_pipes["sdxl"].unet
    for name in ("time_embedding.linear_1.weight", "add_embedding.linear_2.bias"):
        got = pipe.unet.get_parameter(name)
        assert got.dtype == torch.float32
        assert torch.equal(got, reference.get_parameter(name)), f"{name} went through a half round trip"
    assert pipe.unet.conv_in.weight.dtype == torch.float16


def test_fp16_variant_chosen_only_for_half_plans(saved_pipeline, monkeypatch):
    from diffusers import DiffusionPipeline

    seen = []
    original = DiffusionPipeline.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        seen.append(kwargs.get("variant"))
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(DiffusionPipeline, "from_pretrained", classmethod(spy))
    folder = saved_pipeline("sdxl", fp16_variant=True)
    hp.load_pipeline(folder, "cpu", recipe=hp.get_recipe("sdxl", device="t4"))
    hp.load_pipeline(folder, "cpu", recipe=hp.get_recipe("sdxl", device="cpu-avx2"))
    assert seen == ["fp16", None]


def test_per_component_devices_get_their_own_dtypes():
    recipe = resolve("sdxl", layout={"text_encoder": "cpu-avx2", "text_encoder_2": "cpu-avx2", "default": "a100"})
    assert (recipe["text_encoder"].compute, recipe["unet"].compute, recipe["vae"].compute) == \
        ("float32", "float16", "bfloat16")
    assert recipe["unet"].resolved_for != recipe["text_encoder"].resolved_for
    assert recipe.device == hp.device_profile("a100")  # the denoiser's device names the recipe


def test_layout_runs_another_devices_plan_here(saved_pipeline, tiny_pipe):
    # "resolve for that device, place on this one" is one parameter of load_pipeline, apply_recipe and resolve.
    t4 = hp.get_recipe("sdxl", device="t4")
    pipe = hp.load_pipeline(saved_pipeline("sdxl"), "cpu", layout="t4")
    record = hp.applied(pipe)
    assert {p.name: (p.compute, p.keep_fp32) for p in record.recipe.policies} == \
        {p.name: (p.compute, p.keep_fp32) for p in t4.policies}
    assert {p.device for p in record.recipe.policies} == {"cpu"}
    assert pipe.unet.dtype == torch.float16 and pipe.vae.dtype == torch.float32
    applied = hp.apply_recipe(tiny_pipe("sdxl"), device="cpu", layout="t4")
    assert applied.recipe["unet"].compute == "float16" and applied.recipe["unet"].resolved_for == t4["unet"].resolved_for


def test_resolve_is_one_door_with_clear_errors():
    placed = resolve(pipeline_class="StableDiffusionXLPipeline", devices={"text_encoder": "cpu", "default": "cpu"})
    assert {p.device for p in placed.policies} == {"cpu"}  # every planned component, optional ones included
    assert {"text_encoder", "text_encoder_2", "unet", "vae"} <= {p.name for p in placed.policies}
    unplaced = resolve("sdxl", layout="a100")
    assert {p.device for p in unplaced.policies} == {None}
    assert unplaced == hp.get_recipe("sdxl", device="a100")  # unplaced and resolved for a100: get_recipe's answer
    with pytest.raises(hp.RecipeError, match="layout='t4'"):
        resolve("sdxl", devices="t4")  # a preset is a device you plan for: it belongs in layout=
    with pytest.raises(hp.RecipeError, match="overrides need a recipe name"):
        resolve(hp.get_recipe("sdxl"), overrides={"vae": {"dtype": "float32"}})
    with pytest.raises(hp.RecipeError, match="unknown component.*'unte'.*did you mean 'unet'"):
        resolve("sdxl", layout={"unte": "t4"})
    with pytest.raises(hp.RecipeError, match="no recipe for pipeline class"):
        resolve(pipeline_class="NoSuchPipeline")



def test_device_mapping_places_components(saved_pipeline):
    pipe = hp.load_pipeline(saved_pipeline("sdxl"), {"text_encoder": "cpu", "default": "cpu"},
                            recipe=hp.get_recipe("sdxl", device="t4"))
    assert hp.applied(pipe).devices == {c: "cpu" for c in ("text_encoder", "text_encoder_2", "unet", "vae")}
    with pytest.raises(hp.RecipeError, match="unknown component"):
        hp.load_pipeline(saved_pipeline("sdxl"), {"transformer": "cpu"})
    with pytest.raises(hp.RecipeError, match="not a device this process can place"):
        hp.load_pipeline(saved_pipeline("sdxl"), "t4")


def test_user_dtype_is_an_override(saved_pipeline):
    pipe = hp.load_pipeline(saved_pipeline("sdxl"), "cpu", dtype=torch.float16)
    assert {pipe.unet.dtype, pipe.vae.dtype, pipe.text_encoder.dtype} == {torch.float16}
    assert pipe.unet.time_embedding.linear_1.weight.dtype == torch.float32  # islands stay
    assert_finite(_run(pipe, "sdxl"))
    pipe = hp.load_pipeline(saved_pipeline("sdxl"), "cpu", torch_dtype={"vae": torch.float32, "default": torch.bfloat16})
    assert (pipe.vae.dtype, pipe.unet.dtype) == (torch.float32, torch.bfloat16)
    assert_finite(_run(pipe, "sdxl"))
    with pytest.raises(hp.RecipeError, match="not both"):
        hp.load_pipeline(saved_pipeline("sdxl"), "cpu", dtype=torch.float16, torch_dtype=torch.float16)


def test_overrides_file_and_dict(saved_pipeline, tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("schema: 1\ncomponents:\n  vae: {dtype: bfloat16}\n")
    pipe = hp.load_pipeline(saved_pipeline("sdxl"), "cpu", recipe="sdxl", overrides=[path, {"unet": {"dtype": "float16"}}])
    assert (pipe.vae.dtype, pipe.unet.dtype) == (torch.bfloat16, torch.float16)
    assert_finite(_run(pipe, "sdxl"))


def test_load_errors(saved_pipeline, tmp_path, monkeypatch):
    folder = tmp_path / "unknown"
    shutil.copytree(saved_pipeline("sdxl"), folder)
    index = json.loads((folder / "model_index.json").read_text())
    index["_class_name"] = "KandinskyPipeline"
    (folder / "model_index.json").write_text(json.dumps(index))
    # the edited index names a class whose required components the folder lacks: refused before any weight is read
    with pytest.raises(hp.RecipeError, match=r"KandinskyPipeline needs the components .*movq.*pipeline_class="):
        hp.load_pipeline(folder, "cpu")
    from diffusers import StableDiffusionXLPipeline

    pipe = hp.load_pipeline(folder, "cpu", recipe="sdxl", pipeline_class=StableDiffusionXLPipeline)
    assert hp.applied(pipe).recipe.name == "sdxl"  # the explicit recipe works

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hp.RecipeError, match=r"HF_HUB_OFFLINE is set.*load_pipeline\('\./stable-diffusion-xl-base-1.0'\)"):
        hp.load_pipeline("sdxl", "cpu")
    with pytest.raises(hp.RecipeError, match="remote"):
        hp.load_pipeline(saved_pipeline("sdxl"), "cpu", trust_remote_code=True)
    with pytest.raises(hp.RecipeError, match="model_index.json"):
        hp.load_pipeline(tmp_path, "cpu")


def test_pickle_files_need_an_opt_in(saved_pipeline, tmp_path):
    folder = tmp_path / "bin"
    shutil.copytree(saved_pipeline("dit"), folder)
    from safetensors.torch import load_file

    for st in folder.glob("*/*.safetensors"):
        torch.save(load_file(st), st.with_name("diffusion_pytorch_model.bin"))
        st.unlink()
    with pytest.raises(hp.RecipeError, match="use_safetensors=False"):
        hp.load_pipeline(folder, "cpu", recipe=hp.get_recipe("dit", device="t4"))
    pipe = hp.load_pipeline(folder, "cpu", recipe=hp.get_recipe("dit", device="t4"), use_safetensors=False)
    assert_finite(_run(pipe, "dit"))


# ------------------------------------------------------------------ surviving what users do next


def test_model_offload_after_loading(saved_pipeline):
    pipe = hp.load_pipeline(saved_pipeline("sdxl"), "cpu", recipe=hp.get_recipe("sdxl", device="t4"))
    pipe.enable_model_cpu_offload(device="cpu")
    assert_finite(_run(pipe, "sdxl"))
    assert pipe.unet._forward_pre_hooks, "entry hooks were dropped by offloading"


def test_model_offload_before_applying(tiny_pipe):
    pipe = tiny_pipe("svd")
    pipe.enable_model_cpu_offload(device="cpu")
    recipe = hp.get_recipe("svd", device="t4")
    hp.apply_recipe(pipe, recipe)
    assert_plan_dtypes(pipe, recipe)
    assert_finite(_run(pipe, "svd"))


def _record_unet_and_island_inputs(pipe) -> list[tuple[str, torch.dtype, str]]:
    """(module, input dtype, input device type) as the UNet's first layer and its fp32 island receive them.

    The pre-hooks are registered after hf_precision's, so they see what its casts produced; accelerate's offload
    hooks run inside ``forward``, so the weights are still on ``meta`` here and only the inputs tell where and in
    what dtype the layer runs."""
    seen: list[tuple[str, torch.dtype, str]] = []
    for name in ("conv_in", "time_embedding.linear_1"):
        pipe.unet.get_submodule(name).register_forward_pre_hook(
            lambda module, args, name=name: seen.append((name, args[0].dtype, args[0].device.type)))
    return seen


def test_sequential_offload_hooks_on_cpu(saved_pipeline):
    """What enable_sequential_cpu_offload installs (accelerate.cpu_offload on every component: weights on meta,
    moved to the execution device per layer), with the CPU as execution device. diffusers itself refuses a
    CPU-only machine and turns device="cpu" into "cpu:0", which accelerate 1.15 cannot offload to; see the gpu
    test below for the real call."""
    from accelerate import cpu_offload

    recipe = hp.get_recipe("sdxl", device="t4")
    pipe = hp.load_pipeline(saved_pipeline("sdxl"), "cpu", recipe=recipe)
    for name, model in pipe.components.items():
        if isinstance(model, torch.nn.Module):
            cpu_offload(model, torch.device("cpu"), offload_buffers=len(model._parameters) > 0)
    assert pipe.unet.conv_in.weight.device.type == "meta"  # the hooks must not take the device from the weights
    seen = _record_unet_and_island_inputs(pipe)
    assert_finite(_run(pipe, "sdxl"))
    assert ("conv_in", torch.float16, "cpu") in seen and ("time_embedding.linear_1", torch.float32, "cpu") in seen
    assert_plan_dtypes(pipe, recipe)


@pytest.mark.gpu
def test_sequential_offload_on_gpu(saved_pipeline):
    # Loaded on the CPU, then streamed layer by layer to the GPU by diffusers' own call (device "cuda" -> "cuda:0").
    recipe = hp.get_recipe("sdxl", device="t4")
    pipe = hp.load_pipeline(saved_pipeline("sdxl"), "cpu", recipe=recipe)
    pipe.enable_sequential_cpu_offload(device="cuda")
    assert pipe.unet.conv_in.weight.device.type == "meta" and pipe._execution_device.type == "cuda"
    seen = _record_unet_and_island_inputs(pipe)
    assert_finite(_run(pipe, "sdxl"))
    assert ("conv_in", torch.float16, "cuda") in seen and ("time_embedding.linear_1", torch.float32, "cuda") in seen
    assert_plan_dtypes(pipe, recipe)


@pytest.mark.parametrize("how", ["module.compile", "torch.compile"])
def test_compiled_denoiser(saved_pipeline, how):
    pipe = hp.load_pipeline(saved_pipeline("sdxl"), "cpu", recipe=hp.get_recipe("sdxl", device="t4"))
    if how == "module.compile":
        pipe.unet.compile(backend="eager")
    else:
        pipe.unet = torch.compile(pipe.unet, backend="aot_eager")
    assert_finite(_run(pipe, "sdxl"))


def test_lora_loading_after_the_recipe(saved_pipeline, tmp_path, tiny_pipes):
    from diffusers import StableDiffusionXLPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    import copy

    donor = copy.deepcopy(tiny_pipes["sdxl"].unet)
    donor.add_adapter(LoraConfig(r=2, lora_alpha=2, target_modules=["to_q", "to_k", "to_v", "to_out.0"],
                                 init_lora_weights="gaussian"))
    with torch.no_grad():  # peft starts lora_B at zero: make the adapter actually change the output
        for name, param in donor.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    StableDiffusionXLPipeline.save_lora_weights(tmp_path, unet_lora_layers=get_peft_model_state_dict(donor))

    recipe = hp.get_recipe("sdxl", device="t4")
    pipe = hp.load_pipeline(saved_pipeline("sdxl"), "cpu", recipe=recipe)
    before = _run(pipe, "sdxl").images
    pipe.load_lora_weights(tmp_path)
    after = assert_finite(_run(pipe, "sdxl"))
    assert (after != before).any(), "the LoRA had no effect"
    assert pipe.unet.time_embedding.linear_1.weight.dtype == torch.float32


def test_erasing_the_plan_is_reported(saved_pipeline):
    pipe = hp.load_pipeline(saved_pipeline("sdxl"), "cpu", recipe=hp.get_recipe("sdxl", device="t4"))
    applied = hp.applied(pipe)
    assert applied.verify() == []
    pipe.to(torch.float16)
    problems = applied.verify()
    assert any("unet" in p and "island" in p for p in problems), problems
    assert any(p.startswith("vae:") and "float16" in p for p in problems), problems
    assert_finite(_run(pipe, "sdxl"))  # the lazy hooks still keep it running


def test_applying_twice_does_not_stack_and_remove_restores(tiny_pipe):
    pipe = tiny_pipe("sdxl")
    forward = pipe.unet.forward
    first = hp.apply_recipe(pipe, hp.get_recipe("sdxl", device="t4"), device="cpu")
    counts = (len(pipe.unet._forward_pre_hooks), len(pipe.unet.time_embedding._forward_hooks))
    second = hp.apply_recipe(pipe, hp.get_recipe("sdxl", device="t4"), device="cpu")
    assert (len(pipe.unet._forward_pre_hooks), len(pipe.unet.time_embedding._forward_hooks)) == counts == (1, 1)
    assert first.removed and not second.removed
    second.remove()
    assert not pipe.unet._forward_pre_hooks and not pipe.unet.time_embedding._forward_hooks
    assert pipe.unet.forward == forward
    assert hp.applied(pipe.unet) is None


def test_shared_components_do_not_stack(tiny_pipe):
    from diffusers import StableDiffusionXLImg2ImgPipeline

    pipe = tiny_pipe("sdxl")
    recipe = hp.get_recipe("sdxl", device="t4")
    hp.apply_recipe(pipe, recipe, device="cpu")
    img2img = StableDiffusionXLImg2ImgPipeline(**pipe.components)
    hp.apply_recipe(img2img, recipe, device="cpu")
    assert len(pipe.unet._forward_pre_hooks) == 1
    assert_finite(img2img(**example_img2img_kwargs(), generator=torch.Generator().manual_seed(0)))


def test_strict_island_patterns(tiny_pipe):
    pipe = tiny_pipe("sdxl")
    with pytest.raises(hp.RecipeError, match=r"time_embeding.*did you mean.*time_embedding"):
        hp.apply_recipe(pipe, "sdxl", device="cpu", overrides={"unet": {"dtype": "float16", "keep_fp32": ["time_embeding"]}})


def test_components_are_streamed_into_their_dtypes(saved_pipeline, tiny_pipes, monkeypatch):
    """A component whose files hold another dtype is read tensor by tensor straight into its planned dtype; one
    whose files already hold it is mapped by from_pretrained (file-backed pages, as plain diffusers does), and an
    fp32 component reads the full-precision files even when the rest come from the fp16 variant."""
    from hf_precision.runtime import load as loader

    streamed = {}
    original = loader._stream_components
    monkeypatch.setattr(loader, "_stream_components", lambda *a, **k: streamed.update(original(*a, **k)) or dict(streamed))
    t4 = hp.get_recipe("sdxl", device="t4")
    pipe = hp.load_pipeline(saved_pipeline("sdxl"), "cpu", recipe=t4)  # fp32 files
    assert sorted(streamed) == ["text_encoder", "text_encoder_2", "unet"]  # cast on the way in; the fp32 vae is not
    assert all(pipe.components[name] is module for name, module in streamed.items())

    streamed.clear()
    pipe = hp.load_pipeline(saved_pipeline("sdxl", fp16_variant=True), "cpu", recipe=t4)
    # the fp16 variant files hold the half components' dtype (mapped); the fp32 vae is read from the full files
    assert sorted(streamed) == ["vae"]
    reference = tiny_pipes["sdxl"]
    for key, value in pipe.vae.state_dict().items():
        assert value.dtype == torch.float32 and torch.equal(value, reference.vae.state_dict()[key]), key
    for key, value in pipe.unet.state_dict().items():
        want = reference.unet.state_dict()[key]
        if key.startswith(("time_embedding.", "add_embedding.")):
            assert value.dtype == torch.float32 and torch.equal(value, want), key
        else:
            assert value.dtype == torch.float16 and torch.equal(value, want.half()), key
    assert_finite(_run(pipe, "sdxl"))


def test_unexpected_files_fall_back_to_from_pretrained(saved_pipeline, tmp_path):
    """A checkpoint whose keys do not match the model (renamed layout) is left to diffusers/transformers."""
    from safetensors.torch import load_file, save_file

    from hf_precision.runtime.stream import stream_component

    folder = tmp_path / "renamed"
    shutil.copytree(saved_pipeline("dit"), folder)
    file = next((folder / "transformer").glob("*.safetensors"))
    save_file({f"model.{k}": v for k, v in load_file(file).items()}, file)
    assert stream_component("diffusers", "DiTTransformer2DModel", folder / "transformer", variant=None,
                            target=lambda key, dtype: torch.float16) is None


@pytest.mark.parametrize("mode", ["tiling", "slicing"])
def test_tiled_and_sliced_decoding_cross_the_vae_boundary(saved_pipeline, mode):
    """An fp32 VAE beside fp16 latents (the T4 layout) also decodes through the tiled and sliced paths.

    Plain diffusers fails on this layout: rows S6 and S13 of docs/facts.md#f11-layout-table.
    """
    from diffusers import DiffusionPipeline

    plain = DiffusionPipeline.from_pretrained(saved_pipeline("sdxl"), dtype={"default": torch.float16, "vae": torch.float32})
    getattr(plain.vae, f"enable_{mode}")()
    if mode == "tiling":
        plain.vae.tile_sample_min_size, plain.vae.tile_latent_min_size = 16, 8  # tiles on a 32x32 image
    with pytest.raises(RuntimeError, match=r"Input type \(c10::Half\) and bias type \(float\)"):
        _run(plain, "sdxl")

    pipe = hp.load_pipeline(saved_pipeline("sdxl"), "cpu", recipe=hp.get_recipe("sdxl", device="t4"))
    getattr(pipe.vae, f"enable_{mode}")()
    if mode == "tiling":
        pipe.vae.tile_sample_min_size, pipe.vae.tile_latent_min_size = 16, 8
    calls = []
    pipe.vae.decoder.register_forward_pre_hook(lambda m, args: calls.append(args[0].dtype))
    assert_finite(_run(pipe, "sdxl"))
    assert calls and set(calls) == {torch.float32}
    if mode == "tiling":
        assert len(calls) > 1, "the decoder was not called per tile"


def test_integer_inputs_and_timesteps_are_never_cast(saved_pipeline):
    """Entry casts touch floating activations only: token ids stay int64, the (fractional) timestep stays fp32."""
    pipe = hp.load_pipeline(saved_pipeline("sdxl"), "cpu", recipe=hp.get_recipe("sdxl", device="cpu-avx2",
                                                                              overrides={"unet": {"dtype": "float16"}}))
    seen = {}

    def unet_inputs(module, args, kwargs):
        seen["sample"], seen["timestep"] = args[0].dtype, args[1].dtype
        seen["text"] = kwargs["encoder_hidden_states"].dtype
        seen["added"] = {k: v.dtype for k, v in kwargs["added_cond_kwargs"].items()}

    def text_inputs(module, args, kwargs):
        seen["ids"] = (args[0] if args else kwargs["input_ids"]).dtype

    pipe.unet.register_forward_pre_hook(unet_inputs, with_kwargs=True)  # runs after the entry cast
    pipe.text_encoder.register_forward_pre_hook(text_inputs, with_kwargs=True)
    out = _run(pipe, "sdxl")
    assert seen["sample"] == seen["text"] == torch.float16  # latents arrive fp32 (te2 is fp32) and are cast
    assert set(seen["added"].values()) == {torch.float16}
    assert seen["timestep"] == torch.float32, "the timestep must reach the sinusoidal projection uncast"
    assert seen["ids"] == torch.int64
    assert_finite(out)


def test_loading_leaves_no_upstream_source_in_linecache(saved_pipeline):
    # load_pipeline reads diffusers' own source (the ftfy stand-in, the tiling probe, from_pretrained's keywords);
    # inspect.getsource keeps each file it reads in linecache for the process's life: 1.6 MB on the SDXL load
    import inspect
    import linecache

    from diffusers import DiffusionPipeline

    folder = saved_pipeline("sdxl")
    hp.load_pipeline(folder, "cpu")  # the first load imports; linecache may hold files from imports or warnings
    linecache.clearcache()
    hp.load_pipeline(folder, "cpu")
    kept = [name for name in linecache.cache if "diffusers" in name]
    assert kept == [], f"files left in linecache by a load: {kept}"
    inspect.getsource(DiffusionPipeline.from_pretrained)  # what the load did before, once per read
    assert any("diffusers" in name for name in linecache.cache)

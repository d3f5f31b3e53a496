"""Single-file checkpoints (what ComfyUI / A1111 / Civitai users hold) as a pipeline's denoiser:
``load_pipeline("finetune.safetensors", device, base=folder)``.

The files are built here, offline: a tiny denoiser with weights of its own ("the fine-tune", so the base folder's
weights can be told apart) saved with safetensors in the diffusers layout, and for the SDXL UNet in the original
LDM/SGM layout too: its keys mapped back by ``to_ldm_unet``, a mapping checked against diffusers' own converter
(``convert_ldm_unet_checkpoint`` must give back the very same state dict; hf_precision.testing.ldm_file), with the
``model.diffusion_model.``
prefix of whole checkpoints and without it (ComfyUI's ``models/unet`` files). Before this, every such file was
refused ("base= is for a GGUF file, but ... is not a .gguf file").
"""

from __future__ import annotations

import warnings

import pytest
import torch
from safetensors.torch import save_file

import hf_precision as hp
from hf_precision.errors import RecipeError
from hf_precision.runtime.quantize import module_bytes
from hf_precision.testing.ldm_file import sdxl_checkpoint, to_ldm_unet, to_ldm_vae

LAYOUT = "t4"  # fp16 compute with fp32 islands and an fp32 VAE: every kind of dtype in one pipeline, run on the CPU


def _finetune(model: torch.nn.Module, seed: int = 1) -> dict[str, torch.Tensor]:
    """The model's state dict moved off its own weights (fp32, contiguous), as a fine-tune's would be."""
    gen = torch.Generator().manual_seed(seed)
    return {k: (v + 0.01 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v).contiguous()
            for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def sdxl(tmp_path_factory):
    """(base folder, the fine-tune's state dict, the UNet's config, a folder for files) of the tiny SDXL pipeline."""
    from hf_precision.testing import make_pipeline, save_pipeline

    pipe = make_pipeline("sdxl")
    tmp = tmp_path_factory.mktemp("single_file")
    return save_pipeline(pipe, tmp / "base"), _finetune(pipe.unet), dict(pipe.unet.config), tmp


def _load(path, folder, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hp.load_pipeline(path, "cpu", base=folder, layout=LAYOUT, **kwargs)


def _check_planned(pipe, name: str, state: dict[str, torch.Tensor], islands_planned: bool = True) -> None:
    """Every component holds the dtypes the recipe plans; the denoiser the file's values, its islands exactly."""
    applied = hp.applied(pipe)
    for plan in applied.recipe.policies:
        module = getattr(pipe, plan.name, None)
        if not isinstance(module, torch.nn.Module):
            continue
        islands = applied.islands.get(plan.name, [])
        for key, param in module.named_parameters():
            inside = any(key.startswith(i + ".") for i in islands)
            assert param.dtype == (torch.float32 if inside else getattr(torch, plan.storage)), (plan.name, key)
    model = getattr(pipe, name)
    islands = applied.islands[name]
    assert bool(islands) == islands_planned
    for key, value in model.state_dict().items():
        exact = any(key.startswith(i + ".") for i in islands)
        assert torch.equal(value, state[key].to(value.dtype)) and (not exact or torch.equal(value, state[key])), key


def _runs(pipe, row: str = "sdxl") -> None:
    from hf_precision.testing import PIPELINES

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = pipe(**PIPELINES[row].call_kwargs(num_inference_steps=1), generator=torch.Generator().manual_seed(0))
    res = PIPELINES[row].result(out)
    assert torch.isfinite(torch.as_tensor(res).float()).all()


def test_diffusers_layout_unet_loads_in_planned_dtypes_and_runs(sdxl):
    folder, state, _, tmp = sdxl
    path = tmp / "finetune.safetensors"
    save_file(state, path)
    pipe = _load(path, folder)
    _check_planned(pipe, "unet", state)
    assert f"loaded from the single file {path} (diffusers layout): unet float16; islands float32 as stored; the " \
        f"rest from {folder}" in hp.applied(pipe).actions
    # the plan reads the file's header and counts what loading gave
    planned = hp.plan(path, device=LAYOUT, base=folder)
    assert planned.source.startswith(str(path))
    assert {c: p.total_bytes for c, p in planned.components.items()} == \
        {c: module_bytes(getattr(pipe, c)) for c in planned.components}
    _runs(pipe)


@pytest.mark.parametrize("prefix", ["model.diffusion_model.", ""], ids=["whole-checkpoint keys", "comfyui unet"])
def test_original_ldm_layout_unet_is_converted_by_diffusers(sdxl, prefix):
    folder, state, config, tmp = sdxl
    path = tmp / f"ldm{len(prefix)}.safetensors"
    save_file({k: v.half() for k, v in to_ldm_unet(state, config, prefix).items()}, path)  # stored fp16, as most are
    pipe = _load(path, folder)
    _check_planned(pipe, "unet", {k: v.half().float() for k, v in state.items()})
    assert any("(original layout, converted by diffusers)" in a for a in hp.applied(pipe).actions)
    _runs(pipe)


def test_a_file_of_another_size_or_model_is_one_error_before_loading(sdxl):
    from diffusers import UNet2DConditionModel

    from hf_precision.testing import make_pipeline

    folder, _, config, tmp = sdxl
    wider = UNet2DConditionModel.from_config({**config, "block_out_channels": [16, 32], "norm_num_groups": 8})
    path = tmp / "wider.safetensors"
    save_file(wider.state_dict(), path)
    for call in (lambda: hp.load_pipeline(path, "cpu", base=folder), lambda: hp.plan(path, device="cpu", base=folder)):
        with pytest.raises(RecipeError) as info:
            call()
        text = str(info.value)
        assert len(text.splitlines()) == 1 and str(path) in text and "not the unet of" in text
        assert "conv_in.weight is [16, 4, 3, 3] in the file, the base's UNet2DConditionModel has [8, 4, 3, 3]" in text
        assert "fine-tuned from" in text
    flux = tmp / "flux.safetensors"
    save_file(make_pipeline("flux").transformer.state_dict(), flux)
    with pytest.raises(RecipeError, match=r"flux.safetensors: not the unet \(UNet2DConditionModel\) of .*base: "
                                          r".*fine-tuned from"):
        hp.load_pipeline(flux, "cpu", base=folder)


def test_whole_sd15_checkpoint_loads_every_component_in_its_planned_dtype(tmp_path):
    """An SD 1.5 whole checkpoint (UNet, VAE and CLIP text encoder in the original layout, stored fp16 as most are)
    with base= giving the configs: each component diffusers finds in the file is read in its own planned dtype; the
    tokenizer and scheduler come from base."""
    from hf_precision.testing import make_pipeline, save_pipeline

    pipe = make_pipeline("sd15")
    folder = save_pipeline(pipe, tmp_path / "base")
    unet, vae = _finetune(pipe.unet, 1), _finetune(pipe.vae, 2)
    text = _finetune(pipe.text_encoder, 3)
    whole = {**to_ldm_unet(unet, dict(pipe.unet.config)), **to_ldm_vae(vae, dict(pipe.vae.config)),
             **{"cond_stage_model.transformer.text_model." + k: v for k, v in text.items()}}
    path = tmp_path / "sd15-finetune.safetensors"
    save_file({k: v.half() if v.is_floating_point() else v for k, v in whole.items()}, path)
    loaded = _load(path, folder)
    _check_planned(loaded, "unet", {k: v.half().float() for k, v in unet.items()}, islands_planned=False)
    for name, state in (("vae", vae), ("text_encoder", text)):
        for key, value in getattr(loaded, name).state_dict().items():
            if value.is_floating_point():
                assert torch.equal(value, state[key].half().to(value.dtype)), (name, key)
    line = next(a for a in hp.applied(loaded).actions if "loaded from the whole checkpoint" in a)
    assert "(VAE and text encoder beside the denoiser)" in line and "unet float16" in line
    assert "vae " in line and "text_encoder " in line
    assert hp.plan(path, device=LAYOUT, base=folder).source.startswith(str(path))
    _runs(loaded, "sd15")


@pytest.fixture(scope="module")
def sdxl_whole(tmp_path_factory):
    """(the whole checkpoint, its base folder, the source pipeline) of a tiny SDXL written as Civitai ships one: UNet,
    VAE, CLIP-L under ``conditioner.embedders.0.transformer.`` and OpenCLIP-bigG under ``conditioner.embedders.1.model.``
    (in_proj q/k/v, transposed text_projection), stored fp16. The second encoder is wider than the first, as in every
    SDXL (768 and 1280), which is how diffusers tells the two apart."""
    from hf_precision.testing import make_pipeline, save_pipeline

    pipe = make_pipeline("sdxl", size={"text_encoder_2": {"hidden_size": 16, "projection_dim": 16,
                                                          "intermediate_size": 32}})
    tmp = tmp_path_factory.mktemp("sdxl_whole")
    folder = save_pipeline(pipe, tmp / "base")
    for seed, name in enumerate(("unet", "vae", "text_encoder", "text_encoder_2"), 1):  # the fine-tune's own weights
        getattr(pipe, name).load_state_dict(_finetune(getattr(pipe, name), seed))
    path = tmp / "sdxl-finetune.safetensors"
    save_file({k: v.half().contiguous() for k, v in sdxl_checkpoint(pipe).items()}, path)
    return path, folder, pipe


def test_whole_sdxl_checkpoint_loads_as_plain_diffusers_reads_it_in_planned_dtypes(sdxl_whole):
    """hp.load_pipeline(file, base=) gives every component the values plain StableDiffusionXLPipeline.from_single_file
    gives (the file's), each in the dtypes the recipe plans, the OpenCLIP encoder included; the plan reads the file
    and one call runs."""
    from diffusers import StableDiffusionXLPipeline

    path, folder, source = sdxl_whole
    ours = _load(path, folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = StableDiffusionXLPipeline.from_single_file(str(path), config=str(folder), local_files_only=True)
    applied = hp.applied(ours)
    for name in ("unet", "vae", "text_encoder", "text_encoder_2"):
        want = {k: v.half().float() for k, v in getattr(source, name).state_dict().items()}
        for key, value in getattr(ours, name).state_dict().items():
            assert torch.equal(value.float(), want[key]), (name, key)
            assert torch.equal(getattr(plain, name).state_dict()[key].float(), want[key]), (name, key)
        plan = applied.recipe[name]
        islands = applied.islands.get(name, [])
        for key, param in getattr(ours, name).named_parameters():
            inside = any(key.startswith(i + ".") for i in islands)
            assert param.dtype == (torch.float32 if inside else getattr(torch, plan.storage)), (name, key)
    line = next(a for a in applied.actions if "loaded from the whole checkpoint" in a)
    assert "(VAE and text encoders beside the denoiser)" in line and "text_encoder_2 float16" in line
    assert hp.plan(path, device=LAYOUT, base=folder).source.startswith(str(path))
    _runs(ours)


def test_whole_sdxl_checkpoint_with_encoders_of_one_width_is_refused_not_half_read(sdxl_whole, tmp_path):
    """Two encoders as wide as each other: diffusers reads the second from the first one's keys and leaves its
    text_projection on the meta device (plain diffusers then fails mid-call); one error at load instead."""
    from hf_precision.testing import make_pipeline, save_pipeline

    pipe = make_pipeline("sdxl")  # both encoders 8 wide
    path = tmp_path / "same-width.safetensors"
    save_file(sdxl_checkpoint(pipe), path)
    with pytest.raises(RecipeError, match=r"same-width.safetensors: diffusers read its text_encoder_2 "
                                          r"\(CLIPTextModelWithProjection\) from the keys of another text encoder.*"
                                          r"text_projection.weight"):
        _load(path, save_pipeline(pipe, tmp_path / "base"))


def test_pickle_files_are_refused_with_the_way_out(sdxl):
    folder, _, _, tmp = sdxl
    for name, base in (("finetune.ckpt", folder), ("finetune.pt", None)):
        with pytest.raises(RecipeError, match=r"is a pickle file, which is refused .* weights_only=True"):
            hp.load_pipeline(tmp / name, "cpu", base=base)
    with pytest.raises(RecipeError, match=r"a single-file checkpoint holds one model, not a pipeline; .* base="):
        hp.load_pipeline(tmp / "finetune.safetensors", "cpu")


@pytest.mark.parametrize("row", ["flux", "sd3", "wan"])
def test_diffusers_layout_transformers_load(tmp_path, row):
    """The same for the transformer denoisers diffusers reads from a single file."""
    from hf_precision.testing import PIPELINES, make_pipeline, save_pipeline

    source = make_pipeline(row)
    name = hp.get_recipe(PIPELINES[row].recipe, device="cpu").denoiser
    folder = save_pipeline(source, tmp_path / "base")
    state = _finetune(getattr(source, name))
    path = tmp_path / f"{row}.safetensors"
    save_file(state, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = hp.load_pipeline(path, "cpu", base=folder, layout="cpu-amx")
    PIPELINES[row].ready(pipe)
    model = getattr(pipe, name)
    islands = hp.applied(pipe).islands[name]
    for key, value in model.state_dict().items():
        if value.is_floating_point():
            inside = any(key.startswith(i + ".") for i in islands)
            assert torch.equal(value, state[key].to(value.dtype)) and (value.dtype == torch.float32) == inside, key
    _runs(pipe, row)


def test_cli_generate_plan_and_check_take_the_file_with_base(sdxl, capsys):
    """`generate FILE --base FOLDER` writes the picture, `plan` prints the plan, `check` runs it clean; a bad file is
    one line on stderr and exit 2, no traceback."""
    from hf_precision.cli import main

    folder, state, _, tmp = sdxl
    path = tmp / "cli-finetune.safetensors"
    save_file(state, path)
    out = tmp / "cat.png"
    assert main(["generate", str(path), "--base", str(folder), "--prompt", "a cat", "--steps", "1", "--height", "32",
                 "--width", "32", "--layout", LAYOUT, "--device", "cpu", "--out", str(out)]) == 0
    assert out.is_file()
    assert main(["plan", str(path), "--base", str(folder), "--device", LAYOUT]) == 0
    printed = capsys.readouterr().out
    assert f"{path} + {folder}" in printed and "unet" in printed
    assert main(["check", str(path), "--base", str(folder), "--layout", LAYOUT, "--device", "cpu"]) == 0
    assert "unet" in capsys.readouterr().out
    assert main(["plan", str(tmp / "x.ckpt"), "--base", str(folder), "--device", LAYOUT]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pickle file" in err and "Traceback" not in err


def test_cli_calibrate_takes_the_file_with_base(sdxl, capsys):
    """`calibrate FILE --base FOLDER` measures the file's denoiser, not the base's: the file's UNet overflows fp16
    in its time embedding (the base's does not), so the naive half run is not finite and the islands name it."""
    import json

    from diffusers import UNet2DConditionModel

    from hf_precision.cli import main
    from hf_precision.testing.calibration import plant_time_embedding

    folder, state, config, tmp = sdxl
    unet = UNet2DConditionModel.from_config(config)
    unet.load_state_dict(state)
    planted = plant_time_embedding(unet, "time_embedding")
    path = tmp / "overflowing.safetensors"
    save_file({k: v.contiguous() for k, v in unet.state_dict().items()}, path)
    out = tmp / "islands.yaml"
    assert main(["calibrate", str(path), "--base", str(folder), "--layout", LAYOUT, "--device", "cpu", "--steps", "1",
                 "--height", "32", "--width", "32", "--out", str(out), "--no-progress", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["errors"]["naive"]["finite"] is False and report["errors"]["islands"]["finite"] is True
    assert any(planted[0].startswith(i) for i in report["islands"]["unet"]), report["islands"]
    assert out.is_file()
    # the same refusals as generate/check/plan, one line before loading
    assert main(["calibrate", str(tmp / "x.ckpt"), "--base", str(folder), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pickle file" in err
    assert main(["calibrate", str(path), "--device", "cpu"]) == 2
    assert "--base stabilityai/stable-diffusion-xl-base-1.0" in capsys.readouterr().err


def test_quantized_storage_of_a_single_file_denoiser_is_the_planned_one(tmp_path):
    """quantize= applies to the file's denoiser as to a folder's: diffusers' from_single_file takes the torchao config
    but leaves the layers float, so the loader quantizes the planned ones; the plan's bytes hold."""
    from hf_precision.runtime.quantize_load import quantized_in
    from hf_precision.testing import PIPELINES, make_pipeline, save_pipeline

    pytest.importorskip("torchao")
    source = make_pipeline("flux")
    folder = save_pipeline(source, tmp_path / "base")
    path = tmp_path / "flux.safetensors"
    save_file(_finetune(source.transformer), path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = hp.load_pipeline(path, "cpu", base=folder, layout="cpu-amx", quantize={"transformer": "int8"})
    actions = hp.applied(pipe).actions
    assert "transformer: int8 via torchao (Int8WeightOnlyConfig): 20 Linear layers quantized, as planned" in actions
    assert not [a for a in actions if "has no weights for" in a] and len(quantized_in(pipe.transformer)) == 20
    planned = hp.plan(path, device="cpu-amx", base=folder, overrides={"transformer": {"storage": "int8"}})
    assert planned["transformer"].total_bytes == module_bytes(pipe.transformer)
    _runs(pipe, "flux")


def _sparse_safetensors(path, shapes: dict) -> object:
    """A safetensors file of these F16 tensor shapes whose data is a hole (nothing written): a real header and size."""
    import json
    import math

    header, offset = {}, 0
    for key, shape in shapes.items():
        size = 2 * math.prod(shape)
        header[key] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)
    return path


def test_plan_checks_a_real_size_ldm_unet_from_its_header_alone(tmp_path):
    """An SDXL-size UNet in the LDM layout, as a sparse file (its header and the size of 2.6 G fp16 weights, no byte
    written): plan(file, base="sdxl") checks it through diffusers' converter on meta tensors and reads no weight;
    against SD 1.5's configs it is one error naming the first tensor that differs."""
    from hf_precision.runtime.meta import build_on_meta
    from hf_precision.runtime.source import configs_of

    _, _, configs = configs_of("sdxl")
    meta = build_on_meta("diffusers", "UNet2DConditionModel", configs["unet"])
    ldm = to_ldm_unet(meta.state_dict(), configs["unet"])
    path = _sparse_safetensors(tmp_path / "sdxl-unet.safetensors", {k: tuple(v.shape) for k, v in ldm.items()})
    planned = hp.plan(path, device="t4", base="sdxl")
    assert planned.source.startswith(f"{path} + ") and planned["unet"].params == 2_567_463_684
    with pytest.raises(RecipeError, match=r"sdxl-unet.safetensors: not the unet of sd15: down_blocks.1.attentions.0."
                                          r"proj_in.weight is \[640, 640\] in the file, the base's "
                                          r"UNet2DConditionModel has \[640, 640, 1, 1\] \(176 tensor"):
        hp.plan(path, device="t4", base="sd15")


def to_bfl_flux(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A diffusers FluxTransformer2DModel state dict in Black Forest Labs' layout (the flux1-dev.safetensors keys):
    fused qkv / linear1, ``scale`` for the RMSNorm weights, the final modulation's halves swapped. Written here, not
    copied: the caller checks it with diffusers' ``convert_flux_transformer_checkpoint_to_diffusers``."""
    renames = {"time_text_embed.timestep_embedder.linear_1": "time_in.in_layer",
               "time_text_embed.timestep_embedder.linear_2": "time_in.out_layer",
               "time_text_embed.text_embedder.linear_1": "vector_in.in_layer",
               "time_text_embed.text_embedder.linear_2": "vector_in.out_layer",
               "time_text_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
               "time_text_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
               "context_embedder": "txt_in", "x_embedder": "img_in", "proj_out": "final_layer.linear"}
    double = {"norm1.linear": "img_mod.lin", "norm1_context.linear": "txt_mod.lin", "attn.norm_q": "img_attn.norm.query_norm",
              "attn.norm_k": "img_attn.norm.key_norm", "attn.norm_added_q": "txt_attn.norm.query_norm",
              "attn.norm_added_k": "txt_attn.norm.key_norm", "ff.net.0.proj": "img_mlp.0", "ff.net.2": "img_mlp.2",
              "ff_context.net.0.proj": "txt_mlp.0", "ff_context.net.2": "txt_mlp.2", "attn.to_out.0": "img_attn.proj",
              "attn.to_add_out": "txt_attn.proj"}
    single = {"norm.linear": "modulation.lin", "attn.norm_q": "norm.query_norm", "attn.norm_k": "norm.key_norm",
              "proj_out": "linear2"}
    fused = {"transformer_blocks": {"img_attn.qkv": ["attn.to_q", "attn.to_k", "attn.to_v"],
                                    "txt_attn.qkv": ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"]},
             "single_transformer_blocks": {"linear1": ["attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"]}}
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        module, _, leaf = key.rpartition(".")
        if module == "norm_out.linear":  # diffusers holds (scale, shift), BFL (shift, scale)
            scale, shift = value.chunk(2, dim=0)
            out[f"final_layer.adaLN_modulation.1.{leaf}"] = torch.cat([shift, scale])
        elif module in renames:
            out[f"{renames[module]}.{leaf}"] = value
        else:
            kind, index, inner = module.split(".", 2)
            block = f"{'double' if kind == 'transformer_blocks' else 'single'}_blocks.{index}"
            table = double if kind == "transformer_blocks" else single
            if inner in table:
                out[f"{block}.{table[inner]}.{'scale' if 'norm' in inner and 'linear' not in inner else leaf}"] = value
    for key in state:  # the fused projections, in the order BFL stacks them
        kind, _, rest = key.partition(".")
        index, _, inner = rest.partition(".")
        for target, parts in fused.get(kind, {}).items():
            leaf = inner.rpartition(".")[2]
            if inner == f"{parts[0]}.{leaf}":
                block = f"{'double' if kind == 'transformer_blocks' else 'single'}_blocks.{index}"
                out[f"{block}.{target}.{leaf}"] = torch.cat([state[f"{kind}.{index}.{p}.{leaf}"] for p in parts])
    return out


def test_plan_checks_a_real_size_bfl_flux_file_from_its_header_alone(tmp_path):
    """FLUX.1-schnell's transformer (the `flux` alias) in BFL's layout, as a sparse file: plan(file,
    base="flux") reads it through diffusers' Flux converter on meta tensors (it fixes Flux's width at 3072, so no tiny
    Flux can be converted); a file with one block less is one error naming what it lacks."""
    from diffusers.loaders.single_file_utils import convert_flux_transformer_checkpoint_to_diffusers as convert

    from hf_precision.runtime.meta import build_on_meta
    from hf_precision.runtime.source import configs_of

    _, _, configs = configs_of("flux")
    state = build_on_meta("diffusers", "FluxTransformer2DModel", configs["transformer"]).state_dict()
    bfl = to_bfl_flux(state)
    back = convert(dict(bfl))
    assert {k: v.shape for k, v in back.items()} == {k: v.shape for k, v in state.items()}, "to_bfl_flux disagrees"
    path = _sparse_safetensors(tmp_path / "flux1-schnell.safetensors", {k: tuple(v.shape) for k, v in bfl.items()})
    planned = hp.plan(path, device="a100", base="flux")
    assert planned.source.startswith(f"{path} + ") and planned["transformer"].params == sum(v.numel() for v in state.values())
    short = {k: tuple(v.shape) for k, v in bfl.items() if not k.startswith("single_blocks.37.")}
    with pytest.raises(RecipeError, match=r"not the transformer \(FluxTransformer2DModel\) of flux: read in the "
                                          r"original layout it lacks 14 of the 1156 tensors \(first: "
                                          r"single_transformer_blocks.37.attn.norm_k.weight"):
        hp.plan(_sparse_safetensors(tmp_path / "short.safetensors", short), device="a100", base="flux")


def test_cli_train_takes_the_file_with_base(sdxl, tmp_path, capsys, monkeypatch):
    """`train --model FILE --base FOLDER` trains a LoRA on the file's UNet (kohya and OneTrainer train from single
    files), loadable by plain diffusers; `train --plan` plans it as its base; a pickle is refused before loading."""
    from diffusers import StableDiffusionXLPipeline
    from PIL import Image

    import hf_precision.runtime.load as load
    from hf_precision.cli import main

    folder, state, _, tmp = sdxl
    path = tmp / "train-finetune.safetensors"
    save_file(state, path)
    data = tmp_path / "photos"
    data.mkdir()
    for n in range(2):
        Image.new("RGB", (32, 32), (40 * n, 120, 200)).save(data / f"{n}.png")
        (data / f"{n}.txt").write_text("a photo of a cat")
    loaded = []
    monkeypatch.setattr(load, "load_pipeline", lambda *a, **k: loaded.append(_real_load(*a, **k)) or loaded[-1])
    out = tmp_path / "lora"
    assert main(["train", "--model", str(path), "--base", str(folder), "--data", str(data), "--out", str(out),
                 "--steps", "1", "--resolution", "32", "--device", "cpu", "--layout", LAYOUT, "--lora-rank", "2",
                 "--quiet"]) == 0
    assert torch.equal(loaded[0].unet.conv_in.weight, state["conv_in.weight"].half())  # the file's weights, not the base's
    pipe = StableDiffusionXLPipeline.from_pretrained(folder)
    pipe.load_lora_weights(str(out))
    assert any("lora_B" in k for k in pipe.unet.state_dict())
    assert main(["train", "--plan", "--model", str(path), "--base", str(folder), "--device", LAYOUT]) == 0
    assert "training plan:" in capsys.readouterr().out
    assert main(["train", "--model", str(tmp / "x.ckpt"), "--base", str(folder), "--data", str(data), "--out",
                 str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pickle file" in err


def test_cli_video_takes_the_file_with_base(saved_pipeline, tmp_path, monkeypatch):
    """`video --model FILE --base FOLDER` (a Wan fine-tune or a ComfyUI transformer file) makes the clip with the
    file's transformer; the frame and size rules and the memory plan are the base's."""
    from diffusers import WanTransformer3DModel

    import hf_precision.runtime.load as load
    from hf_precision.cli import main

    folder = saved_pipeline("wan")
    state = _finetune(WanTransformer3DModel.from_pretrained(folder / "transformer"))
    path = tmp_path / "wan-finetune.safetensors"
    save_file(state, path)
    loaded = []
    monkeypatch.setattr(load, "load_pipeline", lambda *a, **k: loaded.append(_real_load(*a, **k)) or loaded[-1])
    out = tmp_path / "clip.gif"
    assert main(["video", "--model", str(path), "--base", str(folder), "--prompt", "a cat", "--out", str(out),
                 "--height", "32", "--width", "32", "--frames", "5", "--steps", "1", "--device", "cpu",
                 "--quiet"]) == 0
    weight = loaded[0].transformer.patch_embedding.weight
    assert out.is_file() and torch.equal(weight, state["patch_embedding.weight"].to(weight.dtype))
    assert main(["video", "--demo", "--base", str(folder), "--out", str(tmp_path / "d.gif")]) == 2


_real_load = hp.load_pipeline


def test_base_problems_name_the_flag_on_the_command_line_and_the_keyword_in_python(tmp_path, capsys):
    """`--base` with a folder model: the command line said "pass a diffusers folder without base=" (the Python
    spelling); each reader now gets the spelling they typed (hf_precision.errors.arg, set once by the CLI)."""
    from hf_precision.cli import main

    folder = tmp_path / "sdxl"
    folder.mkdir()
    for argv in (["train", "--plan", "--model", str(folder), "--base", "./other", "--device", "cpu"],
                 ["calibrate", str(folder), "--base", "./other", "--device", "cpu", "--out", str(tmp_path / "i.yaml")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "pass a diffusers folder without --base" in err, err
        assert "base=" not in err, err
    with pytest.raises(RecipeError, match="pass a diffusers folder without base=, or the file"):
        hp.load_pipeline(str(folder), "cpu", base="./other")

"""What a denoiser is called with is recipe data (recipes/denoisers.yaml): a bad value is one clear RecipeError, a
row names only registered builders (one module each, or a user's own), and a new image or video family is added
with YAML alone; training and the video memory plan then build its call with the same code."""

from __future__ import annotations

import pytest
import torch
import yaml

import hf_precision as hp
from hf_precision.recipe.calls import check_denoisers
from hf_precision.recipe.files import recipes_dir
from hf_precision.training import denoiser_rows, inputs
from hf_precision.training.inputs import BUILDERS, builder


def _file(**row):
    return {"schema": 1, "kind": "denoisers", "denoisers": {"MyDiT": {"latent_arg": "hidden_states",
                                                                     "source": "pipeline_my.py", **row}}}


@pytest.mark.parametrize("row, message", [
    ({"layout": "vidoe"}, "denoisers.MyDiT.layout: bad value 'vidoe'; allowed: image, video, frames_first, channels_last; did you mean 'video'?"),
    ({"extras": ["guidanse"]}, "denoisers.MyDiT.extras[0]: no registered builder 'guidanse'; allowed: "),
    ({"optional": {"clip_img": ["image_embeds", "tokens@dim"]}}, "denoisers.MyDiT.optional: bad value"),
    ({"timestep_scale": "1000"}, "denoisers.MyDiT.timestep_scale: bad value '1000'; allowed: a positive number, e.g. 1000.0"),
    ({"latent_arg": None}, "denoisers.MyDiT.latent_arg: bad value None; allowed: a Python identifier"),
    ({"timestep_sacle": 1.0}, "denoisers.MyDiT.timestep_sacle: unknown key 'timestep_sacle'; allowed: "),
])
def test_a_bad_row_value_is_one_recipe_error_naming_file_key_value_and_allowed(row, message):
    with pytest.raises(hp.RecipeError) as err:
        check_denoisers(_file(**row), "my.yaml", BUILDERS)
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(f"my.yaml: {message}"), err.value


@pytest.mark.parametrize("row, message", [
    ({"spatial": "2 ** len(block_out_channels", "temporal": 1}, "latents.MyVAE.spatial: bad value '2 ** len(block_out_"
                                                               "channels'; allowed: a whole number above 0 or a formula"),
    ({"spatial": "__import__('os').getpid()", "temporal": 1}, "latents.MyVAE.spatial: bad value \"__import__('os')"),
    ({"spatial": 8, "temporal": 0}, "latents.MyVAE.temporal: bad value 0; allowed: a whole number above 0 or a "),
    ({"spatial": 8, "temporal": 4, "tempral": 4}, "latents.MyVAE.tempral: unknown key 'tempral'; allowed: defaults, "),
])
def test_a_bad_latents_row_is_one_recipe_error_naming_file_key_value_and_allowed(row, message):
    data = {**_file(), "latents": {"MyVAE": {"source": "pipeline_my.py", **row}}}
    with pytest.raises(hp.RecipeError) as err:
        check_denoisers(data, "my.yaml", BUILDERS)
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(f"my.yaml: {message}"), err.value


def test_a_users_denoisers_file_with_latents_rows_is_refused_not_ignored(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({**_file(), "latents": {"MyVAE": {"spatial": 8, "temporal": 4, "source": "x"}}}))
    with pytest.raises(hp.RecipeError, match=r"mine.yaml: latents: unknown key 'latents'; allowed: denoisers, kind"):
        denoiser_rows.add_rows(str(path))


def test_vae_factors_are_the_latents_rows_and_a_config_they_do_not_fit_is_a_clear_error(monkeypatch):
    from hf_precision.memory import geometry

    assert geometry.vae_factors("AutoencoderKLLTXVideo", {"patch_size": 2}) == (16, 8)  # its defaults fill the rest
    assert geometry.vae_factors("AutoencoderKLNew", {"block_out_channels": [8, 8]}) == (2, 1)  # no row: `other`
    rows = {**geometry._rows(), "AutoencoderKLNew": {"spatial": 8, "temporal": "time_ratio * 2", "source": "x"}}
    monkeypatch.setattr(geometry, "_rows", lambda: rows)
    assert geometry.vae_factors("AutoencoderKLNew", {"time_ratio": 3}) == (8, 6)
    with pytest.raises(hp.RecipeError, match=r"AutoencoderKLNew: recipes/denoisers.yaml latents: latents formula "
                                             r"'time_ratio \* 2' does not fit the VAE config"):
        geometry.vae_factors("AutoencoderKLNew", {})


def test_every_shipped_row_names_registered_builders_and_every_builder_is_used():
    rows = check_denoisers(yaml.safe_load((recipes_dir() / "denoisers.yaml").read_text()), "denoisers.yaml", BUILDERS)
    used = {name for row in rows.values() for name in row.get("extras", ())}
    assert used == set(BUILDERS)


def test_each_shipped_builder_is_the_module_named_by_its_registered_name():
    import pkgutil

    modules = {m.name for m in pkgutil.iter_modules(inputs.__path__)} - {"registry"}
    both = {**BUILDERS, **inputs.CONDITIONS}  # input builders and condition builders: one module each
    assert modules == set(both) and not set(BUILDERS) & set(inputs.CONDITIONS)
    assert {name: both[name].__module__ for name in modules} == {name: f"{inputs.__name__}.{name}" for name in modules}


def test_every_shipped_condition_builder_is_used_and_an_unknown_one_is_refused(tmp_path):
    from hf_precision.training import add_rows

    used = {name for row in denoiser_rows.ROWS.values() for name in row.condition.values()}
    assert used == set(inputs.CONDITIONS)
    path = tmp_path / "mine.yaml"
    path.write_text("schema: 1\nkind: denoisers\ndenoisers:\n  MyDiT: {latent_arg: hidden_states, source: x.py, "
                    "condition: {MyPipeline: inpaint_mask_}}\n")
    with pytest.raises(hp.RecipeError, match=r"mine.yaml: denoisers.MyDiT.condition.MyPipeline: no registered "
                                             r"condition builder 'inpaint_mask_'; allowed: .*did you mean 'inpaint_mask'"):
        add_rows(str(path))


@pytest.mark.parametrize("name", ["my-ids", "2x", "", None])
def test_a_builder_name_no_row_could_give_is_one_recipe_error(name):
    with pytest.raises(hp.RecipeError) as err:
        builder(name)
    assert str(err.value).startswith(f"builder({name!r}): bad name; allowed: a Python identifier") and "\n" not in str(err.value)


def _row_file(tmp_path, shipped: str, new: str, **changes):
    """A user's denoisers file: the shipped row of ``shipped`` copied under the class name ``new``, with ``changes``."""
    row = {**yaml.safe_load((recipes_dir() / "denoisers.yaml").read_text())["denoisers"][shipped], **changes}
    path = tmp_path / f"{new}.yaml"
    path.write_text(yaml.safe_dump({"schema": 1, "kind": "denoisers", "denoisers": {new: row}}), encoding="utf-8")
    return str(path)


def _new_family(monkeypatch, tmp_path, parent: type, new: str, **changes) -> tuple[type, str]:
    """A model class no row knows (its parent's row taken out), and the YAML file that adds it (the parent's row, with
    ``changes``)."""
    monkeypatch.setattr(denoiser_rows, "ROWS", {k: v for k, v in denoiser_rows.ROWS.items() if k != parent.__name__})
    cls = type(new, (parent,), {"__module__": __name__})
    return cls, _row_file(tmp_path, parent.__name__, new, **changes)


def _train(pipe, denoiser):
    """prepare_training on a pipeline class no recipe lists (composed, as for inference), and 2 LoRA steps."""
    from diffusers import DiffusionPipeline

    from training_checks import run_steps

    class MyPipeline(DiffusionPipeline):
        def __init__(self, transformer, vae, scheduler):
            super().__init__()
            self.register_modules(transformer=transformer, vae=vae, scheduler=scheduler)

    tp = hp.prepare_training(MyPipeline(transformer=denoiser, vae=pipe.vae, scheduler=pipe.scheduler), layout="cpu",
                             train={"transformer": "lora"})
    run_steps(tp, denoiser_rows.example_batch(denoiser, 1), steps=2)


@pytest.mark.filterwarnings("ignore:MyPipeline")
def test_a_new_image_family_with_yaml_alone_trains(monkeypatch, tmp_path):
    from hf_precision.testing import make_pipeline

    pipe = make_pipeline("sd3", seed=0)
    cls, path = _new_family(monkeypatch, tmp_path, type(pipe.transformer), "NewImageTransformer")
    denoiser = cls.from_config(pipe.transformer.config)
    denoiser.load_state_dict(pipe.transformer.state_dict())
    with pytest.raises(hp.RecipeError, match="NewImageTransformer .*no training row"):
        denoiser_rows.row_of(denoiser)
    assert denoiser_rows.add_rows(path) == ["NewImageTransformer"]
    _train(pipe, denoiser)


def _video_recipe(tmp_path, **video):
    """A user's pipeline recipe for the tiny Latte pipeline: the shipped one with its own ``video:`` block."""
    data = yaml.safe_load((recipes_dir() / "latte.yaml").read_text())
    data["video"] = video
    path = tmp_path / "my_video.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


@pytest.mark.filterwarnings("ignore:MyPipeline")
def test_a_new_video_family_with_yaml_alone_trains_and_gets_a_video_plan(monkeypatch, tmp_path):
    from hf_precision.apps.video.spec import spec_of
    from hf_precision.apps.video.plan import denoiser_call
    from hf_precision.memory.peaks import denoise_peak
    from hf_precision.testing import make_pipeline

    pipe = make_pipeline("latte", seed=0)
    cls, path = _new_family(monkeypatch, tmp_path, type(pipe.transformer), "NewVideoTransformer")
    denoiser = cls.from_config(pipe.transformer.config)
    frames = pipe.transformer.config.video_length
    # its sampling facts: the recipe's video block (the shipped Latte one says 512x512, 50 steps, 120 tokens, batch 2)
    recipe = _video_recipe(tmp_path, defaults={"height": 16, "width": 24, "steps": 7}, text_length=9, cfg_batch=1)
    spec = spec_of(pipe, recipe=recipe)
    assert (spec.row.name, spec.defaults["steps"], spec.defaults["height"], spec.defaults["width"]) == \
        (recipe, 7, 16, 24)
    assert (spec.text_length(), spec.row.cfg_batch, spec.row.decode) == (9, 1, "video")  # decode: devices.yaml's
    with pytest.raises(hp.RecipeError, match="NewVideoTransformer has no row in recipes/denoisers.yaml"):
        denoiser_call(spec, denoiser, torch.float32, 32, 32, frames)
    denoiser_rows.add_rows(path)
    _train(pipe, denoiser)
    on_meta = cls.from_config(pipe.transformer.config).to("meta")
    call = denoiser_call(spec, on_meta, torch.float32, 32, 32, frames)
    assert call["hidden_states"].device.type == "meta" and call["hidden_states"].shape[0] == 1
    assert tuple(call["encoder_hidden_states"].shape[:2]) == (1, 9)
    assert denoise_peak(on_meta, lambda: denoiser_call(spec, on_meta, torch.float32, 32, 32, frames)) > 0


@pytest.mark.parametrize("video, message", [
    ({"cfg_batch": 3}, "video.cfg_batch: bad value 3; allowed: 1 (the pipeline calls the denoiser once per half"),
    ({"decode": "frame"}, "video.decode: bad value 'frame'; allowed: video, frames; did you mean 'frames'?"),
    ({"defaults": {"height": 480, "fps": 8}}, "video.defaults.fps: unknown key 'fps'; allowed: frames, height, steps, "
                                               "width"),
    ({"defaults": {"height": -480}}, "video.defaults.height: bad value -480; allowed: a whole number, 0 or more"),
    ({"text_lenght": 64}, "video.text_lenght: unknown key 'text_lenght'; allowed: call_frames, call_frames_note, "
                                 "call_max_frames, call_max_frames_note, call_options, "),
    ({"defaults": {"frames": 0}}, "video.defaults.frames: 0 takes the count from the denoiser config's frames_key"),
    ({"refused_latent_frames": [0, 2]}, "video.refused_latent_frames: bad value [0, 2]; allowed: a list of latent "
                                        "frame counts"),
    ({"classes": {"LatePipeline": {"cfg_batch": 1}}}, "video.classes.LatePipeline: unknown class 'LatePipeline'; "
                                                      "this recipe names LattePipeline; did you mean 'LattePipeline'?"),
    ({"classes": {"LattePipeline": {"cfg_batch": 3}}}, "video.classes.LattePipeline.cfg_batch: bad value 3"),
    ({"classes": [1]}, "video.classes: expected pipeline class -> video keys, got [1]"),
    ({"default_call_args": {"overlap-history": 1}}, "video.default_call_args: bad value {'overlap-history': 1}; "
                                                    "allowed: call keyword -> plain value"),
])
def test_a_bad_video_block_value_is_one_recipe_error_naming_file_key_value_and_allowed(tmp_path, video, message):
    from hf_precision.recipe.catalog import pipeline_spec

    path = _video_recipe(tmp_path, **video)
    with pytest.raises(hp.RecipeError) as err:
        pipeline_spec(path)
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(f"{path}: {message}"), err.value


@pytest.mark.filterwarnings("ignore:MyPipeline")
def test_a_users_own_builder_named_by_a_yaml_row_feeds_the_denoiser_in_training(monkeypatch, tmp_path):
    """The documented way: register a builder in one's own code, then a denoisers file whose row names it."""
    from hf_precision.testing import make_pipeline

    pipe = make_pipeline("sd3", seed=0)
    seen, built = [], []
    cls, path = _new_family(monkeypatch, tmp_path, type(pipe.transformer), "MyIdsTransformer", extras=["my_pooled"])
    with pytest.raises(hp.RecipeError) as err:  # named before it is registered: the fix is in the message
        hp.training.add_rows(path)
    message = str(err.value)
    assert len(err.value.problems) == 1 and message.endswith("(a new one: @hf_precision.training.inputs.builder('my_pooled'))")
    assert f"denoisers.MyIdsTransformer.extras[0]: no registered builder 'my_pooled'; allowed: {', '.join(sorted(BUILDERS))}" in message
    monkeypatch.setitem(BUILDERS, "my_pooled", None)  # taken out again when the test ends

    @builder("my_pooled")
    def _my_pooled(row, module, batch, x0):
        built.append(x0.shape)
        return {"pooled_projections": x0.new_full((x0.shape[0], module.config["pooled_projection_dim"]), 0.5)}

    assert hp.training.add_rows(path) == ["MyIdsTransformer"]
    denoiser = cls.from_config(pipe.transformer.config)
    denoiser.load_state_dict(pipe.transformer.state_dict())
    denoiser.register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs.get("pooled_projections")),
                                       with_kwargs=True)
    _train(pipe, denoiser)
    assert len(built) == len(seen) >= 2
    assert all(p is not None and p.eq(0.5).all() for p in seen), "the builder's output did not reach forward"


def test_a_model_whose_denoiser_has_no_row_is_refused_before_loading_naming_the_class_and_the_fix(tmp_path, capsys):
    """`train --plan` (and `train`) read model_index.json alone: a folder with no weights at all is refused, in one
    line naming the denoiser's class and how to add a row."""
    import json

    from hf_precision.cli import main

    (tmp_path / "model_index.json").write_text(json.dumps({
        "_class_name": "OmniGenPipeline", "transformer": ["diffusers", "OmniGenTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"], "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]}))
    assert "OmniGenTransformer2DModel" not in denoiser_rows.ROWS  # HunyuanImage's, the example before, has a row now
    assert main(["train", "--plan", "--model", str(tmp_path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("hf-precision train: error: --model: OmniGenPipeline "), err
    assert "transformer: OmniGenTransformer2DModel" in err
    assert "recipes/denoisers.yaml" in err and "hf_precision.training.add_rows(path)" in err, err


@pytest.mark.parametrize("blocks", [[128, 256, 512, 512], [8, 8, 8]])
def test_magvit_vae_factors_are_the_ones_its_pipeline_reads(blocks):
    """EasyAnimate's MagVIT VAE compresses time by 2 ** (len(block_out_channels) - 2) (autoencoder_kl_magvit.py:733),
    which its pipeline reads; without a latents row the `other` rule said 1 (no temporal_compression_ratio key)."""
    import torch
    from diffusers import AutoencoderKLMagvit

    from hf_precision.memory import geometry

    n = len(blocks)
    with torch.device("meta"):
        vae = AutoencoderKLMagvit(block_out_channels=blocks, down_block_types=["SpatialDownBlock3D"] * n,
                                  up_block_types=["SpatialUpBlock3D"] * n, norm_num_groups=8)
    assert geometry.vae_factors("AutoencoderKLMagvit", dict(vae.config)) == (vae.spatial_compression_ratio,
                                                                             vae.temporal_compression_ratio)


def test_a_kandinsky5_i2v_transformer_gets_its_condition_channels_in_training():
    """Kandinsky 5 I2V (visual_cond) takes the noise, the image's latents and a mask on the last axis (2 * 16 + 1 =
    33 channels, transformer_kandinsky.py:567); training fed the 16 noise channels only and failed inside the model
    with a shape error. Without an image in the batch the condition is zeros, as for Wan I2V."""
    import torch
    from diffusers import Kandinsky5Transformer3DModel

    from hf_precision.training import call_inputs, example_batch, row_of

    torch.manual_seed(0)
    model = Kandinsky5Transformer3DModel(in_visual_dim=4, in_text_dim=8, in_text_dim2=8, time_dim=8, out_visual_dim=4,
                                         model_dim=8, ff_dim=8, num_text_blocks=1, num_visual_blocks=1,
                                         axes_dims=(2, 2, 4), visual_cond=True)
    row = row_of(model)
    kwargs = call_inputs(row, model, example_batch(model))
    assert kwargs["hidden_states"].shape[-1] == 9
    out = model(**kwargs).sample
    assert out.shape == kwargs["hidden_states"][..., :4].shape and torch.isfinite(out).all()

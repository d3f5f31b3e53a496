"""hf-precision calibrate: planted fp16 overflows in tiny SDXL, SD3 and Wan pipelines are found, and fixed by islands.

Each pipeline has weights scaled so that known modules overflow fp16 while the float32 run stays sane
(hf_precision/testing/calibration.py). A test checks the failure without the islands (an fp16 run that is not
finite, loaded independently of calibrate) and its absence with them, that the islands are the planted modules or
their parents, and that they cost fewer bytes than keeping the whole component in float32.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import yaml
import torch

import hf_precision as hp
from hf_precision.cli import main
from hf_precision.diagnose.calibration import memory
from hf_precision.recipe.patterns import inside
from hf_precision.runtime.apply import apply_recipe
from hf_precision.testing import PIPELINES, example_call_kwargs, make_pipeline, make_sdxl, save_pipeline
from hf_precision.testing.calibration import (module_bytes, plant_t5_feed_forward, plant_time_embedding,
                                              plant_vae_up_block)

pytestmark = pytest.mark.filterwarnings("ignore")
HALF_DELTA = 4 - 2  # bytes an fp32 island adds per value over float16


def _frames(out):
    value = getattr(out, "images", None)
    return np.asarray(out.frames if value is None else value, dtype=np.float64)


def _run(pipe, kwargs):
    return _frames(pipe(**kwargs, generator=torch.Generator().manual_seed(0)))


def _covers(islands, planted):
    """Every planted module is inside an island, and every island holds a planted module."""
    return (all(any(inside(p, [i]) for i in islands) for p in planted)
            and all(any(inside(p, [i]) for p in planted) for i in islands))


@pytest.fixture(scope="module")
def sdxl_folder(tmp_path_factory):
    pipe = make_sdxl()
    planted = plant_vae_up_block(pipe.vae, block=0, resnets=(0, 1))
    return save_pipeline(pipe, tmp_path_factory.mktemp("sdxl_planted")), planted, module_bytes(pipe.vae, HALF_DELTA)


def test_sdxl_vae_up_block_cli(sdxl_folder, tmp_path, capsys):
    folder, planted, vae_bytes = sdxl_folder
    out = tmp_path / "islands.yaml"
    kwargs = {**example_call_kwargs("sdxl"), "num_inference_steps": 1}
    rc = main(["calibrate", str(folder), "--device", "t4", "--run-on", "cpu", "--steps", "1", "--height", "32",
               "--width", "32", "--out", str(out), "--no-progress", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and out.is_file()
    islands = report["islands"]["vae"]
    assert _covers(islands, planted), (islands, planted)
    assert all(inside(i, ["decoder.up_blocks.0"]) for i in islands)  # the up block, never the whole decoder
    assert set(report["islands"]) == {"vae"} and not report["whole"]
    assert 0 < report["extra_bytes"] < vae_bytes
    assert report["errors"]["naive"]["finite"] is False and report["errors"]["islands"]["finite"] is True

    # The shipped T4 recipe keeps the whole VAE in fp32: the measured islands are a subset, and the output says so.
    assert hp.get_recipe("sdxl", device="t4")["vae"].compute == "float32"
    assert any(n.startswith(f"vae.{i}: inside what the recipe keeps in float32") for i in islands for n in report["notes"])
    # ... and the file says why it departs from the dtypes the recipe tolerates (bf16, fp32 for the SDXL VAE), and
    # keeps the NaN guard on for it (issue 25 item 9: it used to write `dtype: float16` without a word).
    written = yaml.safe_load(out.read_text())["components"]["vae"]
    assert written["dtype"] == "float16" and written["nan_guard"] is True
    assert "tolerates bfloat16, float32 only" in written["why"], written["why"]

    # Independently of calibrate: the fp16 VAE without islands overflows, the written file fixes it.
    no_guard = {"vae": {"dtype": "float16", "nan_guard": False}}
    broken = hp.load_pipeline(folder, "cpu", layout="t4", overrides=no_guard)
    assert not np.isfinite(_run(broken, kwargs)).all()
    fixed = hp.load_pipeline(folder, "cpu", layout="t4", overrides=[str(out), no_guard])
    assert fixed.vae.dtype == torch.float16 and hp.applied(fixed).islands["vae"] == islands
    assert np.isfinite(_run(fixed, kwargs)).all()


def test_sd3_t5_feed_forward():
    pipe = make_pipeline("sd3")
    planted = plant_t5_feed_forward(pipe.text_encoder_3)
    before = {k: v.clone() for k, v in pipe.text_encoder_3.state_dict().items()}
    kwargs = PIPELINES["sd3"].call_kwargs(num_inference_steps=1)
    result = hp.calibrate(pipe, "t4", kwargs, progress=False)

    # The island is the feed-forward around the planted `wo`: its input (a product inside the feed-forward) is what
    # leaves the range, so `wo` alone (what the T5 recipe and transformers keep in fp32) cannot hold it.
    assert result.islands == {"text_encoder_3": ["encoder.block.1.layer.1.DenseReluDense"]}
    assert _covers(result.islands["text_encoder_3"], planted)
    assert not result.errors["naive"].finite and result.finite
    assert 0 < result.extra_bytes < module_bytes(pipe.text_encoder_3, HALF_DELTA)
    # calibrate hands the pipeline back as it found it
    assert pipe.text_encoder_3.dtype == torch.float32
    assert all(torch.equal(before[k], v) for k, v in pipe.text_encoder_3.state_dict().items())

    # The recipe's own T4 layout (wo in fp32) does not fix this overflow; the override does.
    no_guard = {"text_encoder_3": {"nan_guard": False}}
    apply_recipe(pipe, device="cpu", layout="t4", overrides=[{"text_encoder_3": {"dtype": "float16"}}, no_guard])
    assert not np.isfinite(_run(pipe, kwargs)).all()
    pipe = make_pipeline("sd3")
    plant_t5_feed_forward(pipe.text_encoder_3)
    apply_recipe(pipe, device="cpu", layout="t4", overrides=[result.overrides(), no_guard])
    assert np.isfinite(_run(pipe, kwargs)).all()


def test_naive_run_keeps_torchs_norm_fallback_notice_to_itself():
    """The all-half "before" run halves the norms Krea 2 keeps fp32 itself (`_keep_in_fp32_modules`), and its code
    hands them fp32 input; torch's "Mismatch dtype between input and weight" notice went to the user's stderr
    (the command sweep's krea2 calibrate FAIL). The recipe's own layouts never meet it."""
    import warnings

    kwargs = PIPELINES["krea2"].call_kwargs(num_inference_steps=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = hp.calibrate(make_pipeline("krea2"), "t4", kwargs, progress=False)
    assert result.finite
    assert not [w for w in caught if "Mismatch dtype" in str(w.message)], [str(w.message)[:80] for w in caught]


def test_wan_time_embedding(tmp_path):
    pipe = make_pipeline("wan")
    planted = plant_time_embedding(pipe.transformer)
    kwargs = PIPELINES["wan"].call_kwargs(num_inference_steps=1)
    result = hp.calibrate(pipe, "t4", kwargs, progress=False)

    assert result.islands == {"transformer": ["condition_embedder.time_embedder"]}
    assert _covers(result.islands["transformer"], planted)
    assert not result.errors["naive"].finite and result.finite
    whole = module_bytes(pipe.transformer, HALF_DELTA)
    # The shipped Wan recipe already keeps the time embedder fp32 (recipes/components/video.yaml, video.wan): the
    # measured island is the recipe's own, so it costs nothing beyond the recipe, and is far below the whole.
    assert module_bytes(pipe.transformer.condition_embedder.time_embedder, HALF_DELTA) < whole
    assert "condition_embedder.time_embedder" in hp.get_recipe("wan", device="t4")["transformer"].keep_fp32
    assert result.extra_bytes == 0
    evidence = result.evidence["transformer"]["condition_embedder.time_embedder"][0]
    assert evidence.module == planted[0] and evidence.max_abs > 65504 and evidence.step.startswith("step ")

    path = result.write(tmp_path / "wan.yaml")
    text = path.read_text()
    assert "condition_embedder.time_embedder" in text and f"{evidence.max_abs:.3g}" in text
    apply_recipe(pipe, device="cpu", layout="t4", overrides=[str(path), {"transformer": {"nan_guard": False}}])
    assert pipe.transformer.condition_embedder.time_embedder.linear_1.weight.dtype == torch.float32
    assert pipe.transformer.proj_out.weight.dtype == torch.float16
    assert np.isfinite(_run(pipe, kwargs)).all()


def test_refuses_what_does_not_fit(sdxl_folder, monkeypatch):
    folder, _, _ = sdxl_folder
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1000)
    with pytest.raises(hp.RecipeError, match="reference='bfloat16'") as err:
        hp.calibrate(folder, "t4", run_on="cpu", progress=False)
    assert "available" in str(err.value) and "Traceback" not in str(err.value)


def test_target_the_layout_cannot_compute():
    assert "bfloat16" not in hp.device_caps("t4").compute
    with pytest.raises(hp.RecipeError, match="cannot be computed"):
        hp.calibrate(make_pipeline("wan"), "t4", PIPELINES["wan"].call_kwargs(), target="bfloat16", progress=False)


def test_session_hands_back_what_a_run_that_raised_changed():
    from diffusers import AutoencoderKL

    from hf_precision.diagnose.calibration.session import Session

    class Pipe:  # what the session reads: components, and diffusers' progress bar settings
        def __init__(self):
            torch.manual_seed(0)
            self.components = {"vae": AutoencoderKL(block_out_channels=(8,), norm_num_groups=8, latent_channels=2,
                                                    sample_size=8, force_upcast=True)}

        def set_progress_bar_config(self, **kwargs):
            self._progress_bar_config = kwargs

    pipe = Pipe()
    vae = pipe.components["vae"]
    vae.register_buffer("seen", torch.zeros(2))
    before = {k: (v.clone(), v.data_ptr()) for k, v in vae.state_dict().items()}

    def run(p):  # casts (parameters and buffers), flips force_upcast, writes a buffer, then fails
        assert p._progress_bar_config == {"disable": True}
        p.components["vae"].to(torch.float16).register_to_config(force_upcast=False)
        p.components["vae"].seen.add_(1.0)
        raise RuntimeError("the run failed")

    with Session(pipe, restore=True) as session:
        with pytest.raises(RuntimeError, match="the run failed"):
            session.run(run, seed=0)
        assert vae.config.force_upcast is True and vae.decoder.conv_out.weight.dtype == torch.float32
    after = vae.state_dict()
    assert all(torch.equal(after[k], v) and after[k].dtype == v.dtype and after[k].data_ptr() == ptr
               for k, (v, ptr) in before.items())
    assert vae.config.force_upcast is True and not hasattr(pipe, "_progress_bar_config")


def test_calibrate_runs_flux_kontext_at_the_asked_size():
    """Flux Kontext fits its output to max_area (1024**2) and its input image to a ~1 MP training size, whatever
    --height/--width say: the sweep's 32-pixel Kontext calibrate encoded a 1024-pixel image (tens of minutes on a
    CPU). The asked size is the size run, output and input image."""
    from PIL import Image

    from hf_precision.diagnose.calibration.method import _call_kwargs

    class Kontext:  # what _call_kwargs reads of a pipeline: its __call__ signature (diffusers' defaults)
        def __call__(self, image=None, prompt=None, height=None, width=None, num_inference_steps=28,
                     max_area=1024 ** 2, _auto_resize=True):
            pass

    kwargs = _call_kwargs(Kontext(), None, None, Image.new("RGB", (640, 480)), 2, (32, 48))
    assert (kwargs["height"], kwargs["width"], kwargs["max_area"]) == (32, 48, 32 * 48)
    assert kwargs["image"].size == (48, 32) and kwargs["_auto_resize"] is False
    assert "max_area" not in _call_kwargs(Kontext(), None, None, Image.new("RGB", (64, 64)), 2, (None, None))


def test_calibrate_refuses_steps_that_leave_an_img2img_call_no_step():
    """SDXL img2img (the refiner) runs the last int(steps x strength 0.3) steps: the sweep's --steps 2 ran none and
    failed inside the VAE on an empty batch (a traceback); refused in one line with the steps that run."""
    from PIL import Image

    from hf_precision.diagnose.calibration.method import _call_kwargs
    from hf_precision.errors import RecipeError

    from diffusers import StableDiffusionXLImg2ImgPipeline

    class Refiner:  # what _call_kwargs reads of a pipeline: its __call__ signature (diffusers' defaults) and the
        get_timesteps = StableDiffusionXLImg2ImgPipeline.get_timesteps  # steps its strength leaves (diagnose/steps.py)

        def __call__(self, prompt=None, image=None, strength=0.3, num_inference_steps=50):
            pass

    with pytest.raises(RecipeError, match=r"--steps 2: Refiner denoises 0 of 2 steps at strength 0.3 .*use --steps 4 or more"):
        _call_kwargs(Refiner(), None, None, Image.new("RGB", (32, 32)), 2, (None, None))
    assert _call_kwargs(Refiner(), None, None, Image.new("RGB", (32, 32)), 4, (None, None))["num_inference_steps"] == 4


def test_half_runs_keep_the_recipes_islands_where_the_recipe_computes_float32():
    """Kandinsky 5's recipe computes its transformer in fp32 without bf16 and keeps `time_embeddings` fp32 in a half
    layout, which the model needs (it feeds fp32 sinusoids to it): calibrate's float16 runs on a T4 keep that island
    (a float16 `time_embeddings` raised a dtype mismatch)."""
    kwargs = PIPELINES["kandinsky5"].call_kwargs(num_inference_steps=1, num_frames=1, height=16, width=16)
    assert hp.get_recipe("kandinsky5", device="t4")["transformer"].compute == "float32"
    result = hp.calibrate(make_pipeline("kandinsky5"), "t4", kwargs, progress=False)
    assert result.finite
    assert "time_embeddings" in result.keep_fp32("transformer")
    assert "raised RuntimeError" in result.errors["naive"].first_nonfinite  # all-fp16, no island: the mismatch

"""`generate --image/--mask/--strength` (issue 34, "every command on every family, as a user runs it"): image-to-image,
inpainting and edit pipelines run from the command line, and every wrong input is refused in one line of ours before
any weight loads, by generate, calibrate and check alike (hf_precision/diagnose/inputs.py); one steps rule
(diagnose/steps.py ``steps_problem``) counts the steps an img2img strength leaves with the class's own code.

The tiny folders are the session's (``saved_pipeline``); every run is in this process.
"""

from __future__ import annotations

import json
import shutil

import pytest
from PIL import Image

from hf_precision.cli import main


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    """A 32-pixel input picture, an inpainting mask (white middle), a text file named .png."""
    from hf_precision.testing import example_image

    root = tmp_path_factory.mktemp("pictures")
    example_image(32).save(root / "cat.png")
    mask = Image.new("L", (32, 32), 0)
    mask.paste(255, (8, 8, 24, 24))
    mask.save(root / "mask.png")
    (root / "notes.png").write_text("not a picture\n")
    return root


def _run(argv, capsys):
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse's own refusal of an unknown flag
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


# (family, extra arguments, the size asked -> the size written (width, height))
RUNS = [
    # SD img2img takes no height/width: its input is resized to the size asked (it makes its input's size)
    ("sd_img2img", ["--image", "{cat}", "--strength", "0.75", "--height", "48", "--width", "40"], (40, 48)),
    ("sd_inpaint", ["--image", "{cat}", "--mask", "{mask}", "--height", "32", "--width", "48"], (48, 32)),
    # Kontext fits an area, not height x width (fitted_to_area): the size asked is the size made
    ("flux_kontext", ["--image", "{cat}", "--height", "32", "--width", "48"], (48, 32)),
    # Flux Fill: the mask and the masked image's latents join the transformer's channels; under the T4's layout the
    # masked image, cast to T5's dtype (pipeline_flux_fill.py:925), reaches a VAE of another dtype
    ("flux_fill", ["--image", "{cat}", "--mask", "{mask}", "--height", "48", "--width", "32", "--layout", "t4"],
     (32, 48)),
]


@pytest.mark.parametrize("kind, extra, size", RUNS, ids=[r[0] for r in RUNS])
def test_generate_runs_image_to_image_inpainting_and_edit(kind, extra, size, saved_pipeline, pictures, tmp_path,
                                                          capsys):
    """A real 2-step run of each kind writes a picture of the size asked (about 1 s each once loaded)."""
    out = tmp_path / "out.png"
    extra = [a.format(cat=pictures / "cat.png", mask=pictures / "mask.png") for a in extra]
    code, printed, err = _run(["generate", saved_pipeline(kind), "--prompt", "a cat", "--steps", "2", "--device",
                               "cpu", "--out", out, *extra], capsys)
    assert code == 0, err[-2000:]
    assert f"wrote {out}" in printed
    with Image.open(out) as picture:
        assert picture.size == size


def test_generate_without_size_keeps_the_input_size_for_img2img(saved_pipeline, tmp_path, capsys):
    """The pipeline's own rule without --height/--width: SD img2img makes its input's size (40 x 24 here)."""
    from hf_precision.testing import example_image

    picture = example_image(48).resize((40, 24))
    picture.save(tmp_path / "wide.png")
    code, _, err = _run(["generate", saved_pipeline("sd_img2img"), "--prompt", "a cat", "--steps", "2", "--device",
                         "cpu", "--image", tmp_path / "wide.png", "--out", tmp_path / "o.png"], capsys)
    assert code == 0, err[-2000:]
    with Image.open(tmp_path / "o.png") as made:
        assert made.size == (40, 24)


def test_generate_reaches_sd3_img2img_through_a_folder_saved_under_its_class(saved_pipeline, pictures, tmp_path,
                                                                           capsys):
    """StableDiffusion3Img2ImgPipeline has SD3's components (a folder it saved differs only in model_index's class):
    generate runs it from the command line under the T4's layout, where the input picture is cast to T5's dtype
    before the VAE encodes it (pipeline_stable_diffusion_3_img2img.py:680, :700, :1082); the text-to-image folder given
    --image names that class."""
    sd3 = saved_pipeline("sd3")
    img2img = shutil.copytree(sd3, tmp_path / "sd3-img2img")
    index = json.loads((img2img / "model_index.json").read_text())
    (img2img / "model_index.json").write_text(json.dumps({**index, "_class_name": "StableDiffusion3Img2ImgPipeline"}))
    out = tmp_path / "out.png"
    code, printed, err = _run(["generate", img2img, "--prompt", "a cat", "--steps", "2", "--device", "cpu",
                               "--layout", "t4", "--image", pictures / "cat.png", "--strength", "0.5", "--height",
                               "48", "--width", "32", "--out", out], capsys)
    assert code == 0 and f"wrote {out}" in printed, err[-2000:]
    with Image.open(out) as picture:
        assert picture.size == (32, 48)
    code, _, err = _run(["generate", sd3, "--prompt", "a cat", "--steps", "2", "--device", "cpu", "--image",
                         pictures / "cat.png", "--out", tmp_path / "no.png"], capsys)
    assert code == 2 and "the image-to-image pipeline of this folder is StableDiffusion3Img2ImgPipeline" in err, err


def test_check_runs_the_users_picture_and_mask(saved_pipeline, pictures, capsys):
    """check's one tiny call with the user's pictures (resized to its size) and a strength below 1 (more steps)."""
    code, printed, err = _run(["check", saved_pipeline("sd_inpaint"), "--device", "cpu", "--image",
                               pictures / "cat.png", "--mask", pictures / "mask.png", "--strength", "0.3"], capsys)
    assert code == 0 and "OK" in printed, printed + err[-2000:]


# (family, arguments, what the one error line says); {cat}, {mask}, {notes}: the pictures above
REFUSALS = [
    ("sd_img2img", [], "StableDiffusionImg2ImgPipeline needs an input image: give --image FILE"),
    ("sd15", ["--image", "{cat}"],
     "--image {cat}: StableDiffusionPipeline takes no input image (its call has no image argument); the image-to-image "
     "pipeline of this folder is StableDiffusionImg2ImgPipeline"),
    ("sd_inpaint", ["--image", "{cat}"], "StableDiffusionInpaintPipeline needs a mask (white where it repaints): give "
                                         "--mask FILE"),
    ("sd_inpaint", [], "needs an input image and a mask (white where it repaints): give --image FILE --mask FILE"),
    ("sd_img2img", ["--image", "{cat}", "--mask", "{mask}"],
     "--mask {mask}: StableDiffusionImg2ImgPipeline takes no mask; the inpainting pipeline of this folder is "
     "StableDiffusionInpaintPipeline: in Python, pipe = diffusers.AutoPipelineForInpainting.from_pipe("),
    ("sd_img2img", ["--image", "{cat}x"], "--image {cat}x: no such file"),
    ("sd_img2img", ["--image", "{notes}"], "--image {notes}: PIL cannot read it as a picture"),
    ("sd_inpaint", ["--image", "{cat}", "--mask", "{notes}"], "--mask {notes}: PIL cannot read it as a picture"),
    ("sd_img2img", ["--image", "{cat}", "--strength", "0"], "--strength 0.0: must be in (0, 1]"),
    ("sd_img2img", ["--image", "{cat}", "--strength", "1.5"], "--strength 1.5: must be in (0, 1]"),
    ("flux_kontext", ["--image", "{cat}", "--strength", "0.5"], "--strength 0.5: FluxKontextPipeline takes no strength"),
    # SDXL img2img's default strength 0.3 at 2 steps denoises int(0.6) = 0 of them: diffusers fails in the VAE
    ("sdxl_refiner", ["--image", "{cat}"], "--steps 2: StableDiffusionXLImg2ImgPipeline denoises 0 of 2 steps at "
                                           "strength 0.3"),
]


# check makes up a missing picture and chooses its own steps: those refusals are generate's and calibrate's only
CASES = [(command, *r) for command in ("generate", "calibrate", "check") for r in REFUSALS
         if command != "check" or not ("needs" in r[2] or "--steps" in r[2])]


@pytest.mark.parametrize("command, kind, args, says", CASES,
                         ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_wrong_inputs_are_refused_before_loading(command, kind, args, says, saved_pipeline, pictures, monkeypatch,
                                                 tmp_path, capsys):
    """One error line of ours, exit 2, before any weight is read, for generate, calibrate and check alike."""
    import hf_precision.diagnose.calibration.method as method
    import hf_precision.runtime.load as load

    monkeypatch.setattr(load, "load_pipeline", lambda *a, **k: pytest.fail("loaded a model"))
    monkeypatch.setattr(method, "open_pipeline", lambda *a, **k: pytest.fail("loaded a model"))
    names = {"cat": pictures / "cat.png", "mask": pictures / "mask.png", "notes": pictures / "notes.png"}
    args = [a.format(**names) for a in args]
    extra = {"generate": ["--prompt", "a cat", "--out", tmp_path / "x.png", "--steps", "2"],
             "calibrate": ["--out", tmp_path / "x.yaml", "--steps", "2"], "check": []}[command]
    code, _, err = _run([command, saved_pipeline(kind), "--device", "cpu", *extra, *args], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"hf-precision {command}: error: ") and says.format(**names) in err, err
    assert not list(tmp_path.iterdir())  # nothing written


def test_one_steps_rule_counts_with_the_class_own_get_timesteps():
    """SD img2img runs int(steps x strength) steps, Flux img2img steps - int(steps x (1 - strength)): 2 steps at 0.3
    run none of SD's and one of Flux's; a class without get_timesteps (text-to-image) has no strength rule. The rule
    is the one calibrate's runs use (its own copy said 0 for both)."""
    from diffusers import FluxImg2ImgPipeline, FluxKontextPipeline, StableDiffusionImg2ImgPipeline

    from hf_precision.diagnose.call import steps_problem

    assert "denoises 0 of 2 steps at strength 0.3" in steps_problem(StableDiffusionImg2ImgPipeline, 2, 0.3)
    assert "use --steps 4 or more" in steps_problem(StableDiffusionImg2ImgPipeline, 2, 0.3)
    assert steps_problem(StableDiffusionImg2ImgPipeline, 4, 0.3) is None
    assert steps_problem(FluxImg2ImgPipeline, 2, 0.3) is None
    assert steps_problem(FluxKontextPipeline, 1) is None
    assert steps_problem(StableDiffusionImg2ImgPipeline, 1) is not None  # the call's default strength, 0.8


def test_calibrate_refuses_the_strength_its_steps_leave_nothing_of(tiny_pipe):
    """calibrate's runs (Python API, a call mapping) use the same rule and message as generate."""
    from hf_precision.diagnose.calibration.method import _call_kwargs
    from hf_precision.errors import RecipeError

    pipe = tiny_pipe("sd_img2img")
    with pytest.raises(RecipeError, match="denoises 0 of 2 steps at strength 0.3"):
        _call_kwargs(pipe, {"prompt": "a cat", "strength": 0.3}, None, None, 2, (None, None))
    assert _call_kwargs(pipe, {"prompt": "a cat", "strength": 0.6}, None, None, 2, (None, None))["strength"] == 0.6


def test_the_command_sweep_gives_image_and_mask_where_the_family_needs_them(saved_pipeline, tmp_path):
    """benchmarks/command_sweep.py runs each family as a user would: generate and calibrate get --image where the call
    needs one and --mask where it is inpainting, none where it takes neither (the sweep's run of them is
    tests/test_command_sweep.py's)."""
    import importlib.util
    import shlex

    from launch import ROOT

    spec = importlib.util.spec_from_file_location("command_sweep", ROOT / "benchmarks" / "command_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    picture, mask = tmp_path / "input.png", tmp_path / "mask.png"
    for kind, image, masked in [("sd_inpaint", True, True), ("sd_img2img", True, False), ("flux_kontext", True, False),
                                ("flux_fill", True, True), ("sd15", False, False)]:
        folder = saved_pipeline(kind)
        cls = json.loads((folder / "model_index.json").read_text())["_class_name"]
        lines = sweep.command_lines(kind, folder, cls, tmp_path, "cpu", tmp_path, picture, mask)
        for name in ("run", "calibrate"):
            tokens = shlex.split(lines[name])
            assert (str(picture) in tokens) is image and (str(mask) in tokens) is masked, (kind, lines[name])


def test_calibrate_takes_a_prompt_with_its_image_where_the_call_reads_both(saved_pipeline, pictures, monkeypatch,
                                                                          tmp_path, capsys):
    """--prompt and --image were exclusive (argparse refused both), so Kontext or img2img ran with a fixed prompt;
    now both go to a call that takes both, and --prompt to one that takes none (SVD) is refused before loading."""
    import hf_precision.diagnose.calibration as calibration
    from hf_precision.errors import RecipeError

    seen = {}

    def record(model, layout, call, **kwargs):
        seen.update(kwargs)
        raise RecipeError("stopped before the runs")

    monkeypatch.setattr(calibration, "calibrate", record)
    cat = pictures / "cat.png"
    code, _, err = _run(["calibrate", saved_pipeline("sd_img2img"), "--device", "cpu", "--prompt", "a red cat",
                         "--image", cat, "--strength", "0.5", "--out", tmp_path / "x.yaml"], capsys)
    assert code == 2 and "stopped before the runs" in err, err
    assert seen["prompt"] == "a red cat" and seen["image"].size == (32, 32) and seen["options"]["strength"] == 0.5
    # the img2img folder under SVD's class: the refusal reads the class's call, before anything loads
    svd = shutil.copytree(saved_pipeline("sd_img2img"), tmp_path / "svd")
    index = json.loads((svd / "model_index.json").read_text())
    (svd / "model_index.json").write_text(json.dumps({**index, "_class_name": "StableVideoDiffusionPipeline"}))
    code, _, err = _run(["calibrate", svd, "--device", "cpu", "--prompt", "a cat", "--image", cat,
                         "--out", tmp_path / "x.yaml"], capsys)
    assert code == 2 and err.startswith("hf-precision calibrate: error: --prompt: StableVideoDiffusionPipeline takes "
                                        "no prompt"), err


def test_a_call_that_needs_more_than_an_image_is_refused_for_all_of_it_at_once(saved_pipeline, monkeypatch, tmp_path,
                                                                               capsys):
    """Wan Animate's call needs an image and two clips: calibrate said "give --image FILE", and with --image it was
    refused again for the clips no flag gives (the command sweep's leftover). One refusal names all three."""
    import hf_precision.diagnose.calibration.method as method

    monkeypatch.setattr(method, "open_pipeline", lambda *a, **k: pytest.fail("loaded a model"))
    code, _, err = _run(["calibrate", saved_pipeline("wan_animate"), "--device", "cpu", "--out", tmp_path / "x.yaml"],
                        capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "WanAnimatePipeline needs image, pose_video and face_video for its runs" in err, err
    assert "call={'prompt': ..., 'image': ..., 'pose_video': ..., 'face_video': ...}" in err, err

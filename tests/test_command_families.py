"""Commands run as a user runs them on the families where they used to crash (issue 34, items 1, 3 and 9): each ends
with exit 0 or one error line of ours, and stderr holds only our lines.

Each test builds on the session's saved tiny folders (``saved_pipeline`` in conftest.py); a real config (LTX-Video's
scheduler) is copied over a tiny folder where the crash came from that config.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_precision.cli import EXAMPLES, main
from hf_precision.errors import RecipeError
from hf_precision.testing import PIPELINES

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIGS = Path(__file__).resolve().parents[1] / "hf_precision" / "model_configs"
# What diffusers and its dependencies may print that is not ours: loading bars (issue 34 item 7 covers --quiet) and
# the notices `hf-precision` silences itself (cli/common.py _QUIET_LOGS) but pytest's log capture re-emits.
_BAR = re.compile(r"^\s*$|\d+/\d+ \[")  # a blank line or a progress bar (transformers' loading, saving)
_NOT_OURS = re.compile(r"Loading pipeline components|Loading weights|Loading checkpoint shards|it/s\]|s/it\]")


def _noise(err: str) -> list[str]:
    """The stderr lines that are neither ours (``hf-precision ...``) nor loading bars."""
    lines = [line for part in err.splitlines() for line in part.split("\r")]
    return [line for line in lines if line.strip() and not _NOT_OURS.search(line)
            and not line.startswith("hf-precision")]


# ------------------------------------------------------------------------------------ 1: check on video families

# The command on saved folders, chosen by what differs in the configs: a list patch_size (Wan's [1, 2, 2]) and a UNet
# with a frame-wise VAE (SVD); an int patch_size (LTX, CogVideoX, HunyuanVideo) is covered in process above and by
# tests/test_command_sweep.py (LTX check), so each command pays its load once.
CHECKED = ["wan", "svd"]
# The default call on every video family of the registry but these, whose call check cannot build yet on the
# registry's in-memory pipeline: Allegro, whose
# registry tile (8x16x16, testing/hooks.py _allegro_tiling, for its own 16-pixel call) is smaller than
# diffusers' fixed 120-pixel tile overlap at check's 32 pixels (a saved folder keeps the default tile and runs:
# tests/test_command_sweep.py). Mochi (its own sigma schedule divides by zero for 1 step), Wan Animate (pose and face
# clips), Wan I2V and VACE (diffusers calls ftfy without checking that it is installed) were here, and HunyuanVideo
# I2V (its tiny tokenizer lacked the default prompt template's special tokens and its vision tower the 576 features
# the pipeline cuts out of the encoding).
NOT_YET = {"allegro"}
VIDEO = sorted(n for n, row in PIPELINES.items() if "video" in row.tags and n not in NOT_YET)


@pytest.mark.parametrize("kind", VIDEO)
def test_check_builds_a_call_for_each_video_family(kind, tiny_pipe):
    import hf_precision as hp

    report = hp.check(tiny_pipe(kind))
    assert report.error is None and report.ok, report.table()


def test_check_gives_cogvideox_the_text_length_of_its_position_table():
    """check's call passed 16 prompt tokens to every pipeline; CogVideoX's table holds max_text_seq_length text
    positions (226 in THUDM/CogVideoX-2b), and any other length failed inside diffusers (embeddings.py)."""
    import hf_precision as hp
    from hf_precision.testing import make_pipeline

    pipe = make_pipeline("cogvideox", size={"transformer": {"max_text_seq_length": 24}})
    assert pipe.transformer.config.max_text_seq_length == 24
    report = hp.check(pipe)
    assert report.error is None and report.ok, report.table()


def test_a_list_patch_size_gives_its_spatial_side():
    from hf_precision.diagnose.call import _side

    transformer = json.loads((CONFIGS / "Wan2.1-T2V-1.3B-Diffusers" / "transformer" / "config.json").read_text())
    assert transformer["patch_size"] == [1, 2, 2]

    class Model(torch.nn.Module):
        config = transformer

    class Pipe:  # the shipped real config, no weights: only the config is read
        vae_scale_factor = 8
        transformer = Model()
        components = {"transformer": transformer}

    assert _side(Pipe()) == 32  # max(32, 8 x 2 x 2)
    Model.config = {**transformer, "patch_size": [1, 4, 4]}
    assert _side(Pipe()) == 64


@pytest.mark.parametrize("kind", CHECKED)
@pytest.mark.parametrize("layout", [None, "t4"])
def test_check_runs_on_video_families(kind, layout, saved_pipeline, capfd):
    args = ["check", str(saved_pipeline(kind)), "--device", "cpu", *(["--layout", layout] if layout else [])]
    capfd.readouterr()  # what building the folder printed
    rc = main([*args, "--json"])
    out, err = capfd.readouterr()
    report = json.loads(out)
    assert rc == 0 and report["error"] is None, report
    assert not _noise(err), err


# ------------------------------------------------------------------------------------ sweep: absent components


def test_a_component_the_pipeline_lacks_is_no_note_unless_an_override_names_it(tiny_pipe, saved_pipeline):
    """wan.yaml plans image_encoder and transformer_2, which WanPipeline lacks (Flux ControlNet, HunyuanVideo I2V,
    Wan VACE and Animate each lack one their recipe plans): no 'not in this pipeline' note, unless --set asked."""
    import hf_precision as hp
    from hf_precision.recipe.overrides import Override, parse_set

    pipe = tiny_pipe("wan")
    assert pipe.components.get("transformer_2") is None and "image_encoder" not in pipe.components
    assert hp.apply_recipe(pipe, device="cpu").skipped == []
    asked = [Override("--set", parse_set(["transformer_2.dtype=float32"]))]
    assert hp.apply_recipe(pipe, device="cpu", overrides=asked).skipped == [
        "transformer_2: not in this pipeline, so --set changes nothing"]
    assert not [s for s in hp.plan(str(saved_pipeline("wan")), device="t4").skipped if "not in" in s]  # `plan` too


# ------------------------------------------------------------------------------------ sweep: library notices


def test_a_log_handler_made_during_a_held_import_writes_to_stderr_after_it(capsys):
    """diffusers and transformers make their handler on sys.stderr when first imported, which held_back had
    pointed at its own buffer: every later notice vanished in `hf-precision`, and printed in the sweep (which
    imports them first), so the two disagreed about the same command."""
    import logging

    from hf_precision.cli.quiet import held_back

    logger = logging.getLogger("hf_precision_test.held")
    logger.propagate = False
    with held_back():
        logger.addHandler(logging.StreamHandler())
    try:
        logger.warning("after the import")
        assert capsys.readouterr().err == "after the import\n"
    finally:
        logger.handlers.clear()


def test_library_notices_are_held_and_missing_weights_said_in_our_words(tmp_path, capsys):
    """Lumina 2's, QwenImage's, Wan I2V's and LTX condition's notices are about diffusers' own calls: held back, and
    written out only before a crash. transformers' load report of weights a checkpoint lacks (HunyuanDiT's BERT
    pooler) changes the outputs: one line of ours."""
    import logging

    from transformers import BertConfig, BertModel

    from hf_precision.cli.quiet import library_logs
    from hf_precision.errors import RecipeError

    config = BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8, vocab_size=16)
    BertModel(config, add_pooling_layer=False).save_pretrained(tmp_path / "text_encoder")
    notice = logging.getLogger("diffusers.pipelines.qwenimage.pipeline_qwenimage")
    with library_logs("hf-precision check"):
        notice.warning("true_cfg_scale is passed as 4.0, but classifier-free guidance is not enabled")
        BertModel.from_pretrained(tmp_path / "text_encoder")
        BertModel.from_pretrained(tmp_path / "text_encoder")  # the same report: said once
    err = capsys.readouterr().err
    assert "true_cfg_scale" not in err and "LOAD REPORT" not in err, err
    assert [line for part in err.splitlines() for line in part.split("\r") if not _BAR.search(line)] == [
        "hf-precision check: note: text_encoder (BertModel): 2 weight(s) not in its checkpoint were initialized at "
        "random: pooler.dense.bias, pooler.dense.weight"], err
    for error, shown in ((RecipeError("bad --set"), ""), (ValueError("crash"), "a notice before the crash\n")):
        with pytest.raises(type(error)), library_logs("hf-precision check"):
            notice.warning("a notice before the crash")
            raise error
        assert capsys.readouterr().err == shown


def test_a_warning_raised_in_diffusers_own_file_is_held_with_its_notices():
    """torch's "In CPU autocast, but the target dtype is not supported" from diffusers' transformer_mochi.py (a float32
    autocast diffusers asks for) printed on every Mochi check; a warning of another package still prints."""
    import warnings

    import diffusers.models.transformers.transformer_mochi as mochi

    from hf_precision.cli.common import our_warnings

    shown = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))  # as Python prints it
        with our_warnings("hf-precision check"):
            warnings.warn_explicit("In CPU autocast, but the target dtype is not supported", UserWarning,
                                   mochi.__file__, 1)
            warnings.warn_explicit("a warning of someone else", UserWarning, "/elsewhere/x.py", 1)
    assert shown == ["a warning of someone else"]


def test_check_gives_a_controlnet_its_control_image(tiny_pipe):
    """FluxControlNetPipeline takes control_image (not image): check's call gave none, and diffusers raised."""
    import hf_precision as hp

    report = hp.check(tiny_pipe("flux_controlnet"))
    assert report.error is None and report.ok, report.table()


def test_a_pipeline_that_calls_ftfy_uninstalled_cleans_prompts_as_wanpipeline_does(monkeypatch):
    """Wan I2V, VACE, Animate (and others) call ftfy.fix_text where ftfy is not installed: NameError on any prompt."""
    import diffusers.pipelines.wan.pipeline_wan_vace as vace
    import diffusers.utils

    from hf_precision.runtime.patches import ftfy_stand_in

    monkeypatch.setattr(diffusers.utils, "is_ftfy_available", lambda: False)
    monkeypatch.setitem(vars(vace), "ftfy", None)  # so the module is as it was after the test
    monkeypatch.delitem(vars(vace), "ftfy")  # as diffusers leaves it without ftfy
    with pytest.raises(NameError):
        vace.prompt_clean("a  cat")
    assert ftfy_stand_in(object.__new__(vace.WanVACEPipeline)) == [vace.__name__]
    assert vace.prompt_clean(" a  cat ") == "a cat"


def test_the_stable_cascade_decoder_loads_with_the_hubs_index(saved_pipeline, tmp_path):
    """diffusers 0.42 keeps PaellaVQModel under pipelines/deprecated/: neither the Hub's ["wuerstchen", ...] nor the
    ["diffusers", ...] it saves itself (tests/test_command_sweep.py's case) was found on load."""
    import hf_precision as hp

    folder = shutil.copytree(saved_pipeline("cascade_decoder"), tmp_path / "decoder")
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "vqgan": ["wuerstchen", "PaellaVQModel"]}))
    pipe = hp.load_pipeline(folder, "cpu", layout="t4")
    plan = hp.applied(pipe).recipe
    assert type(pipe.vqgan).__name__ == "PaellaVQModel" and "vqgan" in hp.applied(pipe).modules
    assert pipe.vqgan.dtype == getattr(torch, plan["vqgan"].storage) != torch.float32  # loaded in its planned dtype


# ------------------------------------------------------------------------------------ 2: calibrate's --device


def test_calibrate_refuses_a_preset_as_device_before_loading(saved_pipeline, capfd, monkeypatch):
    import hf_precision.diagnose.calibration.method as method

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before --device was checked")

    monkeypatch.setattr(method, "open_pipeline", no_load)
    folder = saved_pipeline("sd15")
    capfd.readouterr()
    rc = main(["calibrate", str(folder), "--device", "t4", "--out", "unused.yaml"])
    err = capfd.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "--device: 't4'" in err and "--layout t4 --device cpu" in err
    assert "layout='t4'" not in err and "(CLI:" not in err  # the fix in the spelling the user types (errors.spelled)


def test_calibrate_help_example_runs_and_help_names_device(saved_pipeline, tmp_path, capfd, monkeypatch):
    line = next(line.strip() for line in EXAMPLES.splitlines() if line.strip().startswith("hf-precision calibrate"))
    argv = line.split()[1:]
    assert "--device" not in argv or "t4" != argv[argv.index("--device") + 1]
    argv = [str(saved_pipeline("sd15")) if a.startswith("./") else a for a in argv]
    argv = [str(tmp_path / a) if a.endswith(".yaml") else a for a in argv]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # "the best present device" is this CPU on any machine
    rc = main([*argv, "--steps", "1", "--height", "32", "--width", "32", "--no-progress", "--device", "cpu"])
    assert rc in (0, 1) and (tmp_path / "islands.yaml").is_file(), capfd.readouterr().err
    capfd.readouterr()
    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    text = " ".join(capfd.readouterr().out.split())
    budget = text[text.rindex("--max-memory SIZE"):][:200]
    assert "memory budget on --device" in budget and "--run-on" not in budget


# ------------------------------------------------------------------------------------ 3, 4, 7: train --plan, train


def _images(folder: Path, n: int = 2, size: int = 32) -> Path:
    from PIL import Image

    folder.mkdir()
    for i in range(n):
        Image.fromarray(np.full((size, size, 3), 60 + 40 * i, np.uint8)).save(folder / f"i{i}.png")
        (folder / f"i{i}.txt").write_text("a cat")
    return folder


def _clips(folder: Path, n: int = 2, frames: int = 4, size: int = 32) -> Path:
    from PIL import Image

    folder.mkdir()
    for i in range(n):
        shots = [Image.fromarray(np.full((size, size, 3), 30 * f + 10 * i, np.uint8)) for f in range(frames)]
        shots[0].save(folder / f"c{i}.gif", save_all=True, append_images=shots[1:], duration=100)
        (folder / f"c{i}.txt").write_text("a clip")
    return folder


@pytest.mark.parametrize("kind", ["sd15"])  # Sana (AutoencoderDC) and SVD clips: tests/test_command_sweep.py
def test_train_plan_runs_and_prints_only_ours(kind, saved_pipeline, tmp_path, capfd):
    video = "video" in PIPELINES[kind].tags
    model = saved_pipeline(kind)
    data = _clips(tmp_path / "d") if video else _images(tmp_path / "d")
    capfd.readouterr()
    rc = main(["train", "--plan", "--model", str(model), "--data", str(data), "--out",
               str(tmp_path / "o"), "--resolution", "32", "--device", "cpu", *(["--frames", "4"] if video else [])])
    out, err = capfd.readouterr()
    assert rc == 0, err
    assert "predicted peak" in out and "VAE encode" in out
    assert not _noise(err), err  # diffusers' "should be kept in float32: [...]" from the meta cast, among others


def test_a_frame_wise_vae_encodes_a_clip_frame_by_frame(tiny_pipe, monkeypatch):
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

    import hf_precision as hp

    monkeypatch.setattr(DiagonalGaussianDistribution, "sample", lambda self, generator=None: self.mode())  # no noise

    pipe = tiny_pipe("svd")
    tp = hp.prepare_training(pipe, device="cpu", train={"unet": "lora"}, rank=2)
    clip = torch.rand(2, 3, 4, 32, 32) * 2 - 1  # (B, C, F, H, W), as the training program reads clips
    latents = tp.encode_images(clip)
    factor = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
    assert tuple(latents.shape) == (2, pipe.vae.config.latent_channels, 4, 32 // factor, 32 // factor)  # (B, C', F, ..)
    one = tp.encode_images(clip[1:2, :, 2])  # the third frame of the second clip, alone, as an image
    torch.testing.assert_close(latents[1:2, :, 2], one, rtol=1e-4, atol=1e-4)


def test_a_video_vae_encodes_an_image_as_a_clip_of_one_frame():
    """A video VAE takes (B, C, F, H, W): QwenImage's (an image model) was given training images as (B, C, H, W) and
    failed inside diffusers ("expected 5, got 4"); they go in as one-frame clips and come back as images."""
    from diffusers import AutoencoderKLQwenImage

    from hf_precision.training.encode import frame_wise, vae_latents

    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[False],
                                 latents_mean=[0.0] * 4, latents_std=[1.0] * 4).eval()
    assert not frame_wise(vae)
    images = torch.rand(2, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        latents = vae_latents(vae, images, torch.Generator().manual_seed(0))
        clip = vae_latents(vae, images.unsqueeze(2), torch.Generator().manual_seed(0))
    assert tuple(latents.shape) == (2, 4, 8, 8)
    torch.testing.assert_close(latents, clip[:, :, 0])


def test_hunyuandit_runs_at_32_pixels_and_trains_on_two_samples(tiny_pipe):
    """HunyuanDiT's pipeline sizes its rotary grid for an 8x VAE (``height // 8``): the registry's tiny one had a 1x
    VAE, so `generate`/`calibrate` at 32 pixels failed inside diffusers; and a training batch of two handed the
    size embedder an expanded (stride 0) ``image_meta_size`` that it flattens with ``.view``."""
    import hf_precision as hp
    from hf_precision.training import example_batch

    pipe = tiny_pipe("hunyuandit")
    assert pipe.vae_scale_factor == 8
    out = pipe(**PIPELINES["hunyuandit"].call_kwargs(height=32, width=32, num_inference_steps=1),
               generator=torch.Generator().manual_seed(0))
    assert out.images.shape[1:3] == (32, 32)
    tp = hp.prepare_training(pipe, device="cpu", train={"transformer": "lora"}, rank=2)
    batch = example_batch(pipe.transformer, 2, side=4)
    assert torch.isfinite(tp.loss(batch, torch.Generator().manual_seed(0)))


def test_a_mask_read_on_meta_keeps_its_values():
    """The training plan's meta step: Lumina 2 takes ``mask.sum(dim=1).tolist()``, HunyuanVideo Framepack slices the
    prompt by ``mask.sum(dim=1)[0]`` after concatenating image ones; both failed on meta ("Cannot copy out of meta
    tensor", "Tensor.item() cannot be called on meta tensors")."""
    from hf_precision.memory.counting import count_live_bytes, with_values

    mask = with_values(torch.tensor([[1, 1, 1, 0]]))
    prompt = torch.empty(1, 4, 8, device="meta")
    with count_live_bytes():
        joint = torch.cat([mask.new_ones((1, 2)), mask], dim=1)
        lengths = joint.sum(dim=1).tolist()
        kept = prompt[:, : mask.sum(dim=1, dtype=torch.int)[0]]
        flags = torch.zeros(1, 6, dtype=torch.bool, device="meta")
        flags[0, : lengths[0]] = True
        marked = int(flags.sum())
    assert lengths == [5] and tuple(kept.shape) == (1, 3, 8) and kept.device.type == "meta" and marked == 5


def test_sizes_made_on_meta_with_torch_tensor_keep_their_values():
    """HiDream's patchify makes its per-sample sizes with ``torch.tensor(..., device=device)`` and unpatchify slices
    the output by them (transformer_hidream_image.py:714, :694-696): torch.tensor shows the dispatch modes no op, so
    on meta the sizes had no values and train --plan stopped at "Tensor.item() cannot be called on meta tensors"."""
    from hf_precision.memory.counting import count_live_bytes

    own = torch.tensor
    with count_live_bytes():
        sizes = torch.tensor([4, 2], dtype=torch.int64, device="meta").reshape(-1).unsqueeze(0).repeat(2, 1)
        height, width = sizes[1]
        kept = torch.empty(2, 10, 8, device="meta")[1, : height * width].reshape(1, height, width, -1)
    assert sizes.device.type == "meta" and tuple(kept.shape) == (1, 4, 2, 8)
    assert torch.tensor is own  # torch's own again outside the count


def test_zero_embeddings_read_on_meta_keep_their_values():
    """HunyuanVideo 1.5 branches on ``torch.all(image_embeds == 0)`` (text-to-video); the training plan's meta step
    makes those embeddings with new_zeros and casts them to the compute dtype, and train --plan failed with
    "Tensor.item() cannot be called on meta tensors". A draw's values stay unknown: nothing is guessed for it."""
    from hf_precision.memory.counting import count_live_bytes

    x0 = torch.empty(1, 4, 2, 2, 2, device="meta")
    with count_live_bytes():
        zeros = x0.new_zeros(1, 1, 12).to(torch.float16)
        assert bool(torch.all(zeros == 0)) and not bool(torch.all(zeros + 1 == 0))
        with pytest.raises(RuntimeError, match="meta"):
            bool(torch.all(torch.empty(1, 1, 12, device="meta") == 0))


# ------------------------------------------------------------------------------------ 6: LTX's real scheduler


def test_check_ltx_with_the_real_scheduler_config(saved_pipeline, tmp_path, capfd):
    folder = shutil.copytree(saved_pipeline("ltx"), tmp_path / "ltx")
    capfd.readouterr()
    shutil.copy(CONFIGS / "LTX-Video" / "scheduler" / "scheduler_config.json", folder / "scheduler")
    assert json.loads((folder / "scheduler" / "scheduler_config.json").read_text())["shift_terminal"] == 0.1
    with _no_runtime_warning():
        rc = main(["check", str(folder), "--device", "cpu", "--json"])
    out, err = capfd.readouterr()
    report = json.loads(out)
    assert rc == 0 and report["error"] is None, report
    assert not _noise(err), err


class _no_runtime_warning:
    """Fails the block when a RuntimeWarning (numpy's "invalid value encountered in divide") is raised in it."""

    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings(record=True)
        self.seen = self._catch.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)
        bad = [str(w.message) for w in self.seen if issubclass(w.category, RuntimeWarning)]
        assert not bad, bad
        return False


# ------------------------------------------------------------------------------------ 7: PixArt's caption cleaning


@pytest.fixture
def pixart_256(saved_pipeline, tmp_path) -> Path:
    """The tiny PixArt with ``sample_size: 32``, a size PixArt's resolution binning has a table for (256 pixels)."""
    folder = shutil.copytree(saved_pipeline("pixart"), tmp_path / "pixart")
    config = folder / "transformer" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "sample_size": 32}))
    return folder


def test_pixart_generate_prints_no_caption_cleaning_notice(pixart_256, tmp_path, capfd):
    capfd.readouterr()
    rc = main(["generate", str(pixart_256), "--prompt", "a cat", "--out", str(tmp_path / "x.png"), "--steps", "2",
               "--height", "32", "--width", "32", "--device", "cpu"])
    err = capfd.readouterr().err
    assert rc == 0 and (tmp_path / "x.png").is_file(), err
    assert "Beautiful Soup" not in err and "clean_caption" not in err and not _noise(err), err


def test_calibrate_calls_pixart_without_caption_cleaning(tiny_pipe, monkeypatch):
    """calibrate's call (CLI and API alike) on a machine without Beautiful Soup: diffusers would log two lines per run
    and turn the cleaning off itself; a caller's own clean_caption is kept."""
    import diffusers.utils

    from hf_precision.diagnose.calibration.method import _call_kwargs

    monkeypatch.setattr(diffusers.utils, "is_bs4_available", lambda: False)
    pipe = tiny_pipe("pixart")
    assert _call_kwargs(pipe, None, "a cat", None, 2, (32, 32))["clean_caption"] is False
    assert _call_kwargs(pipe, {"prompt": "a cat", "clean_caption": True}, None, None, 2, (None, None))["clean_caption"]
    assert "clean_caption" not in _call_kwargs(tiny_pipe("sd15"), None, "a cat", None, 2, (32, 32))


def test_train_refuses_a_pipeline_without_captions_before_loading(saved_pipeline, tmp_path, capfd, monkeypatch):
    """DiT is conditioned on class labels, not a caption: one line before any weight is read. (SVD, conditioned on
    its first frame's image embedding, which the encode phase makes, trains: tests/test_image_embeds.py.)"""
    import hf_precision.runtime.load as load

    model, data = saved_pipeline("dit"), _images(tmp_path / "d")
    monkeypatch.setattr(load, "load_pipeline", lambda *a, **k: pytest.fail("loaded a model"))
    capfd.readouterr()
    rc = main(["train", "--model", str(model), "--data", str(data), "--out", str(tmp_path / "o"),
               "--resolution", "32", "--device", "cpu", "--steps", "2", "--quiet"])
    err = capfd.readouterr().err
    assert rc == 2 and "DiTPipeline has no encode_prompt" in err and not _noise(err), err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("plan", [False, True])
def test_train_refuses_a_prompt_encoder_that_needs_an_input_the_data_lacks_before_loading(plan, tmp_path, capfd,
                                                                                       monkeypatch):
    """A pipeline whose encode_prompt needs an input besides the caption and the image (HunyuanVideo I2V's: each
    clip's first frame, tests/test_condition_inputs.py) is refused before loading by `train` and `train --plan`: it
    would load the model and refuse in the training layer's words (tp.encode_prompt ... pass ...=...)."""
    import diffusers

    import hf_precision
    import hf_precision.runtime.load as load

    class NeedsControlVideoPipeline(diffusers.HunyuanVideoImageToVideoPipeline):  # a stand-in: no shipped one needs more
        def encode_prompt(self, prompt, image, control, device=None):
            raise AssertionError("not called")

    monkeypatch.setattr(diffusers, "NeedsControlVideoPipeline", NeedsControlVideoPipeline, raising=False)
    # the real HunyuanVideo configs under that class name: the refusal reads model_index.json, no weights are needed
    model = shutil.copytree(Path(hf_precision.__file__).parent / "model_configs" / "HunyuanVideo", tmp_path / "m")
    index = json.loads((model / "model_index.json").read_text())
    (model / "model_index.json").write_text(json.dumps({**index, "_class_name": "NeedsControlVideoPipeline"}))
    data = _clips(tmp_path / "d", frames=5)
    monkeypatch.setattr(load, "load_pipeline", lambda *a, **k: pytest.fail("loaded a model"))
    capfd.readouterr()
    rc = main(["train", *(["--plan"] if plan else []), "--model", str(model), "--data", str(data), "--out",
               str(tmp_path / "o"), "--frames", "5", "--resolution", "32", "--device", "cpu", "--steps", "2", "--quiet"])
    err = capfd.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "NeedsControlVideoPipeline.encode_prompt needs control besides the caption" in err, err


@pytest.mark.parametrize("index, source", [
    ({"_class_name": "Kandinsky3Pipeline", "movq": ["diffusers", "VQModel"], "unet": ["diffusers", "Kandinsky3UNet"],
      "scheduler": ["diffusers", "DDPMScheduler"], "text_encoder": ["transformers", "T5EncoderModel"]},
     "its latents come from movq (VQModel)"),
    ({"_class_name": "StableCascadeDecoderPipeline", "decoder": ["diffusers", "StableCascadeUNet"],
      "vqgan": ["diffusers", "PaellaVQModel"], "scheduler": ["diffusers", "DDPMWuerstchenScheduler"]},
     "its latents come from vqgan (PaellaVQModel)"),
    ({"_class_name": "StableCascadePriorPipeline", "prior": ["diffusers", "StableCascadeUNet"],
      "image_encoder": ["transformers", "CLIPVisionModelWithProjection"],
      "scheduler": ["diffusers", "DDPMWuerstchenScheduler"]},
     "its denoiser prior (StableCascadeUNet) works in another model's latent space"),
])
def test_train_refuses_a_pipeline_without_a_vae_naming_where_its_latents_come_from(index, source):
    """The program encodes training images with the pipeline's vae: Kandinsky 3 (a MoVQ) failed after loading with
    "tp.encode_images: no 'vae' component", Stable Cascade with "unknown component 'unet'"."""
    from hf_precision.apps.train.prepare import _check_latents

    with pytest.raises(RecipeError) as info:
        _check_latents(index)
    message = str(info.value)
    assert message.startswith(f"--model: {index['_class_name']} has no 'vae': ") and source in message, message
    assert "\n" not in message and "hf_precision.prepare_training(...)" in message


def test_train_refuses_kandinsky3_before_loading(saved_pipeline, tmp_path, capfd, monkeypatch):
    import hf_precision.runtime.load as load

    model, data = saved_pipeline("kandinsky3"), _images(tmp_path / "d")
    monkeypatch.setattr(load, "load_pipeline", lambda *a, **k: pytest.fail("loaded a model"))
    capfd.readouterr()
    rc = main(["train", "--model", str(model), "--data", str(data), "--out", str(tmp_path / "o"),
               "--resolution", "32", "--device", "cpu", "--steps", "2", "--quiet"])
    err = capfd.readouterr().err
    assert rc == 2 and "Kandinsky3Pipeline has no 'vae': its latents come from movq" in err and not _noise(err), err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists(), err
    # train --plan refuses it too: it printed a memory plan for the run train then refused
    rc = main(["train", "--plan", "--model", str(model), "--device", "t4", "--resolution", "32"])
    captured = capfd.readouterr()
    assert rc == 2 and "its latents come from movq" in captured.err and "training plan" not in captured.out, captured


# ------------------------------------------------------------------------------------ 5: a LoRA without a loader mixin


def test_pixart_lora_is_saved_where_peft_loads_it(saved_pipeline, tmp_path, capfd):
    """diffusers 0.42 has no LoRA loader for PixArt (pipeline or transformer): the adapter is written in peft's own
    format, and PeftModel.from_pretrained puts the trained weights back, key for key."""
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import load_file

    from hf_precision.testing import make_pipeline

    model, data, out = saved_pipeline("pixart"), _images(tmp_path / "d"), tmp_path / "o"
    capfd.readouterr()
    rc = main(["train", "--model", str(model), "--data", str(data), "--out", str(out), "--resolution", "32",
               "--device", "cpu", "--steps", "2", "--learning-rate", "0.01", "--save-dtype", "float32", "--quiet"])
    stdout, err = capfd.readouterr()
    assert rc == 0, err
    from hf_precision.training.io import lora_loader

    assert lora_loader("PixArtAlphaPipeline", ["PixArtAlphaPipeline", "PixArtSigmaPipeline"]) is None
    assert f"PeftModel.from_pretrained(pipe.transformer, {str(out / 'transformer')!r})" in stdout
    saved = load_file(out / "transformer" / "adapter_model.safetensors")
    assert any("lora_B" in k and v.abs().max() > 0 for k, v in saved.items())  # trained, not the zero init

    loaded = PeftModel.from_pretrained(make_pipeline("pixart").transformer, out / "transformer")
    state = get_peft_model_state_dict(loaded)
    assert set(state) == set(saved)
    for key, value in saved.items():
        torch.testing.assert_close(state[key], value)


def test_video_with_one_step_on_the_real_ltx_scheduler_says_how_many(saved_pipeline, tmp_path, capfd):
    """`video --steps 1` there: one line naming --steps and the count that runs, not a failed clip and a warning."""
    folder = shutil.copytree(saved_pipeline("ltx"), tmp_path / "ltx")
    shutil.copy(CONFIGS / "LTX-Video" / "scheduler" / "scheduler_config.json", folder / "scheduler")
    capfd.readouterr()
    with _no_runtime_warning():
        rc = main(["video", "--model", str(folder), "--prompt", "a cat", "--out", str(tmp_path / "x.gif"), "--height",
                   "32", "--width", "32", "--frames", "9", "--steps", "1", "--device", "cpu", "--quiet"])
    err = capfd.readouterr().err
    assert rc == 2 and "--steps 1: FlowMatchEulerDiscreteScheduler cannot" in err and "use --steps 2" in err, err
    assert not _noise(err) and not (tmp_path / "x.gif").exists(), err


def test_video_refuses_a_control_clip_it_cannot_give_before_loading(saved_pipeline, tmp_path, capfd, monkeypatch):
    """AnimateDiff ControlNet's call needs conditioning_frames (no option of `video` gives them): at a frame count its
    motion table takes, `video` loaded the model, failed inside diffusers and said "1 output(s) missing" (exit 1)."""
    import hf_precision.runtime.load as load

    # the tiny AnimateDiff folder (saved for other tests) under the ControlNet class: the refusal reads the class's call
    folder = shutil.copytree(saved_pipeline("animatediff"), tmp_path / "adc")
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "_class_name": "AnimateDiffControlNetPipeline"}))
    monkeypatch.setattr(load, "load_pipeline", lambda *a, **k: pytest.fail("loaded a model"))
    capfd.readouterr()
    rc = main(["video", "--model", str(folder), "--prompt", "a cat", "--height", "32",
               "--width", "32", "--frames", "8", "--steps", "2", "--device", "cpu", "--out", str(tmp_path / "x.gif")])
    err = capfd.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "AnimateDiffControlNetPipeline needs conditioning_frames besides the prompt" in err, err
    assert "pipe(prompt=..., conditioning_frames=...)" in err

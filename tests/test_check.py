"""hf_precision.diagnose.checker on tiny pipelines, and the `plan` / `check` commands run as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import hf_precision as hp
from hf_precision.diagnose.checker import CheckReport, default_call
from hf_precision.errors import RecipeError
from hf_precision.diagnose.mismatch import MismatchError


SDXL_ISLANDS = ["unet.time_embedding", "unet.add_embedding"]


def _casts(report: CheckReport) -> set[tuple[str, str, str, str, str]]:
    return {(c.module, c.kind, c.where, c.from_dtype, c.to_dtype) for c in report.casts}


@pytest.fixture
def t4_sdxl(saved_pipeline):
    """The tiny SDXL, saved, loaded back with the T4 layout on the CPU."""
    return hp.load_pipeline(saved_pipeline("sdxl"), "cpu", recipe=hp.get_recipe("sdxl", device="t4"))


# ------------------------------------------------------------------------------------------ the API


def test_a_recipe_pipeline_is_clean(t4_sdxl):
    report = hp.check(t4_sdxl)
    assert report.ok and report.exit_code == 0, report.table()
    assert report.error is None and not report.mismatches and not report.erased_islands and not report.drift
    assert report.recipe == "sdxl" and "T4" in report.device and report.modules_run > 50
    casts = _casts(report)
    for island in SDXL_ISLANDS:
        assert (island, "island", "input", "float16", "float32") in casts
        assert (island, "island", "output", "float32", "float16") in casts
    assert ("vae.post_quant_conv", "entry", "input", "float16", "float32") in casts  # the UNet's latents, upcast
    assert "OK" in report.table().splitlines()[0] and "casts" in report.table()


def test_casts_at_the_unet_entry(saved_pipeline):
    recipe = hp.get_recipe("sdxl", device="cpu-avx2", overrides={"unet": {"dtype": "float16"}})
    pipe = hp.load_pipeline(saved_pipeline("sdxl"), "cpu", recipe=recipe)
    report = hp.check(pipe)
    assert report.ok, report.table()
    casts = _casts(report)
    assert ("unet", "entry", "input", "float32", "float16") in casts  # fp32 text embeddings into the fp16 UNet
    assert ("unet", "entry", "output", "float16", "float32") in casts  # handed back in the latents' dtype
    assert ("unet.time_embedding", "island", "input", "float16", "float32") in casts


def test_pipe_to_half_erases_the_islands(t4_sdxl):
    t4_sdxl.to(torch.float16)
    report = hp.check(t4_sdxl)
    assert not report.ok and report.exit_code == 1
    assert [e.module for e in report.erased_islands] == SDXL_ISLANDS
    for e in report.erased_islands:
        assert e.dtype == "float16" and e.tensors > 0
        assert "apply_recipe" in e.fix and "pipe.to(device)" in e.fix
    assert "--set unet.keep_fp32=[add_embedding]" in report.erased_islands[0].fix
    assert [(d.component, d.what, d.have, d.want) for d in report.drift] == [("vae", "dtype", "float16", "float32")]
    assert "--set vae.dtype=float16" in report.drift[0].fix
    text = report.table()
    assert "erased float32 islands:" in text and "unet.time_embedding" in text and "drift from the plan:" in text

    # the fix in the report works
    hp.apply_recipe(t4_sdxl, hp.applied(t4_sdxl).recipe)
    assert hp.check(t4_sdxl).ok


def test_a_plain_mismatched_pipeline_reports_the_crash(tiny_pipe):
    pipe = tiny_pipe("sdxl")
    pipe.unet.to(torch.float16)  # layout S2: unet fp16, the rest fp32, no recipe
    report = hp.check(pipe)
    assert report.exit_code == 1 and report.recipe is None
    assert isinstance(report.error, MismatchError)
    assert report.error.module == "unet.time_embedding.linear_1"
    assert (report.error.got, report.error.expected) == ("float32", "float16")
    # unet is already float16: the fix makes the other components agree (issue 11 item 9), never unet.dtype=float16
    assert "--set unet.dtype=float16" not in report.error.fix
    assert "--set text_encoder_2.dtype=float16" in report.error.fix
    assert not report.mismatches  # the crash is reported once, as the error
    text = report.table()
    assert "the call failed:" in text and "unet.time_embedding.linear_1" in text and "fix:" in text
    assert any("apply_recipe" in n for n in report.notes)
    data = json.loads(report.to_json())
    assert data["error"]["module"] == "unet.time_embedding.linear_1" and data["exit_code"] == 1
    assert data == report.to_dict()


def test_a_silent_mismatch_is_reported(tiny_pipe):
    pipe = tiny_pipe("sdxl")
    pipe.to(torch.float16)
    pipe.vae.register_to_config(force_upcast=False)
    pipe.vae.decoder.conv_norm_out.float()  # CPU GroupNorm takes half input with fp32 weights: no error
    report = hp.check(pipe)
    assert report.error is None and report.exit_code == 1
    (m,) = report.mismatches
    assert (m.module, m.kind, m.got, m.expected) == ("vae.decoder.conv_norm_out", "dtype", "float16", "float32")
    assert "--set vae.keep_fp32=[decoder.conv_norm_out]" in m.fix


def test_a_plain_pipeline_that_runs_is_ok_with_a_hint(tiny_pipe):
    report = hp.check(tiny_pipe("sdxl"))
    assert report.ok and report.recipe is None and not report.casts
    assert any("apply_recipe" in n for n in report.notes)


@pytest.mark.parametrize("kind", ["svd", "pixart", "dit", "sd15"])
def test_default_calls_of_every_shipped_recipe(kind, saved_pipeline):
    pipe = hp.load_pipeline(saved_pipeline(kind), "cpu", recipe=hp.get_recipe(kind, device="t4"))
    report = hp.check(pipe)
    assert report.ok, report.table()
    assert not any("did not run" in n for n in report.notes), report.notes
    assert any(c.module.startswith("vae.") and c.to_dtype == "float32" for c in report.casts)


def test_a_custom_call_and_a_failing_call(t4_sdxl):
    seen = []
    report = hp.check(t4_sdxl, call=lambda p: seen.append(p(**default_call(p).kwargs)))
    assert report.ok and len(seen) == 1

    def broken(pipe):
        raise ValueError("not a dtype problem")

    report = hp.check(t4_sdxl, call=broken)
    assert isinstance(report.error, ValueError) and report.exit_code == 1
    assert "ValueError: not a dtype problem" in report.table() and "not a dtype or device mismatch" in report.table()


def test_hooks_are_removed(t4_sdxl):
    from torch.nn.modules import module as torch_module

    before = {n: (len(m._forward_pre_hooks), len(m._forward_hooks)) for n, m in t4_sdxl.unet.named_modules()}
    hp.check(t4_sdxl, call=lambda p: (_ for _ in ()).throw(RuntimeError("boom")))
    hp.check(t4_sdxl)
    after = {n: (len(m._forward_pre_hooks), len(m._forward_hooks)) for n, m in t4_sdxl.unet.named_modules()}
    assert before == after
    assert not torch_module._global_forward_pre_hooks and not torch_module._global_forward_hooks


def test_no_default_call_for_unknown_pipelines():
    class Custom:
        components: dict = {}

        def __call__(self, steps: int = 1):
            return None

    with pytest.raises(RecipeError, match="pass one"):
        hp.check(Custom())
    with pytest.raises(RecipeError, match="diffusers pipeline"):
        hp.check(object())


def test_an_index_less_device_plan_is_the_current_device(monkeypatch):
    # torch.device("cuda") != torch.device("cuda:0"), yet .to("cuda") lands on cuda:0: a plan for "cuda" with its
    # tensors on cuda:0 is no drift, on cuda:1 it is (compared on device objects, so no GPU is needed).
    from types import SimpleNamespace

    import hf_precision.runtime.layout as layout
    from hf_precision.diagnose.checker import _drift
    from hf_precision.runtime.placement import same_device

    monkeypatch.setattr(layout, "drift", lambda *args: [])  # dtypes are not what this test is about
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def drift_on(device: str) -> list:
        module = SimpleNamespace(parameters=lambda: [SimpleNamespace(device=torch.device(device))] * 2)
        applied = SimpleNamespace(modules={"unet": module}, recipe={"unet": None}, islands={}, skipped=[],
                                  devices={"unet": "cuda"})
        return [(d.have, d.want, d.tensors) for d in _drift(None, {"unet": module}, applied)[1]]

    assert drift_on("cuda:0") == []
    assert drift_on("cuda:1") == [("cuda:1", "cuda", 2)]
    assert same_device(torch.device("cuda"), torch.device("cuda", 0)) and same_device("cuda:1", torch.device("cuda", 1))
    assert not same_device("cuda", torch.device("cpu")) and not same_device("cuda:0", torch.device("cuda", 1))


# ------------------------------------------------------------------------------------------ the CLI

def test_cli(saved_pipeline, tmp_path, capsys, monkeypatch):
    """The commands as a user types them, in this process (the console script's start-up and its stderr are
    tests/test_stderr_ours.py's)."""
    folder = str(saved_pipeline("sdxl"))
    monkeypatch.chdir(tmp_path)
    runs = {
        "table": ("plan", "sdxl", "--device", "t4"),
        "json": ("plan", "sdxl", "--device", "a100", "--json"),
        "check": ("check", folder, "--device", "cpu", "--for", "t4"),
        "plain": ("check", folder, "--device", "cpu", "--plain", "--dtype", "unet=float16"),
        "bad_set": ("check", folder, "--device", "cpu", "--set", "vae.dtype=half"),
    }
    out = {}
    for name, args in runs.items():
        out[name] = _main(capsys, *args)
        assert "Traceback" not in out[name][2], (name, out[name][2])

    rc, stdout, _ = out["table"]
    assert rc == 0
    vae = next(line for line in stdout.splitlines() if line.startswith("vae "))
    assert "float32" in vae and "whole component" in vae and "334.6 MB" in vae
    assert "all-fp32" in stdout and "unet.time_embedding" in stdout

    rc, stdout, _ = out["json"]
    data = json.loads(stdout)
    assert rc == 0 and data["components"]["vae"]["compute"] == "bfloat16"
    assert data["components"]["vae"]["total_bytes"] == 83_653_863 * 2

    rc, stdout, _ = out["check"]
    assert rc == 0, stdout
    assert "OK" in stdout.splitlines()[0] and "unet.time_embedding" in stdout

    rc, stdout, _ = out["plain"]
    assert rc == 1, stdout
    assert "no hf_precision recipe" in stdout and "unet.time_embedding.linear_1" in stdout
    # issue 11 item 9; in the flags --plain takes (issue 25 item 7)
    assert "--dtype unet=float16" not in stdout and "--dtype text_encoder_2=float16" in stdout

    rc, stdout, stderr = out["bad_set"]
    assert rc == 2 and stdout == "" and "'half'" in stderr and "hf-precision check: error:" in stderr


def _main(capsys, *args: str) -> tuple[int, str, str]:
    from hf_precision.cli import main

    rc = main(list(args))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_cli_in_process(saved_pipeline, tmp_path, capsys):
    """The rest of the command line, in this process (the same handlers; no interpreter start-up per case)."""
    folder = str(saved_pipeline("sdxl"))
    rc, out, err = _main(capsys, "check", folder, "--device", "cpu", "--for", "a100", "--json")
    data = json.loads(out)
    assert rc == 0 and data["ok"] and data["recipe"] == "sdxl" and data["casts"], err

    rc, out, err = _main(capsys, "check", folder, "--device", "cpu", "--for", "t4",
                         "--set", "unet.keep_fp32=[time_embedding]")
    assert rc == 0 and "unet.time_embedding" in out and "unet.add_embedding" not in out

    rc, out, err = _main(capsys, "check", folder, "--device", "cpu", "--plain", "--dtype", "float16")
    assert rc == 0 and "no hf_precision recipe" in out  # S11: the all-fp16 pipeline runs on CPU

    rc, out, err = _main(capsys, "plan", "sdxl", "--device", "t4", "--set", "unet.keep_fp32=[time_embeding]")
    assert rc == 2 and out == "" and "did you mean" in err and "'time_embedding'" in err

    rc, out, err = _main(capsys, "plan", "dit", "--device", "t4", "--modules")
    assert rc == 0 and "modules:" in out and "transformer.transformer_blocks.0.attn1.to_q" in out

    rc, out, err = _main(capsys, "plan", str(Path(hp.__file__).parent / "model_configs" / "DiT-XL-2-256"),
                         "--device", "a100", "--recipe", "dit")
    assert rc == 0 and "DiTTransformer2DModel" in out

    for args, needle in [
        (("check", str(tmp_path / "missing")), "no such folder"),
        (("check", folder, "--plain", "--set", "vae.dtype=float32"), "--plain loads without a recipe"),
        (("check", folder, "--dtype", "float16"), "--dtype goes with --plain"),
        (("check", folder, "--plain", "--dtype", "unet=half"), "unknown dtype 'half'"),
        (("check", folder, "--plain", "--dtype", "float16", "--dtype", "float32"), "COMPONENT=DTYPE"),
        (("check", folder, "--device", "t4"), "not a device this process can place tensors on"),
        (("plan", "sdxl", "--device", "t4", "--recipe", "sdxxl"), "did you mean 'sdxl'"),
    ]:
        rc, out, err = _main(capsys, *args)
        assert rc == 2 and out == "" and needle in err, (args, err)


def test_the_default_call_of_flux_kontext_runs_at_its_tiny_size():
    """Flux Kontext sizes its output by ``max_area`` (1024**2) and resizes its input image to a preferred ~1024**2
    resolution unless ``_auto_resize=False``: the default call of `check` ran the tiny model at 1024 pixels (an hour
    of the command sweep). The VAE now encodes, and the call returns, images of the call's own size."""
    from hf_precision.testing import make_pipeline

    pipe = make_pipeline("flux_kontext")
    call = default_call(pipe)
    side = call.kwargs["height"]
    seen = []

    def too_big(module, args):
        seen.append(tuple(args[0].shape[-2:]))
        if max(seen[-1]) > side:
            raise AssertionError(f"the VAE encodes {seen[-1]} pixels for a {side}-pixel call")

    handle = pipe.vae.encoder.register_forward_pre_hook(too_big)
    try:
        images = call(pipe).images
    finally:
        handle.remove()
    assert seen == [(side, side)] and images.shape[1:3] == (side, side)


def test_a_layer_in_the_compute_dtype_of_an_fp8_stored_component_is_no_island():
    """Layerwise-cast (fp8-stored) layers count as the dtype they compute in: a float32 norm of a component that
    stores its linears in fp8 and computes in float32 is in the component's own dtype, not an undeclared island to
    cast to fp8 (the fix said `pipe.unet.norm.to(torch.float8_e4m3fn)`)."""
    from hf_precision.runtime.patches import store_layerwise

    class Denoiser(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.norm = torch.nn.Linear(64, 64), torch.nn.LayerNorm(64)

        def forward(self, x):  # bfloat16 into the float32 norm: CPU norms take it silently
            return self.norm(self.proj(x).to(torch.bfloat16))

    class Pipe:
        def __init__(self):
            self.unet = Denoiser()
            store_layerwise(self.unet, torch.float8_e4m3fn, torch.float32, ["^norm$"])

        @property
        def components(self):
            return {"unet": self.unet}

    report = hp.check(Pipe(), call=lambda pipe: pipe.unet(torch.randn(2, 64)))
    (found,) = report.mismatches
    assert (found.module, found.got, found.expected) == ("unet.norm", "bfloat16", "float32")
    assert "float8" not in found.fix and "island" not in found.fix, found.fix

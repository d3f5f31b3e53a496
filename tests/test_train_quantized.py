"""LoRA on a quantized base (issue 23) through the training layer and `hf-precision train --plan`, on CPU.

A tiny SD 1.x and a tiny Flux, loaded with torchao int8 weight-only and optimum-quanto qint8, train a LoRA for a few
steps: the loss is finite and falls, the LoRA is fp32, the base stays frozen, quantized, byte for byte the same,
and the plan reports it. fp8 layerwise storage (no backward) and a full fine-tune of quantized weights are refused
before anything changes, with the fix.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import hf_precision as hp
from hf_precision.runtime.quantize import is_quantized_tensor, module_bytes
from hf_precision.training import TrainingError, example_batch

pytest.importorskip("torchao")
pytest.importorskip("optimum.quanto")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is faster


@pytest.fixture(scope="module")
def folders(tmp_path_factory, train_demo):
    from hf_precision.testing import save_pipeline
    from hf_precision.testing.families_dit import make_flux

    sd15, shapes = train_demo
    return {"sd15": sd15, "shapes": shapes, "flux": save_pipeline(make_flux(), tmp_path_factory.mktemp("flux"))}


def _quantized_state(module: torch.nn.Module) -> dict[str, list[torch.Tensor]]:
    """The backend's inner tensors (int8 data, scales, zero points) of every quantized weight, by layer name."""
    out = {}
    for name, m in module.named_modules():
        w = m._parameters.get("weight")
        if is_quantized_tensor(w):
            inner = w.__tensor_flatten__()[0]
            out[name.replace(".base_layer", "")] = [getattr(w, n).detach().clone() for n in inner]
    return out


def _load(folder, storage, layout, component):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hp.load_pipeline(folder, "cpu", layout=layout, quantize={component: storage})


# (family, storage, layout): torchao and quanto on both families; fp32, fp16 (+GradScaler) and bf16 compute
# (quanto on an SD 1.x UNet through the command: tests/test_train_run.py, A100 layout)
CASES = [("sd15", "int8", "t4"), ("flux", "int8", None), ("flux", "quanto-int8", "a100")]


@pytest.mark.parametrize("family,storage,layout", CASES)
def test_lora_on_a_quantized_base_trains_and_leaves_the_base_as_it_was(folders, family, storage, layout):
    component = "unet" if family == "sd15" else "transformer"
    pipe = _load(folders[family], storage, layout, component)
    module = getattr(pipe, component)
    before_bytes, before = module_bytes(module), _quantized_state(module)
    assert before and before_bytes == hp.plan(folders[family], device=layout or "cpu",
                                              overrides={component: {"storage": storage}})[component].total_bytes
    with pytest.raises(TrainingError, match=rf"'full' cannot train {storage} weights.*'lora'"):
        hp.prepare_training(pipe, "cpu", layout=layout, train={component: "full"})
    tp = hp.prepare_training(pipe, "cpu", layout=layout, train={component: "lora"}, rank=4)
    assert tp.recipe[component].storage == storage and tp.fingerprint() != ""
    assert f"quantized base: {component} {storage}" in tp.report() and "layers frozen" in tp.report()
    params = tp.parameters()
    assert params and {p.dtype for p in params} == {torch.float32}
    compute = tp.compute_dtype
    seen = []
    hook = module.get_submodule(next(iter(before))).register_forward_hook(lambda m, a, o: seen.append(o.dtype))
    batch = example_batch(module)
    opt = torch.optim.AdamW(params, lr=1e-2)
    losses = []
    for _ in range(4):  # same noise and timesteps each step: the loss on a fixed objective
        loss = tp.loss(batch, generator=torch.Generator().manual_seed(0))
        tp.backward(loss)
        assert tp.step(opt)
        opt.zero_grad()
        losses.append(loss.item())
    hook.remove()
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses
    assert set(seen) == {compute}  # the quantized layers compute in the component's compute dtype
    after = _quantized_state(module)
    assert after.keys() == before.keys()
    assert all(all(torch.equal(a, b) for a, b in zip(after[k], before[k])) for k in before)
    lora = sum(p.numel() * p.element_size() for n, p in module.named_parameters() if "lora_" in n)
    assert module_bytes(module) - lora == before_bytes


def test_fp8_storage_has_no_backward_and_is_refused_with_a_backend_that_has_one(folders):
    pipe = _load(folders["sd15"], "float8_e4m3fn", None, "unet")
    with pytest.raises(TrainingError, match=r"unet trains, but its weights are stored float8_e4m3fn.*no backward.*"
                                            r"unet\.storage=int8"):
        hp.prepare_training(pipe, "cpu", train={"unet": "lora"})
    assert not any("lora_" in n for n, _ in pipe.unet.named_parameters())  # refused before anything changed


def test_train_plan_counts_the_quantized_base_in_backend_bytes(folders, tmp_path, capsys):
    from hf_precision.apps.train.plan import Options, predict_training
    from hf_precision.cli import main

    common = ["train", "--model", str(folders["sd15"]), "--data", str(folders["shapes"]), "--resolution", "32",
              "--device", "cpu", "--lora-rank", "4", "--set", "unet.storage=int8", "--plan"]
    assert main([*common, "--out", str(tmp_path / "p")]) == 0
    assert "unet 0.2 MiB (int8, backend bytes)" in capsys.readouterr().out
    pred = predict_training(str(folders["sd15"]), "cpu", rank=4, resolution=32, options=Options(1, False, True),
                            overrides={"unet": {"storage": "int8"}})
    planned = hp.plan(folders["sd15"], device="cpu", overrides={"unet": {"storage": "int8"}})["unet"].total_bytes
    assert pred.weights["unet"] == planned < hp.plan(folders["sd15"], device="cpu")["unet"].total_bytes
    assert main([*common, "--out", str(tmp_path / "f"), "--method", "full"]) == 2
    assert "cannot train quantized weights" in capsys.readouterr().err

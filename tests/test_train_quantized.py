"""LoRA on a quantized or fp8-stored base (issue 23) through the training layer and `hf-precision train`, on CPU.

A tiny SD 1.x and a tiny Flux, loaded with torchao int8 weight-only, optimum-quanto qint8 or fp8 storage (e4m3fn,
e5m2), train a LoRA for a few steps: the loss is finite and falls, the LoRA is fp32, the base stays frozen, in its
storage, byte for byte the same, and the plan reports it (an fp8 base: with the weight copies the step holds for
backward, as measured); a frozen bitsandbytes nf4 T5 or fp8 CLIP encodes the step's
prompt, and a LoRA trains on a tiny SDXL's nf4 CLIP text encoder itself (QLoRA) beside a frozen bnb-int8 one. The
plain fp8 set-up (diffusers' layerwise casting + a peft LoRA) fails in backward, the same layers through
``runtime.patches.upcast_on_use`` train; a full fine-tune of quantized or fp8 weights is refused before anything changes.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import hf_precision as hp
from hf_precision.runtime.patches import layerwise_hook
from hf_precision.runtime.quantize import is_quantized_tensor, module_bytes
from hf_precision.training import TrainingError, example_batch

pytest.importorskip("torchao")
pytest.importorskip("optimum.quanto")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is faster

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, train_demo):
    from hf_precision.testing import save_pipeline
    from hf_precision.testing import make_pipeline

    sd15, shapes = train_demo
    return {"sd15": sd15, "shapes": shapes, "flux": save_pipeline(make_pipeline("flux"), tmp_path_factory.mktemp("flux"))}


def _stored_state(module: torch.nn.Module) -> dict[str, list[torch.Tensor]]:
    """Each quantized weight's inner tensors (int8 data, scales, zero points), or each fp8 weight's bytes, by layer."""
    out = {}
    for name, m in module.named_modules():
        w = m._parameters.get("weight")
        if is_quantized_tensor(w) and hasattr(w, "__tensor_flatten__"):
            out[name.replace(".base_layer", "")] = [getattr(w, n).detach().clone() for n in w.__tensor_flatten__()[0]]
        elif is_quantized_tensor(w):  # bitsandbytes: packed data, and its 4-bit absmax or its int8 row scales
            scb = w.SCB if getattr(w, "SCB", None) is not None else getattr(getattr(m, "state", None), "SCB", None)
            scales = (getattr(getattr(w, "quant_state", None), "absmax", None), scb)  # SCB: in m.state after a forward
            out[name.replace(".base_layer", "")] = [t.detach().clone() for t in (w, *scales) if isinstance(t, torch.Tensor)]
        elif w is not None and w.dtype in FP8:
            out[name.replace(".base_layer", "")] = [w.detach().view(torch.uint8).clone()]
    return out


def _held_fp8_copies(module: torch.nn.Module, held: dict[int, int]):
    """A saved-tensors pack hook recording the tensors autograd saves that are an fp8 weight of ``module`` upcast
    (equal to it in their dtype): the copies the step holds for backward, by storage."""
    fp8 = [p for p in module.parameters() if p.dtype in FP8]
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        base = t if t._base is None else t._base
        if key not in params and key not in held and base.is_floating_point() and base.dtype not in FP8:
            if any(base.shape == w.shape and torch.equal(base, w.to(base.dtype)) for w in fp8):
                held[key] = base.untyped_storage().nbytes()
        return t

    return pack


def _load(folder, quantize, layout):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hp.load_pipeline(folder, "cpu", layout=layout, quantize=quantize)


# (family, quantize, layout): torchao int8, quanto qint8, fp8 e4m3fn and e5m2 storage; fp32, fp16 (+GradScaler) and
# bf16 compute. A frozen quantized/fp8 text encoder encodes the step's prompt: Flux's T5 in bitsandbytes nf4 (on the
# CPU: a transformers model), SD's CLIP in fp8 (A100: loaded for fp16 compute, trained in bf16). (quanto on an SD 1.x
# UNet through the command: test_train_run.py; torchao int8 T5s load and run in test_quantize.py)
CASES = [("sd15", {"unet": "int8"}, "t4"), ("sd15", {"unet": "float8_e4m3fn", "text_encoder": "float8_e4m3fn"}, "a100"),
         ("flux", {"transformer": "float8_e5m2", "text_encoder_2": "nf4"}, None),
         ("flux", {"transformer": "quanto-int8"}, "a100")]


@pytest.mark.parametrize("family,quantize,layout", CASES, ids=lambda v: "-".join(v.values()) if isinstance(v, dict) else v)
def test_lora_on_a_quantized_base_trains_and_leaves_the_base_as_it_was(folders, family, quantize, layout):
    if "nf4" in quantize.values():
        pytest.importorskip("bitsandbytes")
    component = "unet" if family == "sd15" else "transformer"
    storage = quantize[component]
    pipe = _load(folders[family], quantize, layout)
    module = getattr(pipe, component)
    frozen = {c: (getattr(pipe, c), _stored_state(getattr(pipe, c)), module_bytes(getattr(pipe, c)))
              for c in quantize if c != component}
    before_bytes, before = module_bytes(module), _stored_state(module)
    assert before and before_bytes == hp.plan(folders[family], device=layout or "cpu",
                                              overrides={component: {"storage": storage}})[component].total_bytes
    with pytest.raises(TrainingError, match=rf"'full' cannot train {storage} weights.*'lora'"):
        hp.prepare_training(pipe, "cpu", layout=layout, train={component: "full"})
    tp = hp.prepare_training(pipe, "cpu", layout=layout, train={component: "lora"}, rank=4)
    kind = "fp8" if storage.startswith("float8") else "quantized"
    assert tp.recipe[component].storage == storage and tp.fingerprint() != ""
    assert f"{kind} base: {component} {storage}" in tp.report() and "layers frozen" in tp.report()
    params = tp.parameters()
    assert params and {p.dtype for p in params} == {torch.float32}
    lora = sum(p.numel() * p.element_size() for n, p in module.named_parameters() if "lora_" in n)
    assert module_bytes(module) - lora == before_bytes  # also before any forward: the re-applied recipe upcast nothing
    assert all(module_bytes(part) == size for part, _, size in frozen.values())
    for name, (part, state, _) in frozen.items():  # a frozen fp8 part keeps diffusers' hook, in the training compute
        hooks = [layerwise_hook(part.get_submodule(k)) for k in state]
        assert all(h.compute_dtype == getattr(torch, tp.recipe[name].compute) for h in hooks if h is not None)
    compute = tp.compute_dtype
    seen = []
    hook = module.get_submodule(next(iter(before))).register_forward_hook(lambda m, a, o: seen.append(o.dtype))
    batch = example_batch(module)
    if frozen:  # the frozen quantized/fp8 text encoder encodes the prompt the step trains on
        batch.update(tp.encode_prompt("a red square", **({"max_sequence_length": 8} if family == "flux" else {})))
    opt = torch.optim.AdamW(params, lr=1e-2)
    losses = []
    held: dict[int, int] = {}  # the fp8 weight copies the step holds for backward, measured on the first step
    for step in range(3):  # same noise and timesteps each step: the loss on a fixed objective
        pack = _held_fp8_copies(module, held) if step == 0 and kind == "fp8" else (lambda t: t)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = tp.loss(batch, generator=torch.Generator().manual_seed(0))
        tp.backward(loss)
        assert tp.step(opt)
        opt.zero_grad()
        losses.append(loss.item())
    hook.remove()
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses
    assert set(seen) == {compute}  # the quantized/fp8 layers compute in the component's compute dtype
    if kind == "fp8":  # `train --plan` counts those copies (its meta step computes through upcast_on_use too)
        from hf_precision.apps.train.plan import Options, predict_training

        pred = predict_training(str(folders[family]), layout or "cpu", rank=4, resolution=32,
                                options=Options(1, False, True), overrides={component: {"storage": storage}})
        fp8_layers = sum(p.dim() > 1 for p in module.parameters() if p.dtype in FP8)
        assert 0 < len(held) < fp8_layers and pred.fp8_copies == sum(held.values())  # not those before the LoRA
    after = _stored_state(module)
    assert after.keys() == before.keys()
    assert all(all(torch.equal(a, b) for a, b in zip(after[k], before[k])) for k in before)
    assert all(p.grad is None for n, p in module.named_parameters() if "lora_" not in n)
    assert module_bytes(module) - lora == before_bytes
    for name, (part, state, size) in frozen.items():
        assert state and _stored_state(part).keys() == state.keys() and module_bytes(part) == size
        assert f"base: {name} {quantize[name]}" in tp.report() and not any(p.requires_grad for p in part.parameters())
        assert all(all(torch.equal(a, b) for a, b in zip(_stored_state(part)[k], state[k])) for k in state)


def test_qlora_on_a_4bit_text_encoder_beside_a_frozen_int8_one(saved_pipeline):
    """QLoRA on the CPU: SDXL's CLIP text encoder in bitsandbytes nf4 trains a LoRA (fp32 masters; the 4-bit base
    frozen, byte for byte the same, planned bytes == measured), its second encoder frozen in LLM.int8; the pipeline
    checks clean and its output is finite; the LoRA's gradients come back through the (unquantized) UNet and the
    loss falls."""
    pytest.importorskip("bitsandbytes")
    folder = saved_pipeline("sdxl")  # the session's tiny SDXL folder, shared with the other tests
    quantize = {"text_encoder": "nf4", "text_encoder_2": "bnb-int8"}
    pipe = _load(folder, quantize, None)
    planned = hp.plan(folder, device="cpu", overrides={c: {"storage": s} for c, s in quantize.items()})
    before = {c: (_stored_state(getattr(pipe, c)), module_bytes(getattr(pipe, c))) for c in quantize}
    assert all(state and size == planned[c].total_bytes for c, (state, size) in before.items())
    # one pipeline call through the 4-bit and LLM.int8 encoders: no mismatch, no drift, a finite image
    report = hp.check(pipe, call=lambda p: p("a cat", num_inference_steps=2, height=32, width=32, output_type="np"))
    assert report.ok and not [n for n in report.notes if "NaN or inf" in n], report.table()
    with pytest.raises(TrainingError, match="'full' cannot train nf4 weights"):
        hp.prepare_training(pipe, "cpu", train={"text_encoder": "full"})
    tp = hp.prepare_training(pipe, "cpu", train={"text_encoder": "lora"}, rank=4)
    assert "quantized base: text_encoder nf4 (bitsandbytes nf4)" in tp.report()
    params = tp.parameters()
    assert params and {p.dtype for p in params} == {torch.float32}
    assert all(".lora_" in n for n, _ in tp.named_parameters() if n.startswith("text_encoder."))
    batch = example_batch(pipe.unet)
    opt = torch.optim.AdamW(params, lr=1e-2)
    losses = []
    for _ in range(3):
        batch.update(tp.encode_prompt("a red square"))  # through the LoRA: encoded again each step
        loss = tp.loss(batch, generator=torch.Generator().manual_seed(0))
        tp.backward(loss)
        assert tp.step(opt)
        opt.zero_grad()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses
    lora = sum(p.numel() * p.element_size() for n, p in pipe.text_encoder.named_parameters() if "lora_" in n)
    for comp, (state, size) in before.items():
        part = getattr(pipe, comp)
        after = _stored_state(part)
        assert after.keys() == state.keys() and all(len(after[k]) == len(state[k]) == 2 for k in state)
        assert all(all(torch.equal(a, b) for a, b in zip(after[k], state[k])) for k in state)
        assert module_bytes(part) - (lora if comp == "text_encoder" else 0) == size
        assert all(p.grad is None for n, p in part.named_parameters() if "lora_" not in n)


def test_plain_fp8_layerwise_lora_fails_in_backward_and_upcast_on_use_trains_it():
    """diffusers' ``enable_layerwise_casting`` + a peft LoRA + backward: the error kohya's ``--fp8_base`` users avoid."""
    from diffusers.training_utils import cast_training_params
    from peft import LoraConfig

    from hf_precision.runtime.patches import upcast_on_use
    from hf_precision.testing import make_pipeline

    unet = make_pipeline("sd15").unet.requires_grad_(False)
    unet.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    unet.add_adapter(LoraConfig(r=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    cast_training_params(unet, torch.float32)  # fp32 LoRA masters, as diffusers' examples (else peft's forward fails)
    batch = example_batch(unet)

    def step():
        out = unet(batch["latents"], torch.tensor([10]), encoder_hidden_states=batch["prompt_embeds"]).sample
        out.pow(2).mean().backward()

    with pytest.raises(RuntimeError, match="expected scalar type Float but found Float8_e4m3fn"):
        step()
    base = {n: p.detach().view(torch.uint8).clone() for n, p in unet.named_parameters() if p.dtype in FP8}
    assert upcast_on_use(unet, torch.float32) == len({n.rpartition(".")[0] for n in base})  # every fp8 layer
    step()
    lora = [p for n, p in unet.named_parameters() if "lora_B" in n]
    assert lora and all(p.grad is not None and bool(p.grad.isfinite().all()) for p in lora)
    assert all(torch.equal(p.detach().view(torch.uint8), base[n]) and p.grad is None
               for n, p in unet.named_parameters() if n in base)


def test_train_command_on_a_quantized_and_an_fp8_base(folders, tmp_path, capsys, monkeypatch):
    from hf_precision.apps.train.plan import Options, predict_training
    from hf_precision.cli import main

    # the float32 CPU layout named: the sizes and "computed in float32" below are its (an AMX CPU's own computes bf16)
    common = ["train", "--model", str(folders["sd15"]), "--data", str(folders["shapes"]), "--resolution", "32",
              "--device", "cpu", "--layout", "cpu-avx2", "--lora-rank", "4", "--quiet"]
    assert main([*common, "--set", "unet.storage=int8", "--plan", "--out", str(tmp_path / "p")]) == 0
    assert "unet 0.2 MiB (int8, backend bytes)" in capsys.readouterr().out
    pred = predict_training(str(folders["sd15"]), "cpu-avx2", rank=4, resolution=32, options=Options(1, False, True),
                            overrides={"unet": {"storage": "int8"}})
    planned = hp.plan(folders["sd15"], device="cpu-avx2", overrides={"unet": {"storage": "int8"}})["unet"].total_bytes
    assert pred.weights["unet"] == planned < hp.plan(folders["sd15"], device="cpu-avx2")["unet"].total_bytes
    assert main([*common, "--set", "unet.storage=int8", "--plan", "--out", str(tmp_path / "f"), "--method", "full"]) == 2
    assert "'full' cannot train int8 weights" in capsys.readouterr().err  # training.quantized.refuse_untrainable's
    # a full fine-tune of fp8 weights is refused from the recipe, before any weight is read
    monkeypatch.setattr("hf_precision.runtime.load.load_pipeline", lambda *a, **k: pytest.fail("loaded the model"))
    for plan in ([], ["--plan"]):
        assert main([*common, "--set", "unet.storage=float8_e4m3fn", "--method", "full", *plan, "--out",
                     str(tmp_path / "full8")]) == 2
        err = capsys.readouterr().err
        assert "float8_e4m3fn" in err and "--method lora" in err and not (tmp_path / "full8").exists(), err
    monkeypatch.undo()
    out = tmp_path / "fp8"
    assert main([*common, "--set", "unet.storage=float8_e4m3fn", "--steps", "1", "--out", str(out)]) == 0
    record = json.loads((out / "training.json").read_text())
    assert torch.isfinite(torch.tensor(record["final_loss"])) and (out / "pytorch_lora_weights.safetensors").exists()
    assert "fp8 base: unet float8_e4m3fn (stored fp8, computed in float32" in record["plan"]


def test_only_a_step_with_float8_weights_pays_the_fp8_copies_layer(monkeypatch):
    """held_fp8_copies' dispatch layer sees every op of the meta step (~6% of it): a denoiser without float8 weights
    has no copy to count and runs without it; a float8-stored one runs with it and counts its copies."""
    import dataclasses

    from hf_precision.memory import train_step
    from hf_precision.runtime.patches import upcast_on_use

    entered = []
    real = train_step.held_fp8_copies
    monkeypatch.setattr(train_step, "held_fp8_copies", lambda: entered.append(True) or real())
    plain = train_step._tiny_unet()
    train_step.make_trainable(plain, "lora", 2)
    assert train_step.step_activations(plain, example_batch(plain, 1, side=8), "epsilon", False, torch.float32)[1] == 0
    assert entered == []
    stored = train_step._tiny_unet()
    train_step.store_fp8(stored, dataclasses.replace(hp.get_recipe("sd15", device="cpu")["unet"],
                                                     storage="float8_e4m3fn"))
    train_step.make_trainable(stored, "lora", 2)
    upcast_on_use(stored, torch.float32)
    _, copies = train_step.step_activations(stored, example_batch(stored, 1, side=8), "epsilon", False, torch.float32)
    assert entered == [True] and copies > 0

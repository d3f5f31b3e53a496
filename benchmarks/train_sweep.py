"""Sweep training set-ups through hf_precision.training on CPU: every tiny pipeline with a denoiser x what trains x
device layout x master, plus the loop's side paths (the user's own loss under tp.autocast(), gradient checkpointing,
torch.compile, accelerate, validation and resume round trips). A check script, not a test: one line per case and a
summary by failure class.

Each case takes 3 optimizer steps on one fixed batch and checks: finite loss, a falling loss, every trainable
parameter a master after every step, frozen weights bit-identical, frozen storage as planned.

    OMP_NUM_THREADS=1 python benchmarks/train_sweep.py --quick          # a subset (one pipeline per recipe, fewer layouts)
    OMP_NUM_THREADS=1 python benchmarks/train_sweep.py -k sd_controlnet  # cases whose id contains the string
"""

from __future__ import annotations

import argparse
import copy
import inspect
import sys
import time
import traceback
from collections import Counter
from typing import Any, Callable

import torch

LAYOUTS = ("cpu", "cpu-amx", "t4", "a100", "m1-macos13", "m2-macos15")
PROMPTS = ["a cat"]


class Case:
    def __init__(self, pipe: str, what: str, layout: str, master: str = "fp32", **options: Any):
        self.pipe, self.what, self.layout, self.master, self.options = pipe, what, layout, master, options

    @property
    def id(self) -> str:
        return f"{self.pipe}/{self.what}/{self.layout}/{self.master}"


# ------------------------------------------------------------------ checks
def _frozen(tp: Any) -> dict[str, torch.Tensor]:
    return {f"{c}.{n}": t.detach().clone() for c, m in tp.components.items() for n, t in m.named_parameters()
            if not t.requires_grad}


def _storage_problems(tp: Any) -> list[str]:
    from hf_precision.recipe.patterns import inside

    out = []
    for comp, module in tp.components.items():
        if comp not in tp.recipe:
            continue
        plan, islands = tp.recipe[comp], frozenset(tp.applied.islands.get(comp, []))
        for name, p in module.named_parameters():
            if p.requires_grad or not p.is_floating_point() or "lora_" in name:
                continue
            want = torch.float32 if inside(name.rpartition(".")[0], islands) else getattr(torch, plan.storage)
            if p.dtype != want:
                out.append(f"{comp}.{name} {p.dtype} planned {want}")
    return out


class Fail(Exception):
    def __init__(self, cls: str, msg: str):
        super().__init__(msg)
        self.cls = cls


def _steps(tp: Any, loss_fn: Callable[[], torch.Tensor], steps: int = 3, lr: float = 1e-2,
           optimizer: Any = None, backward: Callable[[torch.Tensor], None] | None = None) -> list[float]:
    frozen = _frozen(tp)
    params = tp.parameters()
    if not params:
        raise Fail("nothing-trains", "tp.parameters() is empty")
    optimizer = optimizer or torch.optim.AdamW(params, lr=lr)
    losses = []
    for _ in range(steps):
        loss = loss_fn()
        if not bool(torch.isfinite(loss)):
            raise Fail("nonfinite", f"loss {loss.item()}")
        (backward or tp.backward)(loss)
        tp.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bad = {str(p.dtype) for p in tp.parameters()} - {str(tp.stepper.master_dtype)}
        if bad:
            raise Fail("master-dtype", f"trainable dtypes {bad} after a step")
    for comp, module in tp.components.items():
        for name, t in module.named_parameters():
            key = f"{comp}.{name}"
            if key in frozen and not torch.equal(t, frozen[key]):
                raise Fail("frozen-changed", key)
    storage = _storage_problems(tp)
    if storage:
        raise Fail("storage", storage[0])
    if not losses[-1] < losses[0]:
        raise Fail("no-fall", f"{[round(x, 5) for x in losses]}")
    return losses


# ------------------------------------------------------------------ set-ups
def _text_encoders(pipe: Any) -> list[str]:
    return [n for n, m in pipe.components.items() if n.startswith("text_encoder") and isinstance(m, torch.nn.Module)]


def _tokenizer(pipe: Any, enc: str) -> Any:
    return getattr(pipe, "tokenizer" + enc.removeprefix("text_encoder"), None)


def _prompt_options(tp: Any) -> dict[str, Any]:
    params = inspect.signature(tp.pipe.encode_prompt).parameters
    out: dict[str, Any] = {}
    if "image" in params and params["image"].default is inspect.Parameter.empty:  # HunyuanVideo I2V
        from hf_precision.testing import PIPELINES

        # the tiny Llava's image tokens and template, as the registry calls it
        call = PIPELINES["hunyuan_video_i2v"].call_kwargs()
        return {k: call[k] for k in ("image", "prompt_template", "max_sequence_length")}
    if "max_sequence_length" not in params:
        return out
    denoiser = tp.components[tp.denoiser_name]
    return {**out, "max_sequence_length": int(denoiser.config.get("max_text_seq_length") or 16)}


def _loss_fn(tp: Any, through_text: bool, token: str | None = None) -> Callable[[], torch.Tensor]:
    from hf_precision.training import example_batch

    denoiser = tp.components[tp.denoiser_name]
    fixed = example_batch(getattr(denoiser, "_orig_mod", denoiser), 1)
    side_trains = any(tp.kinds.get(c, "frozen") != "frozen" for c in ("controlnet", "adapter"))
    if type(denoiser).__name__ in ("UNet2DConditionModel", "UNetMotionModel") or side_trains:
        fixed.update(_control(tp, fixed))
    prompts = [f"a {token} cat"] if token else PROMPTS
    if through_text:
        # the pipeline's own prompt length: system prompts and templates (Lumina2, Sana, HunyuanVideo) come first,
        # so a short one would cut the prompt (and the new token) off
        opts = {k: v for k, v in _prompt_options(tp).items() if k != "max_sequence_length" or denoiser.config.get("max_text_seq_length")}
        return lambda: tp.loss({"latents": fixed["latents"], **{k: v for k, v in fixed.items() if k.startswith("control")},
                                **tp.encode_prompt(prompts, **opts)}, generator=torch.Generator().manual_seed(0))
    if hasattr(tp.pipe, "encode_prompt") and _text_encoders(tp.pipe):
        with torch.no_grad():  # the pipeline's conditioning replaces the random one (QwenImage drops an all-ones mask)
            fixed = {k: v for k, v in fixed.items() if k == "latents" or k.startswith("control")}
            fixed.update(tp.encode_prompt(prompts, **_prompt_options(tp)))
    return lambda: tp.loss(fixed, generator=torch.Generator().manual_seed(0))


def _control(tp: Any, batch: dict[str, Any]) -> dict[str, Any]:
    if "controlnet" not in tp.components and "adapter" not in tp.components:
        return {}
    lat = batch["latents"]
    g = torch.Generator().manual_seed(1)
    f = int(getattr(tp.pipe, "vae_scale_factor", 8))
    h, w = lat.shape[-2] * f, lat.shape[-1] * f
    frames = (lat.shape[2],) if lat.dim() == 5 else ()  # AnimateDiff: one control frame per frame
    return {"control_image": torch.rand(lat.shape[0], *frames, 3, h, w, generator=g)}  # [0, 1], as prepare_image gives it


def _user_loss(tp: Any) -> Callable[[], torch.Tensor]:
    """The user's own loss: the denoiser called by hand with fp32 inputs under tp.autocast() (SD-style UNets)."""
    from hf_precision.training import example_batch

    unet = tp.components[tp.denoiser_name]
    batch = example_batch(unet, 1)
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(batch["latents"].shape, generator=g)
    t = torch.tensor([500])
    kwargs = {}
    if "pooled_prompt_embeds" in batch:
        b, h, w = 1, batch["latents"].shape[-2] * 8, batch["latents"].shape[-1] * 8
        kwargs["added_cond_kwargs"] = {"text_embeds": batch["pooled_prompt_embeds"],
                                       "time_ids": torch.tensor([[h, w, 0, 0, h, w]], dtype=torch.float32)}

    def fn() -> torch.Tensor:
        noisy = batch["latents"] + noise
        with tp.autocast():
            pred = unet(noisy, t, batch["prompt_embeds"], **kwargs).sample
        return torch.nn.functional.mse_loss(pred.float(), noise)
    return fn


def run_case(case: Case) -> str:
    import hf_precision as hp
    from hf_precision.testing import PIPELINES, make_pipeline

    pipe = make_pipeline(case.pipe)
    o = case.options
    train = dict(o.get("train") or {})
    kwargs: dict[str, Any] = {}
    if o.get("lora"):
        kwargs["lora"] = o["lora"]()
    if o.get("tokens"):
        kwargs["tokens"] = o["tokens"]
    if o.get("add_adapter"):  # diffusers' example scripts: weights cast to half, then add_adapter, then our set-up
        from peft import LoraConfig

        half = torch.float16 if case.layout in ("t4", "m1-macos13") else torch.bfloat16
        den = getattr(pipe, o["add_adapter"])
        den.to(half)
        from hf_precision.training.trainable import default_targets

        config = LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian", target_modules=default_targets(den))
        if hasattr(den, "add_adapter"):
            den.add_adapter(config)
        else:  # PixArt, DiT, SVD models have no diffusers loader: peft's own injection, as their scripts do
            from peft import inject_adapter_in_model

            inject_adapter_in_model(config, den)
    if o.get("warm_zero_convs"):  # a fresh ControlNet's zero convs block every gradient above them; a trained one's do not
        torch.manual_seed(0)
        with torch.no_grad():
            for mod_name, mod in pipe.controlnet.named_modules():
                if mod_name.startswith(("controlnet_down_blocks", "controlnet_mid_block")) and hasattr(mod, "weight"):
                    mod.weight.normal_(0, 0.1)
    tp = hp.prepare_training(pipe, layout=case.layout, train=train or None, master=case.master, **kwargs)
    through_text = any(k in ("lora", "full", "embedding") for c, k in tp.kinds.items() if c.startswith("text_encoder"))
    token = (o.get("tokens") or {}).get(next(iter(o.get("tokens") or {"": [None]})), [None])[0]
    mode = o.get("mode")
    if mode == "gc":
        tp.components[tp.denoiser_name].enable_gradient_checkpointing()
    if mode == "compile":
        torch._dynamo.reset()
        compiled = torch.compile(tp.components[tp.denoiser_name], backend="aot_eager")
        tp.pipe.register_modules(**{tp.denoiser_name: compiled})
    if mode == "user-loss":
        fn = _user_loss(tp)
    else:
        fn = _loss_fn(tp, through_text, token)
    if mode and mode.startswith("accelerate-"):
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
        acc = Accelerator(mixed_precision=mode.removeprefix("accelerate-"), cpu=True)
        den = tp.components[tp.denoiser_name]
        opt = torch.optim.AdamW(tp.parameters(), lr=1e-2)
        den2, opt = acc.prepare(den, opt)
        try:
            with acc.autocast():
                losses = _steps(tp, fn, optimizer=opt, backward=lambda l: tp.backward(l, acc))
        finally:
            AcceleratorState._reset_state(reset_partial_state=True)
        return f"losses {[round(x, 4) for x in losses]}"
    # a whole component moves far more per step than an adapter: diffusers' full fine-tune examples use 1e-5..1e-4
    lr = 1e-3 if "full" in tp.kinds.values() else 1e-2
    losses = _steps(tp, fn, lr=lr)
    if mode == "sample-resume":
        row = PIPELINES[case.pipe]
        state = copy.deepcopy(tp.state_dict())
        dtypes = {n: p.dtype for n, p in tp.named_parameters()}
        with tp.sampling() as p:
            call = row.call_kwargs()
            call["num_inference_steps"] = 2
            p(**call)
        after = {n: p.dtype for n, p in tp.named_parameters()}
        if after != dtypes:
            raise Fail("sampling-dtypes", f"{dtypes} -> {after}")
        more = _steps(tp, fn, lr=lr)
        tp.load_state_dict(state)
        if any(not torch.equal(p, state["trainable"][n]) for n, p in tp.named_parameters()):
            raise Fail("resume", "weights differ after load_state_dict")
        losses += more
    return f"losses {[round(x, 4) for x in losses]}"


def _classify(err: BaseException) -> str:
    if isinstance(err, Fail):
        return err.cls
    name = type(err).__name__
    text = str(err).splitlines()[0] if str(err) else ""
    if name == "TrainingError":
        return "refused: " + text[:90]
    return f"{name}: {text[:90]}"


# ------------------------------------------------------------------ the matrix
def _denoiser_pipelines() -> list[str]:
    from hf_precision.recipe.catalog import pipeline_spec
    from hf_precision.testing import PIPELINES

    return [n for n, row in PIPELINES.items() if pipeline_spec(row.recipe).get("denoiser")]


def _components(name: str) -> tuple[str, list[str], list[str]]:
    from hf_precision.recipe.catalog import pipeline_spec
    from hf_precision.testing import PIPELINES, make_pipeline

    pipe = make_pipeline(name)
    den = pipeline_spec(PIPELINES[name].recipe)["denoiser"]
    encs = _text_encoders(pipe)
    with_tok = [e for e in encs if _tokenizer(pipe, e) is not None and hasattr(pipe.components[e], "get_input_embeddings")]
    extra = [c for c in ("controlnet", "adapter") if isinstance(pipe.components.get(c), torch.nn.Module)]
    return den, encs, with_tok + ["|"] + extra


def make_denoiser(name: str) -> Any:
    from hf_precision.recipe.catalog import pipeline_spec
    from hf_precision.testing import PIPELINES, make_pipeline

    return getattr(make_pipeline(name), pipeline_spec(PIPELINES[name].recipe)["denoiser"])


def cases(quick: bool) -> list[Case]:
    from peft import LoraConfig

    from hf_precision.testing import PIPELINES

    out: list[Case] = []
    names = _denoiser_pipelines()
    if quick:
        seen, keep = set(), []
        for n in names:
            if PIPELINES[n].recipe not in seen or "controlnet" in n or "adapter" in n:
                seen.add(PIPELINES[n].recipe)
                keep.append(n)
        names = keep
    layouts = ("cpu-amx", "t4") if quick else LAYOUTS
    for n in names:
        den, encs, rest = _components(n)
        split = rest.index("|")
        tok_encs, extra = rest[:split], rest[split + 1:]
        for lay in LAYOUTS if not quick else ("cpu", "cpu-amx", "t4", "m1-macos13"):
            out.append(Case(n, "lora", lay, train={den: "lora"}))
        for lay in layouts:
            out.append(Case(n, "full", lay, train={den: "full"}))
        out.append(Case(n, "lora", "a100", "bf16-sr", train={den: "lora"}))
        for enc in encs:
            for lay in ("t4",) if quick else ("t4", "a100", "cpu"):
                out.append(Case(n, f"{enc}-lora", lay, train={enc: "lora"}))
        for enc in tok_encs:
            for lay in ("t4",) if quick else ("t4", "a100"):
                out.append(Case(n, f"{enc}-embedding", lay, train={enc: "embedding"}, tokens={enc: ["<tok>"]}))
        if encs:
            out.append(Case(n, f"{den}+{encs[0]}-lora", "t4", train={den: "lora", encs[0]: "lora"}))
        for c in extra:
            for kind in ("full", "lora"):
                for lay in ("t4", "a100"):
                    out.append(Case(n, f"{c}-{kind}", lay, train={c: kind}, warm_zero_convs=c == "controlnet" and kind == "lora"))
        out.append(Case(n, "lora-all-linear", "t4", train={den: "lora"},
                        lora=lambda: LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian", target_modules="all-linear")))
        out.append(Case(n, "lora-ff", "a100", train={den: "lora"},
                        lora=lambda: LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                                                target_modules=["proj", "net.2", "conv1", "conv2", "fc1", "fc2",
                                                                "linear_1", "linear_2", "proj_in", "proj_out"])))
        for lay in ("t4", "a100"):
            out.append(Case(n, "add_adapter-before", lay, train={den: "lora"}, add_adapter=den))
        out.append(Case(n, "sample-resume", "t4", train={den: "lora"}, mode="sample-resume"))
        if den == "unet" and not quick and getattr(type(make_denoiser(n)), "_supports_gradient_checkpointing", False):
            out.append(Case(n, "gc", "t4", train={den: "lora"}, mode="gc"))
    for n in ("sd15", "sdxl"):
        out.append(Case(n, "user-loss", "t4", train={"unet": "lora"}, mode="user-loss"))
        out.append(Case(n, "user-loss-full", "a100", train={"unet": "full"}, mode="user-loss"))
        out.append(Case(n, "gc-full", "t4", train={"unet": "full"}, mode="gc"))
    out.append(Case("sd15", "compile", "t4", train={"unet": "lora"}, mode="compile"))
    for mp in ("bf16", "fp16", "no"):
        out.append(Case("sd15", f"accelerate-{mp}", "t4", train={"unet": "lora"}, mode=f"accelerate-{mp}"))
        out.append(Case("sdxl", f"accelerate-{mp}", "a100", train={"unet": "lora"}, mode=f"accelerate-{mp}"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one pipeline per recipe (plus ControlNet/adapter rows)")
    parser.add_argument("-k", default="", help="only cases whose id contains this string")
    parser.add_argument("--trace", action="store_true", help="print the traceback of each failure")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    todo = [c for c in cases(args.quick) if args.k in c.id]
    classes: Counter[str] = Counter()
    start = time.time()
    for case in todo:
        t0 = time.time()
        try:
            note = run_case(case)
            status = "PASS"
        except Exception as err:  # noqa: BLE001 - a sweep reports every failure and goes on
            status, cls = ("SKIP" if "not installed" in str(err) else "FAIL"), _classify(err)
            note = f"{cls} {err}" if isinstance(err, Fail) else cls
            classes[f"skipped: {cls}" if status == "SKIP" else cls] += 1
            if args.trace:
                traceback.print_exc()
        print(f"{status} {case.id:<60} {time.time() - t0:5.1f}s {note}", flush=True)
    failed = sum(n for c, n in classes.items() if not c.startswith("skipped: "))
    skipped = sum(classes.values()) - failed
    print(f"\n{len(todo)} cases, {len(todo) - failed - skipped} pass, {failed} fail, {skipped} skipped (a package the "
          f"pipeline needs is not installed) ({time.time() - start:.0f}s)")
    for cls, count in classes.most_common():
        print(f"  {count:4d}  {cls}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""A LoRA training step for each denoiser family with a recipe, on its tiny pipeline, in the T4 layout (fp16 compute
with loss scaling: the layout where boundaries and masters go wrong most often); what each family's pipeline feeds
its denoiser (encode_prompt's outputs, SVD's EDM inputs, CogVideoX's rotary embeddings) is what a step feeds it."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_precision as hp
from hf_precision.training import ROWS, example_batch, row_of
from training_checks import assert_planned_storage, run_steps


def _build(name: str):
    from hf_precision.testing import make_pipeline

    return make_pipeline(name, seed=0)


def _recipe_cases() -> dict[str, str]:
    """Every shipped recipe with a denoiser -> the tiny pipeline that represents it (the one named like the recipe,
    else the first registered), plus any tiny pipeline whose recipe lists a further denoiser class (Wan VACE)."""
    from hf_precision.recipe.catalog import list_recipes, pipeline_spec
    from hf_precision.testing import PIPELINES

    cases: dict[str, str] = {}
    for recipe in list_recipes("pipeline"):
        if not pipeline_spec(recipe).get("denoiser") or recipe in NOT_TRAINED:
            continue
        rows = [n for n, row in PIPELINES.items() if row.recipe == recipe]
        for name in sorted(rows, key=lambda n: n != recipe)[:1] + [n for n in rows if n in EXTRA_CLASS_ROWS]:
            cases[name] = recipe
    return cases


# Tiny pipelines whose denoiser is a class of its own under a recipe another row already covers, or a call of its own
# (FLUX.2 dev: the guidance embedding klein lacks, and a Mistral 3 text encoder; SkyReels-V2 DF-1.3B: the fps
# embedding its inject_sample_info config adds).
EXTRA_CLASS_ROWS = ("wan_vace", "wan_animate", "hunyuan_video_framepack", "flux2_dev", "skyreels_v2_df")
# Recipes whose denoiser no training row feeds yet, each refused before loading (test_untrained_recipes_are_refused).
# LTX-2: its transformer denoises video and audio latents together, on the text connectors' outputs rather than
# encode_prompt's (pipeline_ltx2.py:1251, :1415-1436), which no row's inputs describe yet.
NOT_TRAINED: tuple[str, ...] = ("ltx2",)
CASES = _recipe_cases()


# What each pipeline's __call__ hands its denoiser from encode_prompt's outputs (index -> keyword path), read from
# diffusers 0.42.1 pipeline_<family>.py; SDXL's pooled embeddings go in added_cond_kwargs["text_embeds"].
ENCODE_FEEDS = {
    "sd15": {0: ("encoder_hidden_states",)},
    "sdxl": {0: ("encoder_hidden_states",), 2: ("added_cond_kwargs", "text_embeds")},
    "sd3": {0: ("encoder_hidden_states",), 2: ("pooled_projections",)},
    "flux": {0: ("encoder_hidden_states",), 1: ("pooled_projections",)},
    "pixart": {0: ("encoder_hidden_states",), 1: ("encoder_attention_mask",)},
    "sana": {0: ("encoder_hidden_states",), 1: ("encoder_attention_mask",)},
    "wan": {0: ("encoder_hidden_states",)},
    "cogvideox": {0: ("encoder_hidden_states",)},
    "ltx": {0: ("encoder_hidden_states",), 1: ("encoder_attention_mask",)},
    "hunyuan_video": {0: ("encoder_hidden_states",), 1: ("pooled_projections",), 2: ("encoder_attention_mask",)},
    "hunyuan_video_framepack": {0: ("encoder_hidden_states",), 1: ("pooled_projections",), 2: ("encoder_attention_mask",)},
    "qwenimage": {0: ("encoder_hidden_states",), 1: ("encoder_hidden_states_mask",)},
    "hunyuandit": {0: ("encoder_hidden_states",), 2: ("text_embedding_mask",)},
    # pipeline_chroma.py: the prompt mask reaches the transformer extended over the image tokens (checked below)
    "chroma": {0: ("encoder_hidden_states",)},
    "zimage": {0: ("cap_feats",)},  # a list: each prompt's hidden states without its padding
    "ernie_image": {0: ("text_bth",)},  # a list as Z-Image's, padded into text_bth by the call (inputs/ernie_text.py)
    "krea2": {0: ("encoder_hidden_states",), 1: ("encoder_attention_mask",)},
    "cogview3plus": {0: ("encoder_hidden_states",)},
    "cogview4": {0: ("encoder_hidden_states",)},
    "flux2_klein": {0: ("encoder_hidden_states",)},
    "hunyuan_video15": {0: ("encoder_hidden_states",), 1: ("encoder_attention_mask",),
                        2: ("encoder_hidden_states_2",), 3: ("encoder_attention_mask_2",)},
    "skyreels_v2": {0: ("encoder_hidden_states",)},
    "skyreels_v2_df": {0: ("encoder_hidden_states",)},
    "sana_video": {0: ("encoder_hidden_states",), 1: ("encoder_attention_mask",)},
    "chronoedit": {0: ("encoder_hidden_states",)},
    "kandinsky5": {0: ("encoder_hidden_states",), 1: ("pooled_projections",)},
    "easyanimate": {0: ("encoder_hidden_states",)},
    "flux2_dev": {0: ("encoder_hidden_states",)},
    # pipeline_hidream_image.py:933-938: T5, Llama's hidden states stacked layers first, pooled CLIP-L + CLIP-G
    "hidream": {0: ("encoder_hidden_states_t5",), 2: ("encoder_hidden_states_llama3",), 4: ("pooled_embeds",)},
    "bria": {0: ("encoder_hidden_states",)},  # pipeline_bria.py:682-690: T5 zero-padded, no pooled projection
    "ovis_image": {0: ("encoder_hidden_states",)},  # pipeline_ovis_image.py:648-656
    # pipeline_hunyuanimage.py:764-809: Qwen2.5-VL and ByT5 states with their masks, through the guider's batches
    "hunyuan_image": {0: ("encoder_hidden_states",), 1: ("encoder_attention_mask",), 2: ("encoder_hidden_states_2",),
                      3: ("encoder_attention_mask_2",)},
}
# Pipelines whose __call__ encodes the prompt more than once: the options of each call (as __call__ passes them) and
# what it feeds. pipeline_hunyuandit.py: CLIP-side BERT with 77 tokens (text_encoder_index=0), then T5 with 256 (1).
ENCODE_CALLS = {
    "hunyuandit": (({"max_sequence_length": 77, "text_encoder_index": 0}, ENCODE_FEEDS["hunyuandit"]),
                   ({"max_sequence_length": 256, "text_encoder_index": 1},
                    {0: ("encoder_hidden_states_t5",), 2: ("text_embedding_mask_t5",)})),
}


def _capture_kwargs(module):
    seen = {}
    handle = module.register_forward_pre_hook(lambda m, args, kwargs: seen.update(kwargs), with_kwargs=True)
    return seen, handle


def _short_prompts(tp):
    """max_sequence_length=16 where encode_prompt takes it (the defaults, 226-512 tokens, only slow a tiny step);
    CogVideoX's __call__ pads to the transformer's max_text_seq_length (226 in the release, 16 in the tiny model)."""
    import inspect

    denoiser = tp.components[tp.denoiser_name]
    takes = "max_sequence_length" in inspect.signature(tp.pipe.encode_prompt).parameters
    return {"max_sequence_length": int(denoiser.config.get("max_text_seq_length") or 16)} if takes else {}


def _assert_fed_as_the_pipeline_does(name, tp, seen):
    """The conditioning the denoiser got is what the pipeline's own encode_prompt returns, in the denoiser's dtype."""
    import inspect

    pipe = tp.pipe
    params = inspect.signature(pipe.encode_prompt).parameters
    # SD3's encode_prompt requires prompt_2/prompt_3 (None: reuse the prompt, as its __call__ does)
    wanted = {"do_classifier_free_guidance": False, "device": tp.device, "num_images_per_prompt": 1,
              "prompt_2": None, "prompt_3": None, **_short_prompts(tp)}
    for options, feeds in ENCODE_CALLS.get(name, (({}, ENCODE_FEEDS[name]),)):
        kwargs = {k: v for k, v in {**wanted, **options}.items() if k in params}
        with torch.no_grad():
            outputs = pipe.encode_prompt(PROMPTS, **kwargs)
        # one value is one output (ERNIE-Image returns its list of prompts), as tp.encode_prompt reads it
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        for index, path in feeds.items():
            want = outputs[index]
            if want is None:  # QwenImage drops an all-ones mask; the denoiser then gets none either
                assert seen.get(path[0]) is None, path
                continue
            got = seen
            for key in path:
                got = got[key]
            # Z-Image takes a list, one unpadded prompt per sample
            for g, w in zip(got, want, strict=True) if isinstance(want, list) else [(got, want)]:
                assert g.dtype == (tp.compute_dtype if w.is_floating_point() else w.dtype), (path, g.dtype)
                assert torch.equal(g, w.to(g.dtype)), path


PROMPTS = ["a cat"]


# Families whose saved LoRA test_lora_step loads with plain diffusers (the others: tests/test_train_run.py,
# tests/test_training_loop.py).
LORA_LOADS = ("chroma", "zimage", "cogview4", "flux2_klein", "flux2_dev", "hidream", "skyreels_v2", "ernie_image",
              "krea2")


@pytest.mark.parametrize("name", CASES)
def test_lora_step(name, tmp_path):
    """A LoRA step on every recipe's denoiser: 3 steps on a fixed batch, finite falling loss, fp32 masters, frozen
    weights bit-identical and stored as planned; where the pipeline has a text encoder, on tp.encode_prompt's
    conditioning, checked against the pipeline's own encode_prompt as the denoiser receives it; SVD's EDM inputs
    checked against its scheduler."""
    tp = hp.prepare_training(_build(name), layout="t4")
    denoiser = tp.components[tp.denoiser_name]
    assert tp.recipe.name == CASES[name] and row_of(denoiser) is ROWS[type(denoiser).__name__]
    # fp16 where the recipe tolerates it (Lumina2's does not: fp32 on a T4); the scaler iff fp16
    assert tp.compute_dtype in (torch.float16, torch.float32) and (tp.scaler is not None) == (tp.compute_dtype == torch.float16)
    if tp.objective != "flow":  # the noise schedule the pipeline samples with (CogVideoX: SNR-shifted)
        assert torch.equal(tp.alphas_cumprod, _schedule(tp.pipe.scheduler))
    batch = example_batch(denoiser, 1)
    if name in ENCODE_FEEDS:
        # an I2V first frame, its embedding, FramePack's clean prefix
        kept = {k: batch[k] for k in ("latents", "condition_latents", "image_embeds", "image_latents") if k in batch}
        batch = {**kept, **tp.encode_prompt(PROMPTS, **_short_prompts(tp))}
    seen, handle = _capture_kwargs(denoiser)  # registered after the entry hook: sees what the denoiser gets
    try:
        losses = run_steps(tp, batch, steps=3)
    finally:
        handle.remove()
    assert all(torch.isfinite(torch.tensor(losses)))
    assert assert_planned_storage(tp) > 0
    if name in ENCODE_FEEDS:
        _assert_fed_as_the_pipeline_does(name, tp, seen)
    if name == "svd":
        _assert_svd_edm_inputs_match_the_scheduler(tp)
    if name == "chroma":
        _assert_chroma_mask_as_the_pipeline_makes_it(tp, batch, seen)
    if name in IDS_FROM_ENCODE:
        _assert_ids_as_the_pipeline_makes_them(tp, batch, seen, IDS_FROM_ENCODE[name])
    if name in LORA_LOADS:
        _assert_lora_loads_with_plain_diffusers(name, tp, batch, tmp_path / "lora")
    if getattr(denoiser.config, "inject_sample_info", False):
        # the diffusion-forcing call's flag at its default fps=24: 1 (0 is 16 fps), one per sample
        # (pipeline_skyreels_v2_diffusion_forcing.py:625, :767-768); without it the forward fails on fps=None
        assert seen["fps"].tolist() == [1] * batch["latents"].shape[0], seen.get("fps")


@pytest.mark.parametrize("recipe", NOT_TRAINED)
def test_untrained_recipes_are_refused(recipe):
    """A recipe whose denoiser no training row feeds: the plan applies, and the loss is refused in one RecipeError
    naming the class and the user's way out, not computed on inputs its pipeline never gives it (the CLI's
    `train` refuses it before loading: benchmarks/command_sweep.py)."""
    from hf_precision.testing import PIPELINES

    name = next(n for n, row in PIPELINES.items() if row.recipe == recipe)
    tp = hp.prepare_training(_build(name), layout="cpu")
    with pytest.raises(hp.RecipeError, match=r"\(transformer\): no training row.*tp\.autocast\(\)"):
        tp.loss({"latents": torch.zeros(1, 4, 2, 4, 4)})


def test_ernie_image_inputs_are_its_pipelines():
    """ERNIE-Image's row packs the latents (and the target) with its pipeline's own _patchify_latents, and the
    `ernie_text` builder pads the per-prompt list as its _pad_text does (pipeline_ernie_image.py:174-179, :190-204)."""
    from diffusers import ErnieImagePipeline
    from hf_precision.training.denoiser_rows import noisy_inputs

    tp = hp.prepare_training(_build("ernie_image"), layout="cpu")
    denoiser = tp.components[tp.denoiser_name]
    gen = torch.Generator().manual_seed(0)
    texts = [torch.randn(3, 8, generator=gen), torch.randn(5, 8, generator=gen)]  # two prompts, unpadded
    x0 = torch.randn(2, 4, 8, 8, generator=gen)
    batch = {"latents": x0, "prompt_embeds": texts, "sigmas": torch.tensor([0.0, 0.0])}
    kwargs, target = noisy_inputs(row_of(denoiser), denoiser, batch, "flow", None)
    assert torch.equal(kwargs["hidden_states"], ErnieImagePipeline._patchify_latents(x0))  # sigma 0: x0 itself
    assert target.shape == (2, 16, 4, 4)
    text_bth, lens = ErnieImagePipeline._pad_text(texts, "cpu", torch.float32, 8)
    assert torch.equal(kwargs["text_bth"], text_bth) and torch.equal(kwargs["text_lens"], lens)


def test_krea2_position_ids_are_its_pipelines():
    """Krea 2's row feeds the RoPE coordinates its pipeline's prepare_position_ids makes for the prompt length and
    the packed grid (pipeline_krea2.py:382-390, :608-610), and its example batch stacks the layers per token."""
    from diffusers import Krea2Pipeline
    from hf_precision.training.denoiser_rows import noisy_inputs

    tp = hp.prepare_training(_build("krea2"), layout="cpu")
    denoiser = tp.components[tp.denoiser_name]
    batch = example_batch(denoiser, 2, side=8, tokens=5)
    assert batch["prompt_embeds"].shape == (2, 5, denoiser.config.num_text_layers, denoiser.config.text_hidden_dim)
    kwargs, _ = noisy_inputs(row_of(denoiser), denoiser, batch, "flow", None)
    assert torch.equal(kwargs["position_ids"], Krea2Pipeline.prepare_position_ids(5, 4, 4, "cpu"))


def test_hidream_trains_toward_what_its_pipeline_steps_with():
    """HiDream's pipeline steps the scheduler with minus the transformer's output (pipeline_hidream_image.py:942): a
    transformer that predicts the training target exactly takes the pipeline's own last step (sigma -> 0) from the
    noisy latents to the clean ones; the step runs in train mode, whose output diffusers patchifies unless
    force_inference_output; the batch holds the Llama states (layers first in the pipeline) batch-first, so the
    training program's per-caption cache joins them as one encode of the captions, and the denoiser gets them as the
    pipeline's own encode_prompt gives them."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from hf_precision.training.denoiser_rows import noisy_inputs

    tp = hp.prepare_training(_build("hidream"), layout="cpu")
    denoiser = tp.components[tp.denoiser_name].train()
    captions = ["a cat", "a dog", "a red fox"]
    batch = {"latents": torch.randn(3, 4, 8, 8, generator=torch.Generator().manual_seed(0)),
             **tp.encode_prompt(captions, max_sequence_length=16)}
    one_by_one = [tp.encode_prompt([c], max_sequence_length=16)["prompt_embeds_llama3"] for c in captions]
    assert torch.equal(torch.cat(one_by_one), batch["prompt_embeds_llama3"])  # as apps/train/loop.py _from_cache
    sigma = torch.tensor([0.7, 0.7, 0.7])
    kwargs, target = noisy_inputs(row_of(denoiser), denoiser, {**batch, "sigmas": sigma}, tp.objective, None,
                                  torch.Generator().manual_seed(1))
    scheduler = FlowMatchEulerDiscreteScheduler()
    scheduler.set_timesteps(sigmas=[0.7], device="cpu")  # one step: 0.7 -> 0
    stepped = scheduler.step(-target, scheduler.timesteps[0], kwargs["hidden_states"]).prev_sample
    assert torch.allclose(stepped, batch["latents"], atol=1e-5)
    seen, handle = _capture_kwargs(denoiser)
    try:
        loss = tp.loss(batch, generator=torch.Generator().manual_seed(0))  # train mode: (B, C, H, W) out, or it fails
    finally:
        handle.remove()
    llama = tp.pipe.encode_prompt(captions, max_sequence_length=16, do_classifier_free_guidance=False)[2]
    assert torch.equal(seen["encoder_hidden_states_llama3"], llama) and torch.isfinite(loss)


def _assert_chroma_mask_as_the_pipeline_makes_it(tp, batch, seen):
    """pipeline_chroma.py _prepare_attention_mask: the prompt mask, then one attended position per 2x2 latent patch."""
    h, w = batch["latents"].shape[-2:]
    want = tp.pipe._prepare_attention_mask(1, (h // 2) * (w // 2), tp.compute_dtype, batch["prompt_attention_mask"])
    assert torch.equal(seen["attention_mask"], want.to(seen["attention_mask"].dtype))


# Flux-shaped pipelines whose encode_prompt returns the text position ids (at this index) and whose
# _prepare_latent_image_ids makes the image ones: Ovis-Image's text ids are (0, i, i), not Flux's zeros.
IDS_FROM_ENCODE = {"bria": 2, "ovis_image": 2}


def _assert_ids_as_the_pipeline_makes_them(tp, batch, seen, index):
    """The RoPE ids the denoiser got are the pipeline's own: txt_ids from encode_prompt, img_ids per 2x2 patch."""
    with torch.no_grad():
        txt = tp.pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=False, device=tp.device,
                                    **_short_prompts(tp))[index]
    h, w = batch["latents"].shape[-2:]
    img = tp.pipe._prepare_latent_image_ids(1, h // 2, w // 2, tp.device, torch.float32)
    assert torch.equal(seen["txt_ids"].float().reshape(-1, 3), txt.float().reshape(-1, 3))
    assert torch.equal(seen["img_ids"].float().reshape(-1, 3), img.reshape(-1, 3))


def _schedule(scheduler):
    own = getattr(scheduler, "alphas_cumprod", None)
    if own is None:  # DDPMWuerstchenScheduler: continuous t in [0, 1]
        return scheduler._alpha_cumprod(torch.arange(1000) / 1000, "cpu")
    return own.float()


def test_every_recipe_denoiser_class_has_a_row():
    """Read from the recipes: every denoiser class a shipped recipe plans has a row (test_lora_step trains each)."""
    from hf_precision.recipe.catalog import _denoiser_index

    named = {cls for _, cls in _denoiser_index()}
    # Cosmos: no tiny pipeline can be built without cosmos_guardrail, so no row is written untested; `train` on it
    # ends in one line of ours (the missing package here, else "no training row"), tests/test_requires.py; LTX-2:
    # NOT_TRAINED above
    untrained = {"CosmosTransformer3DModel", "LTX2VideoTransformer3DModel"}
    assert named - set(ROWS) == untrained, "denoiser classes of shipped recipes without a training row"


class MyDenoiser(torch.nn.Module):
    """A denoiser class no row knows (a user's own wrapper with its own call)."""

    def __init__(self, unet):
        super().__init__()
        self.inner = unet

    def forward(self, x, t, cond):
        return self.inner(x, t, encoder_hidden_states=cond).sample


def test_an_unknown_denoiser_class_composes_as_inference_does():
    """No row: the dtype plan still applies (half base, fp32 LoRA masters, scaler); tp.loss names the class and how
    to call it; the user's own loss under tp.autocast() trains through the same plan."""
    from diffusers import DiffusionPipeline

    class MyPipeline(DiffusionPipeline):
        def __init__(self, unet, vae, scheduler):
            super().__init__()
            self.register_modules(unet=unet, vae=vae, scheduler=scheduler)

    sd15 = _build("sd15")
    tp = hp.prepare_training(MyPipeline(unet=MyDenoiser(sd15.unet), vae=sd15.vae, scheduler=sd15.scheduler),
                             layout="t4", train={"unet": "lora"})
    assert tp.compute_dtype == torch.float16 and tp.scaler is not None and tp.kinds["unet"] == "lora"
    batch = example_batch(sd15.unet, 1)
    with pytest.raises(hp.RecipeError, match=r"MyDenoiser \(unet\): no training row.*tp\.autocast\(\)"):
        tp.loss(batch)
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(batch["latents"].shape, generator=gen)
    a = tp.alphas_cumprod[500]
    noisy = a.sqrt() * batch["latents"] + (1 - a).sqrt() * noise

    def own_loss():
        with tp.autocast():
            pred = tp.components["unet"](noisy, torch.tensor([500]), batch["prompt_embeds"])
        return torch.nn.functional.mse_loss(pred.float(), noise)

    run_steps(tp, batch, steps=3, loss_fn=own_loss)
    assert assert_planned_storage(tp) > 0
    with pytest.raises(hp.RecipeError, match="Linear \\(the denoiser\\): no training row"):
        row_of(torch.nn.Linear(2, 2))


def test_a_pipeline_class_without_recipe_composes_as_inference_does():
    from diffusers import DiffusionPipeline

    from hf_precision.testing import make_pipeline

    class MyPipeline(DiffusionPipeline):  # a custom pipeline no shipped recipe lists
        def __init__(self, unet, vae, scheduler):
            super().__init__()
            self.register_modules(unet=unet, vae=vae, scheduler=scheduler)

    sd15 = make_pipeline("sd15", seed=0)
    pipe = MyPipeline(unet=sd15.unet, vae=sd15.vae, scheduler=sd15.scheduler)
    tp = hp.prepare_training(pipe, layout="t4")
    assert tp.recipe.name.startswith("composed") and tp.denoiser_name == "unet" and tp.kinds["unet"] == "lora" and tp.compute_dtype == torch.float16
    run_steps(tp, example_batch(tp.components["unet"], 1), steps=2)


def test_components_given_without_their_pipeline_take_their_denoisers_recipe():
    pipe = _build("flux")
    tp = hp.prepare_training({"transformer": pipe.transformer, "vae": pipe.vae, "scheduler": pipe.scheduler}, layout="t4")
    assert tp.recipe.name == "flux" and tp.kinds == {"transformer": "lora", "vae": "frozen"} and tp.objective == "flow"
    with pytest.raises(hp.RecipeError, match=r"no shipped recipe has a denoiser of the classes given \(unet: Linear\)"):
        hp.prepare_training({"unet": torch.nn.Linear(2, 2)})


def _assert_svd_edm_inputs_match_the_scheduler(tp):
    """SVD's training inputs are what its scheduler's scale_model_input and timesteps give at the same sigma."""
    from hf_precision.training.denoiser_rows import noisy_inputs

    assert tp.objective == "edm" and tp.sigma_range == (0.002, 700.0)
    unet, scheduler = tp.components["unet"], copy.deepcopy(tp.pipe.scheduler)
    scheduler.set_timesteps(4)
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(1, 4, 2, 8, 8, generator=gen)  # the VAE's (B, C, F, H, W)
    noise = torch.randn(x0.shape, generator=gen)
    frames_first = lambda x: x.transpose(1, 2)  # pipeline_stable_video_diffusion.py's (B, F, C, H, W)
    for i in (0, 2):
        t, sigma = scheduler.timesteps[i], scheduler.sigmas[i]
        sample = frames_first(x0 + sigma * noise)  # the pipeline's latents at this sigma
        scheduler._step_index = None
        want = scheduler.scale_model_input(sample, t)
        batch = {"latents": x0, "noise": noise, "sigmas": sigma[None], "condition_latents": torch.randn(x0.shape),
                 "image_embeds": torch.randn(1, 1, unet.config.cross_attention_dim)}  # its first frame's CLIP embeds
        kwargs, target = noisy_inputs(row_of(unet), unet, batch, tp.objective, tp.alphas_cumprod,
                                      sigmas=tp.sigma_range)
        torch.testing.assert_close(kwargs["sample"][:, :, :4], want)  # image latents are concatenated after it
        torch.testing.assert_close(kwargs["timestep"], t[None])  # c_noise = 0.25 ln(sigma)
        # The target is the output the scheduler's step turns back into x0.
        scheduler._step_index = None
        x0_back = scheduler.step(target, t, sample).pred_original_sample
        torch.testing.assert_close(x0_back, frames_first(x0), rtol=1e-4, atol=1e-4)


def test_cogvideox_rotary_embeddings():
    """CogVideoX 5B and 1.5 use RoPE: tp.loss hands the denoiser the pipeline's image_rotary_emb, in fp32."""
    from diffusers import CogVideoXTransformer3DModel

    for version, extra in (("1.0-5b", {}), ("1.5", {"patch_size_t": 2, "patch_bias": False})):
        part = _build("cogvideox")
        config = {k: v for k, v in part.transformer.config.items() if not k.startswith("_")}
        base = {**config, "use_rotary_positional_embeddings": True, "num_attention_heads": 2, "attention_head_dim": 16,
                "sample_width": 8, "sample_height": 8}
        torch.manual_seed(0)
        part.register_modules(transformer=CogVideoXTransformer3DModel.from_config({**base, **extra}).eval())
        batch = example_batch(part.transformer, 1)
        frames, h, w = batch["latents"].shape[2:]
        factor = part.vae_scale_factor_spatial
        want = part._prepare_rotary_positional_embeddings(h * factor, w * factor, frames, torch.device("cpu"))
        tp = hp.prepare_training(part, layout="t4")
        seen, handle = _capture_kwargs(tp.components["transformer"])
        with torch.no_grad():
            tp.loss(batch, generator=torch.Generator().manual_seed(0))
        handle.remove()
        for got, ref in zip(seen["image_rotary_emb"], want):
            assert got.dtype == torch.float32 and torch.equal(got, ref), version
        run_steps(tp, batch, steps=2)


def test_micro_conditioning_counts_pixels_with_the_pipelines_own_vae_factor():
    """SDXL's time ids are pixel sizes: the pipeline multiplies the latent size by its vae_scale_factor (2 in the
    tiny model, 8 in the released one); a fixed 8 conditioned every tiny step on 4x the size sampling gives. (PixArt's
    resolution and HunyuanDiT's image meta size go through the same inputs.pixel_size.)"""
    name, key = "sdxl", "time_ids"
    pipe = _build(name)
    factor = pipe.vae_scale_factor
    for given in (pipe, dict(pipe.components)):  # a pipeline, and its parts as a training script holds them
        tp = hp.prepare_training(given, layout="cpu")
        denoiser = tp.components[tp.denoiser_name]
        batch = example_batch(denoiser, 1)
        seen, handle = _capture_kwargs(denoiser)
        with torch.no_grad():
            tp.loss(batch, generator=torch.Generator().manual_seed(0))
        handle.remove()
        h, w = batch["latents"].shape[-2:]
        assert seen["added_cond_kwargs"][key][0, :2].tolist() == [h * factor, w * factor], (name, type(given))



def _assert_lora_loads_with_plain_diffusers(name, tp, batch, folder):
    """tp.save_lora writes what `pipe.load_lora_weights(folder)` reads on a fresh pipeline, no hf_precision involved,
    and the denoiser's output then changes (a LoRA whose B is still zero, or keys diffusers skips, would not)."""
    from hf_precision.training.denoiser_rows import model_output, noisy_inputs

    tp.save_lora(folder)
    fresh = _build(name)
    denoiser = getattr(fresh, tp.denoiser_name)
    kwargs, target = noisy_inputs(row_of(denoiser), denoiser, {"latents": batch["latents"], **example_batch(denoiser, 1)},
                             tp.objective, tp.alphas_cumprod, torch.Generator().manual_seed(0))
    row = row_of(denoiser)
    with torch.no_grad():
        before = model_output(denoiser(**kwargs), target, row)
        fresh.load_lora_weights(str(folder))
        after = model_output(denoiser(**kwargs), target, row)
    assert any("lora_" in n for n, _ in denoiser.named_parameters()), name
    assert torch.isfinite(after).all() and not torch.allclose(before, after), name


@pytest.mark.parametrize("name, edit", [("flux_kontext", "FluxKontextPipeline"), ("qwenimage", "QwenImageEditPipeline")])
def test_a_reference_image_joins_the_tokens_as_the_edit_pipeline_joins_them(name, edit):
    """Flux Kontext and Qwen-Image Edit train the denoiser of Flux / Qwen-Image with the reference image's latents
    (batch["reference_latents"], another size than the target's) packed after the noisy latents, positioned as the
    edit pipeline's own prepare_latents / img_shapes place them; the loss compares the latents' tokens only."""
    import diffusers

    pipe = _build(name)  # Qwen-Image's parts are the Edit pipeline's, less its image processor
    pipe.latent_channels = pipe.vae.config.get("z_dim") or pipe.vae.config.get("latent_channels")  # as Edit sets it
    tp = hp.prepare_training(pipe, layout="cpu")
    denoiser = tp.components[tp.denoiser_name]
    batch = example_batch(denoiser, 1)
    c, h, w = batch["latents"].shape[1:]
    reference = torch.randn(1, c, 1, h, w + 4, generator=torch.Generator().manual_seed(1))  # as a 3D VAE gives it
    batch["reference_latents"] = reference if name == "qwenimage" else reference[:, :, 0]
    f = pipe.vae_scale_factor
    made = getattr(diffusers, edit).prepare_latents(pipe, batch["reference_latents"], 1, c, h * f, w * f, torch.float32,
                                                    "cpu", torch.Generator().manual_seed(0))
    seen, handle = _capture_kwargs(denoiser)
    try:
        losses = run_steps(tp, batch, steps=2)
    finally:
        handle.remove()
    assert all(torch.isfinite(torch.tensor(losses)))
    tokens = (h // 2) * (w // 2)
    assert torch.equal(seen["hidden_states"][:, tokens:], made[1])  # the reference's tokens, after the latents'
    if name == "flux_kontext":  # its ids after the latents', with index 0 set to 1
        assert torch.equal(seen["img_ids"], torch.cat([made[2], made[3]]))
    else:  # pipeline_qwenimage_edit.py __call__: img_shapes of the latents, then of the reference
        assert seen["img_shapes"] == [[(1, h // 2, w // 2), (1, h // 2, (w + 4) // 2)]]


def _wan22():
    """The tiny Wan pipeline with a second expert, as Wan 2.2 A14B ships: transformer (high noise), transformer_2."""
    pipe = _build("wan")
    torch.manual_seed(1)
    pipe.register_modules(transformer_2=type(pipe.transformer).from_config(pipe.transformer.config).eval())
    pipe.register_to_config(boundary_ratio=0.875)
    return pipe


def test_wan22_trains_the_expert_that_owns_the_noise_levels_it_draws(tmp_path):
    """pipeline_wan.py calls transformer for t >= boundary_ratio * num_train_timesteps and transformer_2 below: a
    step trains one expert, called only at its own timesteps; both at once, or a dict that cannot say the boundary,
    is one clear error."""
    boundary = 0.875 * 1000
    for expert, owns in (("transformer", lambda t: t >= boundary), ("transformer_2", lambda t: t < boundary)):
        tp = hp.prepare_training(_wan22(), layout="cpu", train={expert: "lora"})
        other = "transformer_2" if expert == "transformer" else "transformer"
        assert tp.denoiser_name == expert and f"denoiser: {expert}, on noise levels" in str(tp)
        batch = example_batch(tp.components[expert], 4)
        seen, handle = _capture_kwargs(tp.components[expert])
        called, other_handle = _capture_kwargs(tp.components[other])
        try:
            tp.backward(tp.loss(batch, generator=torch.Generator().manual_seed(0)))
        finally:
            handle.remove(), other_handle.remove()
        assert not called and all(owns(float(t)) for t in seen["timestep"]), (expert, seen["timestep"])
        assert all(p.grad is not None for n, p in tp.named_parameters() if n.startswith(f"{expert}."))
        tp.step(torch.optim.AdamW(tp.parameters(), lr=1e-2))  # LoRA B leaves zero: the saved LoRA then acts
        with pytest.raises(hp.RecipeError, match=r"batch\['sigmas'\] .* leave the trained denoiser's noise levels"):
            tp.loss({**batch, "sigmas": torch.full((4,), 0.5 if expert == "transformer" else 0.95)})
    # diffusers saves and loads the low-noise expert's LoRA as a transformer LoRA put into transformer_2
    tp.save_lora(tmp_path / "lora")
    fresh = _wan22()
    kwargs, _ = hp.training.denoiser_rows.noisy_inputs(row_of(fresh.transformer_2), fresh.transformer_2, batch,
                                                       tp.objective, None, torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = fresh.transformer_2(**kwargs)[0]
        fresh.load_lora_weights(str(tmp_path / "lora"), load_into_transformer_2=True)
        after = fresh.transformer_2(**kwargs)[0]
    assert not torch.allclose(before, after) and not any("lora_" in n for n, _ in fresh.transformer.named_parameters())
    with pytest.raises(hp.RecipeError, match=r"switches experts at boundary_ratio 0.875 .*train one per run"):
        hp.prepare_training(_wan22(), layout="cpu", train={"transformer": "lora", "transformer_2": "lora"})
    with pytest.raises(hp.RecipeError, match=r"a dict does not say .*boundary_ratio"):
        hp.prepare_training(dict(_wan22().components), layout="cpu")


def test_the_programs_caption_cache_keeps_a_conditioning_list():
    """`hf-precision train` caches each caption's encoding as tensors (safetensors): Z-Image's prompt, a list of one
    unpadded tensor per caption, was dropped (its forward then lacked cap_feats); it is kept and rebuilt in order."""
    from hf_precision.apps.train.batches import _cacheable, _from_cache

    a, b = torch.ones(3, 4), torch.zeros(5, 4)  # two captions of different lengths
    entries = [_cacheable({"prompt_embeds": [a]}), _cacheable({"prompt_embeds": [b], "mask": torch.ones(1, 2)})]
    entries[0]["mask"] = torch.zeros(1, 2)
    batch = _from_cache(entries)
    assert [t.shape for t in batch["prompt_embeds"]] == [a.shape, b.shape] and batch["mask"].shape == (2, 2)


def test_flux2_latents_are_normalised_where_its_pipeline_normalises_them(monkeypatch):
    """FLUX.2's VAE keeps batch-norm statistics per channel of the 2x2-patchified latents and its pipeline normalises
    there (pipeline_flux2.py _encode_vae_image); the config's scaling/shift (what every other VAE uses) mis-scaled
    the training latents. Sampling aside (its mode is compared), ours packed 2x2 equal the pipeline's exactly."""
    import types

    from hf_precision.testing import make_pipeline
    from hf_precision.training import encode

    pipe = make_pipeline("flux2_klein")
    torch.manual_seed(0)
    with torch.no_grad():
        pipe.vae.bn.running_mean.normal_()
        pipe.vae.bn.running_var.uniform_(0.5, 2.0)
        pixels = torch.rand(1, 3, 64, 64) * 2 - 1
        theirs = pipe._encode_vae_image(pixels, generator=None)
    monkeypatch.setattr(encode, "vae_latents", lambda vae, x, generator, mode=False: vae.encode(x).latent_dist.mode())
    ours = encode.encode_images(types.SimpleNamespace(components={"vae": pipe.vae}), pixels)
    b, c, h, w = ours.shape
    packed = ours.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(b, c * 4, h // 2, w // 2)
    torch.testing.assert_close(packed, theirs.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["hunyuan_image_distilled", "hunyuan_image"])
def test_a_meanflow_model_trains_at_r_equal_t(name, tiny_pipe):
    """HunyuanImage 2.1 distilled (``use_meanflow``) always gets a second timestep at inference
    (pipeline_hunyuanimage.py:755-760); the training step passed none, conditioning it on an embedding it never sees.
    Its flow-matching loss trains the instantaneous velocity, the average velocity at r = t. The base model has no r."""
    tp = hp.prepare_training(tiny_pipe(name), device="cpu", train={"transformer": "lora"}, rank=2)
    module = tp.components["transformer"]
    seen, handle = _capture_kwargs(module)
    try:
        tp.loss(example_batch(module, side=8))
    finally:
        handle.remove()
    if module.config.get("use_meanflow"):
        torch.testing.assert_close(seen["timestep_r"], seen["timestep"])
    else:
        assert seen.get("timestep_r") is None

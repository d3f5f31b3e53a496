"""What a tiny pipeline cannot say as data, registered by name; rows of ``hf_precision/testing/tiny/*.yaml`` name it.

Four kinds, each a table of :data:`HOOKS`:

- ``tokenizer``: a handmade offline tokenizer (a component ``{tokenizer: clip}``);
- ``component``: a component built from components built before it (``{hook: controlnet_from_unet, config: ...}``);
  it runs seeded like a model, with the component's ``config`` as keyword arguments;
- ``after``: applied to a model right after it is built, inside its seeded build (``after: zero_pos_frequencies``);
- ``prepare``: applied to the finished pipeline, and again by ``TinyPipeline.ready`` to one loaded from a saved
  folder (what the folder does not keep).

A row may name only what is registered here; :mod:`~hf_precision.testing.rows` says so, naming the file and row::

    >>> sorted(HOOKS["tokenizer"])
    ['bert', 'clip', 'gemma', 'glm4', 'hunyuan_i2v_chat', 'kandinsky5_qwen', 'kandinsky5_t2i_qwen', 'krea2_qwen', 'llama', 'mistral3_chat', 'qwen2', 'qwen2_vl_chat', 'qwen3_chat', 't5']
    >>> @register("after", "halve")
    ... def _halve(model):
    ...     model.weight.data /= 2
    >>> "halve" in HOOKS["after"]
    True
    >>> del HOOKS["after"]["halve"]
"""

from __future__ import annotations

from typing import Any, Callable

from . import tokenizers

__all__ = ["HOOKS", "register"]

HOOKS: dict[str, dict[str, Callable[..., Any]]] = {"tokenizer": {}, "component": {}, "after": {}, "prepare": {}}


def register(kind: str, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as hook ``name`` of ``kind`` (``tokenizer``, ``component``, ``after``,
    ``prepare``); a second function under one name is an error, not a silent replacement.

    >>> register("prepare", "allegro_tiling")(print)
    Traceback (most recent call last):
    ...
    ValueError: a prepare hook is already registered as 'allegro_tiling'
    """
    if kind not in HOOKS:
        raise ValueError(f"unknown hook kind {kind!r}; use one of {sorted(HOOKS)}")

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        if name in HOOKS[kind]:
            raise ValueError(f"a {kind} hook is already registered as {name!r}")
        HOOKS[kind][name] = function
        return function

    return decorate


for _name, _make in (("clip", tokenizers.make_tokenizer), ("t5", tokenizers.make_t5_tokenizer),
                     ("gemma", tokenizers.make_gemma_tokenizer), ("qwen2", tokenizers.make_qwen2_tokenizer),
                     ("bert", tokenizers.make_bert_tokenizer), ("llama", tokenizers.make_llama_tokenizer)):
    register("tokenizer", _name)(_make)


@register("tokenizer", "hunyuan_i2v_chat")
def _hunyuan_i2v_chat() -> Any:
    # HunyuanVideo I2V cuts its own prompt template's encoding at fixed token positions: the tokenizer must read
    # that template as a real one does (make_llama_chat_tokenizer)
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video_image2video import DEFAULT_PROMPT_TEMPLATE

    return tokenizers.make_llama_chat_tokenizer(DEFAULT_PROMPT_TEMPLATE["template"])


@register("tokenizer", "qwen3_chat")
def _qwen3_chat() -> Any:
    # Z-Image wraps each prompt in the tokenizer's chat template (pipeline_z_image.py _encode_prompt,
    # apply_chat_template with enable_thinking): the handmade Qwen2 byte-level BPE with Qwen's ChatML template
    tok = tokenizers.make_qwen2_tokenizer()
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tok


@register("tokenizer", "glm4")
def _glm4() -> Any:
    # GLM-4's tokenizer (CogView4's) starts every text with [gMASK]<sop>: CogView4 encodes an empty negative prompt,
    # which without them is an empty sequence its text encoder cannot run (pipeline_cogview4.py _get_glm_embeds).
    # The handmade Qwen2 byte-level BPE (GLM-4's is byte-level BPE too) with that prefix; saved in tokenizer.json.
    from tokenizers.processors import TemplateProcessing

    tok = tokenizers.make_qwen2_tokenizer()
    tok.add_tokens(["[gMASK]", "<sop>"], special_tokens=True)
    prefix = [(t, tok.convert_tokens_to_ids(t)) for t in ("[gMASK]", "<sop>")]
    tok._tokenizer.post_processor = TemplateProcessing(single="[gMASK] <sop> $A", pair="[gMASK] <sop> $A $B",
                                                       special_tokens=prefix)
    return tok


@register("component", "controlnet_from_unet")
def _controlnet_from_unet(parts: dict[str, Any], **config: Any) -> Any:
    # a ControlNet's config follows its UNet's (block types, channels, cross-attention width): diffusers derives it
    from diffusers import ControlNetModel

    return ControlNetModel.from_unet(parts["unet"], load_weights_from_unet=False, **config)


@register("after", "zero_pos_frequencies")
def _zero_pos_frequencies(model: Any) -> None:
    # as diffusers' Mochi test: random frequencies make RoPE meaningless
    model.pos_frequencies.data.zero_()


@register("after", "zimage_pad_tokens")
def _zimage_pad_tokens(model: Any) -> None:
    # as diffusers' Z-Image test: x_pad_token and cap_pad_token start as torch.empty, which can hold NaN
    import torch

    with torch.no_grad():
        model.x_pad_token.fill_(1.0)
        model.cap_pad_token.fill_(1.0)


@register("prepare", "allegro_tiling")
def _allegro_tiling(pipe: Any) -> None:
    # AutoencoderKLAllegro._decode raises NotImplementedError without tiling (diffusers v0.42.1
    # models/autoencoders/autoencoder_kl_allegro.py:841); tiling is not saved in the folder. Its tile is
    # 24 frames x sample_size (autoencoder_kl_allegro.py:789-795): larger than the tiny 8x16x16 video, so no
    # tile would be decoded and the frames would be all zeros; one tile is the whole tiny video here.
    pipe.vae.enable_tiling()
    pipe.vae.kernel = pipe.vae.stride = (8, 16, 16)


@register("prepare", "hunyuan_video15_lengths")
def _hunyuan_video15_lengths(pipe: Any) -> None:
    # HunyuanVideo 1.5 pads every prompt to 1000 Qwen tokens and 256 ByT5 tokens and feeds 729 (zero, for text-to-video)
    # image tokens, fixed in __init__ rather than config (pipeline_hunyuan_video1_5.py:235-238): at tiny widths those
    # ~2000 tokens, not the model, were the run's cost. The folder does not keep them; the commands run the real ones.
    pipe.tokenizer_max_length = pipe.tokenizer_2_max_length = 16
    pipe.vision_num_semantic_tokens = 8


@register("prepare", "hunyuan_image_lengths")
def _hunyuan_image_lengths(pipe: Any) -> None:
    # HunyuanImagePipeline pads every prompt to 1000 Qwen tokens (after its 34-token template) and 128 ByT5 tokens,
    # fixed in __init__ rather than config (pipeline_hunyuanimage.py:217-218): at tiny widths those ~1130 text tokens,
    # and the ByT5 mapper's fixed 2048-wide layers on 128 of them (transformer_hunyuanimage.py:707), were the run's
    # cost. The tiny tokenizer spells the template and prompt in ~140 tokens, the quoted word in 12 bytes: 160 and 16
    # keep both and some padding, so the transformer still sorts valid from masked tokens of each stream. The folder
    # does not keep them; the commands run the real lengths.
    pipe.tokenizer_max_length, pipe.tokenizer_2_max_length = 160, 16


@register("prepare", "hidream_sample_size")
def _hidream_sample_size(pipe: Any) -> None:
    # HiDreamImagePipeline rescales every call to (default_sample_size * vae_scale_factor)**2 pixels, whatever height
    # and width it is given (pipeline_hidream_image.py:814-817), and sets default_sample_size = 128 in __init__
    # (:198), which no saved folder keeps: 4096 image tokens at any size, 10-20 s a tiny call on a shared CPU. 16 makes
    # the tiny call's 32x32 pixels what it asks for.
    pipe.default_sample_size = 16


@register("tokenizer", "mistral3_chat")
def _mistral3_chat() -> Any:
    # FLUX.2 [dev] encodes [system, user] messages whose content is a list of {"type": "text", "text": ...} parts
    # through its processor's apply_chat_template (pipeline_flux2.py format_input, :323): the handmade byte-level
    # BPE with a Mistral-style template ([SYSTEM_PROMPT] ... [INST] ... [/INST]) that reads such parts
    tok = tokenizers.make_qwen2_tokenizer()
    tok.add_special_tokens({"pad_token": "<pad>"})
    tok.chat_template = ("{% for m in messages %}{% set text = m['content'] if m['content'] is string else "
                         "m['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('') %}"
                         "{% if m['role'] == 'system' %}[SYSTEM_PROMPT]{{ text }}[/SYSTEM_PROMPT]"
                         "{% else %}[INST]{{ text }}[/INST]{% endif %}{% endfor %}")
    return tok


@register("tokenizer", "kandinsky5_qwen")
def _kandinsky5_qwen() -> Any:
    # Kandinsky 5 wraps each prompt in a ~130-token system template and cuts the Qwen2.5-VL states at token 128
    # (diffusers v0.42.1 pipelines/kandinsky5/pipeline_kandinsky.py:189-201, :374); the handmade byte-level BPE reads
    # that template one byte a token (~790), so the cut kept most of it and the commands' 512-token default truncated
    # the prompt with a warning. Merges for the words of the template (read from the pipeline's __init__, where it is
    # written) make it about as many tokens as Qwen's tokenizer: 134 up to the prompt.
    import inspect

    from diffusers import Kandinsky5T2VPipeline

    return tokenizers.make_qwen2_words_tokenizer(inspect.getsource(Kandinsky5T2VPipeline.__init__))


@register("after", "kandinsky5_modulation")
def _kandinsky5_modulation(model: Any) -> None:
    # Kandinsky5Modulation zero-initialises its layer (diffusers v0.42.1 transformer_kandinsky.py:268-269): every
    # gate is 0, so a random tiny model's blocks add nothing and a LoRA on their attention gets no gradient. Trained
    # weights are not zero; a seeded draw like the other layers' stands in for them.
    import torch

    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith("modulation"):
                torch.nn.init.normal_(module.out_layer.weight, std=0.1)
                torch.nn.init.normal_(module.out_layer.bias, std=0.1)


@register("tokenizer", "qwen2_vl_chat")
def _qwen2_vl_chat() -> Any:
    # EasyAnimate V5.1 wraps each prompt in Qwen2-VL's chat template as a message whose content is a list of
    # {"type": "text", "text": ...} parts (diffusers v0.42.1 pipelines/easyanimate/pipeline_easyanimate.py:298-313):
    # the handmade byte-level BPE with Qwen's ChatML template reading such parts
    tok = tokenizers.make_qwen2_tokenizer()
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}"
                         "{{ m['content'] }}{% else %}{% for part in m['content'] %}{% if part['type'] == 'text' %}"
                         "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tok


@register("tokenizer", "kandinsky5_t2i_qwen")
def _kandinsky5_t2i_qwen() -> Any:
    # Kandinsky 5 Image cuts the Qwen2.5-VL states of its own ~40-token system template at token 40 (diffusers v0.42.1
    # pipelines/kandinsky5/pipeline_kandinsky_t2i.py:178-179, :240): as for the video model's template (above), merges
    # for that template's words put its cut inside the template's last line, as Qwen's own tokenizer does.
    import inspect

    from diffusers import Kandinsky5T2IPipeline

    return tokenizers.make_qwen2_words_tokenizer(inspect.getsource(Kandinsky5T2IPipeline.__init__))


@register("prepare", "kandinsky5_t2i_resolutions")
def _kandinsky5_t2i_resolutions(pipe: Any) -> None:
    # Kandinsky5T2IPipeline makes only the sizes in `resolutions`, set in __init__ (pipeline_kandinsky_t2i.py:183), and
    # snaps any other to the one of closest aspect ratio (:628-631): 1024x1024 for a square, 4096 image tokens. The
    # tiny call's 32x32 is added to that list, as diffusers' own test does (pipe.resolutions = [(64, 64)]); the folder
    # does not keep it, so the commands run the real list.
    pipe.resolutions = [(32, 32), *pipe.resolutions]


@register("after", "ernie_image_zero_init")
def _ernie_image_zero_init(model: Any) -> None:
    # ErnieImageTransformer2DModel zero-initialises its shared adaLN modulation and its final projection (diffusers
    # v0.42.1 transformer_ernie_image.py:332-333, :344-345): a random tiny model would predict 0 at every step, so the
    # layouts could not differ and a LoRA on its attention would get no gradient. Trained weights are not zero; a
    # seeded draw stands in for them, as for Kandinsky 5's modulation.
    import torch

    with torch.no_grad():
        for layer in (model.adaLN_modulation[-1], model.final_linear):
            torch.nn.init.normal_(layer.weight, std=0.1)
            torch.nn.init.normal_(layer.bias, std=0.1)


@register("tokenizer", "krea2_qwen")
def _krea2_qwen() -> Any:
    # Krea 2 drops the first 34 tokens of its chat template from the encoder's states and pads the prompt to a fixed
    # length before the template's suffix (diffusers v0.42.1 pipelines/krea2/pipeline_krea2.py:206-211, :228-259):
    # with merges for the template's words (as kandinsky5_qwen) the prefix is 42 tokens (Qwen's: 34), so the cut keeps
    # 8 template tokens before the prompt, not ~130 as single bytes would
    import inspect

    from diffusers import Krea2Pipeline

    return tokenizers.make_qwen2_words_tokenizer(inspect.getsource(Krea2Pipeline.__init__))

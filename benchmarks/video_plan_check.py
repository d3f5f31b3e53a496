#!/usr/bin/env python
"""Predicted (``--plan``, configs on the meta device) against measured (a real run) peak memory per phase.

Builds tiny (the ``video`` rows of ``hf_precision.testing``) and mid-size random-weight video pipelines, saves them, and
for each one runs ``scripts/generate_video.py`` in a fresh process with two prompts; the second clip's per-phase peaks
are the measurement (the first pays one-time library set-up). Prints a Markdown table for docs/video.md.

    python benchmarks/video_plan_check.py --device cpu            # this machine's CPU (RSS)
    python benchmarks/video_plan_check.py --device cuda           # a GPU (max_memory_allocated per phase)

On Linux the runs set ``MALLOC_MMAP_THRESHOLD_=65536`` so that glibc hands freed activation buffers back at once and
the RSS high-water mark follows the tensors (mallopt(3)).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("text encoding", "image encoding", "denoising", "VAE decode")
SVD_CHUNK = 4  # --decode-chunk-size of the SVD runs, and of their prediction


def _mid_wan(seed: int = 0):
    """Wan with a 32-channel VAE and a 128-wide, 4-layer transformer: activations dominate the RSS at 128x128."""
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from hf_precision.testing.tokenizers import make_t5_tokenizer

    torch.manual_seed(seed)
    tok = make_t5_tokenizer()
    te = UMT5EncoderModel(UMT5Config(vocab_size=max(128, len(tok)), d_model=64, d_kv=8, d_ff=64, num_layers=2,
                                     num_heads=4, relative_attention_num_buckets=8))
    vae = AutoencoderKLWan(base_dim=32, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    tr = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32, in_channels=16,
                               out_channels=16, text_dim=64, freq_dim=256, ffn_dim=512, num_layers=4,
                               cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
    return WanPipeline(tokenizer=tok, text_encoder=te, vae=vae, transformer=tr,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))


def _mid_ltx(seed: int = 0):
    """LTX-Video with a 32-channel VAE and a 4-layer transformer."""
    import torch
    from diffusers import (AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXPipeline,
                           LTXVideoTransformer3DModel)
    from transformers import T5Config, T5EncoderModel

    from hf_precision.testing.tokenizers import make_t5_tokenizer

    torch.manual_seed(seed)
    tok = make_t5_tokenizer()
    te = T5EncoderModel(T5Config(vocab_size=max(128, len(tok)), d_model=64, d_kv=8, d_ff=64, num_layers=2,
                                 num_heads=4, relative_attention_num_buckets=8))
    tr = LTXVideoTransformer3DModel(in_channels=8, out_channels=8, patch_size=1, patch_size_t=1,
                                    num_attention_heads=4, attention_head_dim=32, cross_attention_dim=128,
                                    num_layers=4, caption_channels=64)
    vae = AutoencoderKLLTXVideo(
        in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(32, 32, 32, 32),
        decoder_block_out_channels=(32, 32, 32, 32), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1), spatio_temporal_scaling=(True, True, False, False),
        decoder_spatio_temporal_scaling=(True, True, False, False), decoder_inject_noise=(False,) * 5,
        upsample_residual=(False,) * 4, upsample_factor=(1,) * 4, timestep_conditioning=False, patch_size=1,
        patch_size_t=1, encoder_causal=True, decoder_causal=False)
    return LTXPipeline(tokenizer=tok, text_encoder=te, transformer=tr, vae=vae,
                       scheduler=FlowMatchEulerDiscreteScheduler())


def _tiny_svd(seed: int = 0):
    from hf_precision.testing.pipelines import make_svd

    return make_svd(seed=seed)


def _mid_svd(seed: int = 0):
    """SVD with a 4-layer 64-wide CLIP vision encoder (patch 14: 256 tokens) and a 64-channel VAE; the tiny UNet."""
    from hf_precision.testing.pipelines import make_svd

    return make_svd({"image_encoder": {"hidden_size": 64, "projection_dim": 32, "num_hidden_layers": 4,
                                       "num_attention_heads": 4, "patch_size": 14, "intermediate_size": 256},
                     "vae": {"block_out_channels": [64, 64]}}, seed=seed)


def _tiny(name: str):
    def build(seed: int = 0):
        from hf_precision.testing import make_pipeline

        return make_pipeline(name, seed=seed)
    return build


# name, builder, height, width, frames
CASES = [
    ("wan tiny", _tiny("wan"), 16, 16, 5),
    ("ltx tiny", _tiny("ltx"), 32, 32, 9),
    ("cogvideox tiny", _tiny("cogvideox"), 16, 16, 9),
    ("wan mid", _mid_wan, 128, 128, 17),
    ("ltx mid", _mid_ltx, 128, 128, 17),
    ("ltx_i2v tiny", _tiny("ltx_i2v"), 32, 32, 9),
    ("cogvideox_i2v tiny", _tiny("cogvideox_i2v"), 16, 16, 9),
    ("svd tiny", _tiny_svd, 32, 32, 4),
    ("svd mid", _mid_svd, 128, 128, 8),
]


def _params(pipe) -> int:
    return sum(p.numel() for c in pipe.components.values() if hasattr(c, "parameters") for p in c.parameters())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", default=None, help="comma-separated case names (default: all)")
    args = parser.parse_args(argv)
    from hf_precision.apps.video import model_spec
    from hf_precision.apps.video import MemorySettings
    from hf_precision.apps.video.plan import predict
    from hf_precision.testing.pipelines import save_pipeline

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MALLOC_MMAP_THRESHOLD_": "65536",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rows = []
    with tempfile.TemporaryDirectory(prefix="video_plan_check_") as tmp:
        prompts = Path(tmp) / "prompts.txt"
        prompts.write_text("a cat\na dog\n")
        images = Path(tmp) / "images"  # SVD: two images, the second clip is measured as for the prompts
        images.mkdir()
        from hf_precision.testing.parts import example_image

        for i in range(2):
            example_image(256, seed=i).save(images / f"{i}.png")
        for name, build, h, w, f in CASES:
            if args.only and name not in args.only.split(","):
                continue
            pipe = build(0)
            params = _params(pipe)
            folder = save_pipeline(pipe, Path(tmp) / name.replace(" ", "_"))
            del pipe
            where, spec = model_spec(str(folder))
            svd = spec.row.name == "svd"
            settings = MemorySettings(decode_chunk_size=SVD_CHUNK) if svd else None
            pred = predict(where, spec, layout=args.device, height=h, width=w, frames=f, settings=settings).phases
            if svd:
                inputs = ["--image", str(images), "--decode-chunk-size", str(SVD_CHUNK)]
            elif spec.takes_image:  # image + prompt: one clip per image
                inputs = ["--image", str(images), "--prompt", "slow pan"]
            else:
                inputs = ["--prompts", str(prompts)]
            cmd = [sys.executable, str(ROOT / "scripts" / "generate_video.py"), "--model", str(folder), *inputs,
                   "--out", str(Path(tmp) / f"out_{name.replace(' ', '_')}"), "--format", "gif",
                   "--height", str(h), "--width", str(w), "--frames", str(f), "--steps", "2", "--device",
                   args.device, "--quiet"]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("peak memory per phase")]
            if proc.returncode or len(lines) < 2:
                print(f"{name}: run failed\n{proc.stdout}\n{proc.stderr}", file=sys.stderr)
                continue
            measured = {m[0]: float(m[1]) * 2**20 for m in re.findall(r"(text encoding|image encoding|denoising|VAE decode) "
                                                                     r"([\d.]+) MiB", lines[1])}
            for phase in PHASES:
                if phase in pred and phase in measured:
                    p, m = pred[phase], measured[phase]
                    rows.append((name, params, f"{w}x{h}x{f}", phase, p, m, 100 * (p - m) / m))
            print(f"done: {name}", file=sys.stderr, flush=True)
    print("| model | parameters | size (WxHxF) | phase | predicted (MiB) | measured (MiB) | error |")
    print("|---|---:|---|---|---:|---:|---:|")
    for name, params, size, phase, p, m, err in rows:
        print(f"| {name} | {params:,} | {size} | {phase} | {p / 2**20:.1f} | {m / 2**20:.1f} | {err:+.0f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

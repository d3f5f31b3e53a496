"""Wan 2.2 Animate's conditioning of a training clip, made by WanAnimatePipeline's own methods as its ``__call__``
makes them for a first segment (diffusers 0.42.1 pipelines/wan/pipeline_wan_animate.py, mode "animate"):

- the character image at the clip's size (``vae_image_processor.preprocess(..., resize_mode="fill")``, :974) and
  its CLIP embedding (``encode_image``, :980);
- the pose video at the clip's size (``video_processor.preprocess_video``, :994) VAE-encoded
  (``prepare_pose_latents``, :1077): ``pose_latents``;
- the face video at the transformer's ``motion_encoder_size`` (:1005-1007): ``face_pixel_values``;
- the 20 reference channels: ``prepare_reference_image_latents`` (:1028, mask and latents of the image, one latent
  frame) then ``prepare_prev_segment_cond_latents`` of a first segment (:1082-1098, no previous frames: zeros, mask
  0), joined on frames: ``condition_latents``.

The latents the call denoises have one frame more than the clip's (prepare_latents :704) and the first is dropped
before decoding (:1177): the reference's slot. Its target here is the character image's own latents (the VAE
path of the clip's), so the latents this builder hands back are that frame, then the clip's.
"""

from __future__ import annotations

from typing import Any

import torch

from ..rules import TrainingError
from .registry import condition

INPUTS = ("image", "pose_video", "face_video")  # __call__'s names for what a clip's conditioning is made from


@condition("wan_animate_reference")
def _wan_animate_reference(tp: Any, pixels: torch.Tensor, latents: torch.Tensor, generator: Any,
                           **given: Any) -> dict[str, torch.Tensor]:
    missing = [n for n in INPUTS if given.get(n) is None]
    if missing or pixels.dim() != 5 or pixels.shape[0] != 1:
        raise TrainingError(f"WanAnimatePipeline: its denoiser takes, beside each clip, the character image, the pose "
                            f"video and the face video its __call__ takes; give one clip's at a time: "
                            f"tp.encode_condition(pixels, latents, image=PIL, pose_video=[PIL, ...], "
                            f"face_video=[PIL, ...]) (missing: {', '.join(missing) or 'none'}; pixels "
                            f"{tuple(pixels.shape)}, one clip (1, 3, F, H, W) wanted)")
    pipe, device = tp.pipe, tp.device
    _, _, frames, height, width = pixels.shape
    image = pipe.vae_image_processor.preprocess(given["image"], height=height, width=width,
                                                resize_mode="fill").to(device, dtype=torch.float32)
    pose = pipe.video_processor.preprocess_video(given["pose_video"], height=height, width=width)
    size = int(pipe.transformer.config.motion_encoder_size)
    face = pipe.video_processor.preprocess_video(given["face_video"], height=size, width=size)
    reference = pipe.prepare_reference_image_latents(image, 1, generator=generator, device=device)
    previous = pipe.prepare_prev_segment_cond_latents(None, batch_size=1, segment_frame_length=frames, start_frame=0,
                                                      height=height, width=width, generator=generator, device=device)
    return {"latents": torch.cat([tp.encode_images(image.unsqueeze(2), generator), latents.to(device)], dim=2),
            "condition_latents": torch.cat([reference, previous], dim=2),
            "pose_latents": pipe.prepare_pose_latents(pose.to(device, dtype=torch.float32), 1, generator=generator,
                                                      device=device),
            "face_pixel_values": face.to(device, dtype=torch.float32),
            "image_embeds": pipe.encode_image(given["image"], device)}

"""``hf-precision train --demo``: a tiny random SD 1.x pipeline and a generated data folder, offline, so a new user
sees a run train (loss falling on a fixed evaluation batch), checkpoint and save a LoRA in a minute on a laptop."""

from __future__ import annotations

from pathlib import Path

__all__ = ["make_demo", "draw_shape", "write_shapes", "DEMO_SETTINGS"]

# Small enough for 2 CPU cores in well under a minute; the learning rate is high because the run is short.
DEMO_SETTINGS = {"steps": 60, "batch_size": 2, "learning_rate": 5e-3, "lora_rank": 4, "checkpoint_every": 20,
                 "validation_inference_steps": 4, "validation_prompt": "a red square", "resolution": 32}
COLORS = {"red": (220, 30, 30), "green": (30, 200, 60), "blue": (40, 60, 230), "yellow": (240, 220, 40)}
SHAPES = ("square", "circle")


def draw_shape(shape: str, color: tuple[int, int, int], size: int, seed: int) -> "object":
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    background = tuple(int(v) for v in rng.integers(200, 256, 3))
    im = Image.new("RGB", (size, size), background)
    d = ImageDraw.Draw(im)
    m = size // 5 + int(rng.integers(0, 3))
    box = (m, m, size - m, size - m)
    (d.rectangle if shape == "square" else d.ellipse)(box, fill=color)
    return im


def make_demo(workdir: str | Path, size: int = 32) -> tuple[Path, Path]:
    """Save a tiny random ``StableDiffusionPipeline`` and 8 captioned images under ``workdir``: (model, data).

    Example:
        >>> import tempfile
        >>> model, data = make_demo(tempfile.mkdtemp())
        >>> sorted(p.name for p in data.iterdir())[:2], (model / "model_index.json").is_file()
        (['blue-circle.png', 'blue-circle.txt'], True)
    """
    from ...testing.pipelines import make_sd15, save_pipeline

    workdir = Path(workdir)
    model = save_pipeline(make_sd15(), workdir / "tiny-sd15")
    return model, write_shapes(workdir / "shapes", size)


def write_shapes(data: str | Path, size: int = 32) -> Path:
    """Write the 8 captioned shape images (every colour, a square and a circle) into the folder ``data``.

    Example:
        >>> import tempfile
        >>> data = write_shapes(tempfile.mkdtemp())
        >>> len(list(data.glob("*.png"))), (data / "red-square.txt").read_text()
        (8, 'a red square')
    """
    data = Path(data)
    data.mkdir(parents=True, exist_ok=True)
    for i, (name, rgb) in enumerate(COLORS.items()):
        for j, shape in enumerate(SHAPES):
            stem = f"{name}-{shape}"
            draw_shape(shape, rgb, size, seed=i * 2 + j).save(data / f"{stem}.png")
            (data / f"{stem}.txt").write_text(f"a {name} {shape}", encoding="utf-8")
    return data

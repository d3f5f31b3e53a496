"""The input pictures of a pipeline's call as the command line gives them: ``--image``, ``--mask``, ``--strength``,
checked against the class's ``__call__`` through ``model_index.json`` alone and decoded before any weight loads,
with one message for ``generate``, ``calibrate`` and ``check`` alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RecipeError, arg

__all__ = ["ImageInputs", "image_inputs", "open_image", "task_class"]

# The call arguments the command line gives, by the argument name its messages spell (arg("mask") -> --mask)
GIVEN = {"image": "image", "mask_image": "mask"}
AUTO = {"image2image": "AutoPipelineForImage2Image", "inpaint": "AutoPipelineForInpainting"}


def task_class(pipeline: str, task: str) -> str | None:
    """The pipeline class diffusers' ``AutoPipelineForImage2Image`` (``task="image2image"``) or
    ``AutoPipelineForInpainting`` (``"inpaint"``) makes of a folder whose ``model_index.json`` names ``pipeline``.

    Example:
        >>> task_class("StableDiffusionXLPipeline", "image2image"), task_class("FluxPipeline", "inpaint")
        ('StableDiffusionXLImg2ImgPipeline', 'FluxInpaintPipeline')
        >>> task_class("DiTPipeline", "image2image") is None
        True
    """
    import diffusers

    from ..runtime.arguments import concrete_class

    try:  # the family is found from any of its task classes, as the AutoPipeline's from_pretrained finds it
        return concrete_class(getattr(diffusers, AUTO[task]), "", {"_class_name": pipeline}, {}).__name__
    except RecipeError:  # the family has no pipeline for the task
        return None


def open_image(path: str | Path, name: str = "image", mode: str = "RGB") -> Any:
    """The picture in the file ``path``, decoded by PIL and converted to ``mode``; one error naming the file and the
    argument ``name`` (``--image``/``--mask`` on the command line) when it is missing or not a picture.

    Example:
        >>> import tempfile
        >>> from PIL import Image
        >>> path = Path(tempfile.mkdtemp()) / "in.png"
        >>> Image.new("RGB", (40, 24)).save(path)
        >>> open_image(path).size, open_image(path, "mask", "L").mode
        ((40, 24), 'L')
        >>> open_image(path.with_name("none.png"))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        hf_precision.errors.RecipeError: image='...none.png': no such file; give the path of a .png, .jpg or .webp ...
    """
    from PIL import Image, UnidentifiedImageError

    file = Path(path).expanduser()
    where = arg(name, str(path))
    if file.is_dir():
        raise RecipeError(f"{where}: is a folder; give the path of a .png, .jpg or .webp picture")
    if not file.is_file():
        raise RecipeError(f"{where}: no such file; give the path of a .png, .jpg or .webp picture")
    try:
        with Image.open(file) as picture:
            return picture.convert(mode)
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise RecipeError(f"{where}: PIL cannot read it as a picture ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else 'unreadable'}); give a .png, .jpg or .webp "
                          f"picture") from None


@dataclass
class ImageInputs:
    """What :func:`image_inputs` found: the pipeline class named by ``model_index.json`` (``""`` when it cannot be
    read), the decoded pictures and strength to pass, and the inputs the call still needs that no flag gives."""

    pipeline: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)
    others: list[str] = field(default_factory=list)


def _misplaced(model: Any, pipeline: str, what: str, value: Any) -> str:
    """The refusal of an input ``pipeline`` does not take, naming the class of the same folder that takes it."""
    task = "inpaint" if what == "mask" else "image2image"
    other = task_class(pipeline, task)
    kind = "no mask" if what == "mask" else "no input image (its call has no image argument)"
    if other is None or other == pipeline:
        return f"{arg(what, value)}: {pipeline} takes {kind}; drop {arg(what)}"
    return (f"{arg(what, value)}: {pipeline} takes {kind}; the {'inpainting' if what == 'mask' else 'image-to-image'} "
            f"pipeline of this folder is {other}: in Python, pipe = diffusers.{AUTO[task]}.from_pipe("
            f"hp.load_pipeline({str(model)!r}, device)), or drop {arg(what)}")


def image_inputs(model: Any, *, image: Any = None, mask: Any = None, strength: float | None = None,
                 steps: int | None = None, required: bool = True) -> ImageInputs:
    """Check ``image``/``mask``/``strength`` against the call of ``model``'s pipeline and decode the files: one
    :class:`RecipeError` for a needed input missing (unless ``required=False``: check makes one up), one the call does
    not take (naming that folder's class that does), an unreadable file, ``strength`` outside (0, 1], or no step left
    (:func:`~hf_precision.diagnose.call.steps_problem`). ``others``: what the call needs beyond these (ControlNet's
    ``control_image``), after a missing image or mask so one refusal names all a run needs.

    Example:
        >>> import json, tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionXLPipeline"}))
        >>> image_inputs(folder).pipeline
        'StableDiffusionXLPipeline'
        >>> image_inputs(folder, image="cat.png")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        hf_precision.errors.RecipeError: image='cat.png': ... of this folder is StableDiffusionXLImg2ImgPipeline: ...
    """
    import diffusers

    from .call import call_params, needed_inputs, steps_problem

    pipeline, needed = needed_inputs(model)
    cls = getattr(diffusers, pipeline, None) if pipeline else None
    params = call_params(cls)
    found = ImageInputs(pipeline, others=[n for n in needed if n not in GIVEN])
    given = {"image": image, "mask_image": mask}
    if cls is not None:
        missing = [n for n in GIVEN if n in needed and given[n] is None and required]
        if missing and found.others:  # "give --image" would only meet the caller's refusal of the rest: it names all
            found.others = [*missing, *found.others]
        elif missing:
            what = " and ".join("an input image" if n == "image" else "a mask (white where it repaints)"
                                for n in missing)
            flags = " ".join(f"{arg(GIVEN[n], 'FILE')}" for n in missing)
            raise RecipeError(f"{model}: {pipeline} needs {what}: give {flags}")
        for name, value in given.items():
            if value is not None and name not in params:
                raise RecipeError(_misplaced(model, pipeline, GIVEN[name], value))
    if strength is not None:
        if not (isinstance(strength, (int, float)) and math.isfinite(strength) and 0 < strength <= 1):
            raise RecipeError(f"{arg('strength', strength)}: must be in (0, 1]: how far from the input image it "
                              f"starts (1: from noise, all repainted; 0.3: most of the image kept)")
        if cls is not None and "strength" not in params:
            why = ("it reads its image as a reference beside what it generates, not as where denoising starts"
                   if "image" in params else "it starts from noise: text-to-image")
            raise RecipeError(f"{arg('strength', strength)}: {pipeline} takes no strength ({why}); drop "
                              f"{arg('strength')}")
    if cls is not None and steps is not None:
        problem = steps_problem(cls, steps, strength)
        if problem:
            raise RecipeError(problem)
    for name, value in given.items():
        if value is not None:
            found.kwargs[name] = (open_image(value, GIVEN[name], "L" if name == "mask_image" else "RGB")
                                  if isinstance(value, (str, Path)) else value)
    if strength is not None:
        found.kwargs["strength"] = float(strength)
    return found


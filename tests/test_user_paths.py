"""What a user runs, as they run it: AutoPipelines, help texts, early and plain errors, and the small things of
issue 34 (each test here failed before its fix)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


# --- pipeline_class= an AutoPipeline -------------------------------------------------------------------------------

def _auto_classes():
    import diffusers

    return [diffusers.AutoPipelineForText2Image, diffusers.AutoPipelineForImage2Image, diffusers.AutoPipelineForInpainting]


def test_every_auto_pipeline_of_a_shipped_family_resolves_to_its_recipe():
    """Every class a shipped recipe lists, under each AutoPipeline diffusers maps it to: the class it builds is found
    before loading, and the recipe chosen for it resolves (before, the AutoPipeline's name reached the recipe check)."""
    from diffusers.pipelines import auto_pipeline

    from hf_precision.recipe.catalog import recipe_classes
    from hf_precision.recipe.resolution import resolve
    from hf_precision.runtime.arguments import concrete_class
    from hf_precision.runtime.source import models_of_class

    tried = set()
    for saved in sorted(recipe_classes()):
        if auto_pipeline._get_model(saved) is None:
            continue
        for auto in _auto_classes():
            try:
                built = concrete_class(auto, "./folder", {"_class_name": saved}, {})
            except Exception as err:  # no pipeline for this task in the family: our one-line refusal
                assert "diffusers has no" in str(err) and saved in str(err), err
                continue
            assert not built.__name__.startswith("AutoPipeline")
            if built.__name__ in tried:
                continue
            tried.add(built.__name__)
            recipe = resolve(pipeline_class=built.__name__, devices="cpu", models=models_of_class(built.__name__))
            assert recipe.plans, built
    assert {"StableDiffusionXLImg2ImgPipeline", "StableDiffusionInpaintPipeline", "FluxImg2ImgPipeline"} <= tried


@pytest.mark.parametrize("kind, auto, recipe, built", [
    ("sdxl", "AutoPipelineForImage2Image", None, "StableDiffusionXLImg2ImgPipeline"),
    ("sdxl", "AutoPipelineForInpainting", "sdxl", "StableDiffusionXLInpaintPipeline"),
    ("sd15", "AutoPipelineForText2Image", "sd15", "StableDiffusionPipeline"),
])
def test_load_pipeline_builds_the_class_an_auto_pipeline_maps_to(saved_pipeline, kind, auto, recipe, built):
    import diffusers

    import hf_precision as hp

    pipe = hp.load_pipeline(saved_pipeline(kind), "cpu", layout="t4", recipe=recipe,
                            pipeline_class=getattr(diffusers, auto))
    assert type(pipe).__name__ == built
    assert hp.applied(pipe).recipe.name == (recipe or hp.applied(pipe).recipe.name)
    assert not hp.applied(pipe).recipe.name.startswith("composed:")


def test_an_auto_pipeline_without_a_pipeline_for_its_task_is_refused_before_loading(saved_pipeline):
    import diffusers

    import hf_precision as hp

    with pytest.raises(hp.RecipeError, match=r"pipeline_class=AutoPipelineForInpainting: diffusers has no inpaint "
                                             r"pipeline for StableVideoDiffusionPipeline"):
        hp.load_pipeline(saved_pipeline("svd"), "cpu", pipeline_class=diffusers.AutoPipelineForInpainting)


# --- help says every default ---------------------------------------------------------------------------------------

def _parsers():
    """Every parser a user reads: each ``hf-precision`` command, and the scripts that share their options."""
    import argparse

    from hf_precision.cli import build_parser
    from hf_precision.cli import train, video

    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return [("hf-precision", top), *sub.choices.items(), ("scripts/train.py", train.build_parser("train.py")),
            ("scripts/generate_video.py", video.build_parser("generate_video.py"))]


def test_every_option_with_a_default_says_it_in_its_help():
    import argparse

    missing = []
    for name, parser in _parsers():
        for action in parser._actions:
            if not action.option_strings or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                continue
            text = " ".join(parser._get_formatter()._format_action(action).split())
            if not action.help:
                missing.append(f"{name} {action.option_strings[0]}: no help")
            default = action.default
            if default is None or isinstance(default, bool) or default == [] or default is argparse.SUPPRESS:
                continue
            if "default" not in text or str(default) not in text:
                missing.append(f"{name} {action.option_strings[0]}: default {default!r} not said: {text}")
    assert not missing, "\n".join(missing)


def test_train_and_generate_help_show_the_defaults_of_the_issue(capsys):
    from hf_precision.cli import main

    for command, expected in (("train", ("(default: 1000)", "(default: 0.0001)", "(default: 3)")),
                              ("generate", ("(default: 30)", "(default: the pipeline's"))):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for part in expected:
            assert part in text, (command, part)

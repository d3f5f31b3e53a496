"""Shared fixtures: tiny random-weight pipelines (built once per session) and saved pipeline folders."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

# Everything is built from configs: never touch the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_pipes() -> dict:
    """Session cache of tiny pipelines keyed by kind ("sdxl", "svd", "pixart", "dit", "sd15").

    Filled on demand by ``tiny_pipe``; treat the cached pipelines as read-only.
    """
    return {}


@pytest.fixture
def tiny_pipe(tiny_pipes):
    """Factory: ``tiny_pipe(kind)`` returns a fresh deep copy of the session's tiny pipeline of ``kind``."""
    from hf_precision.synthetic import make_pipeline

    def get(kind: str):
        if kind not in tiny_pipes:
            tiny_pipes[kind] = make_pipeline(kind, size="tiny", seed=0)
        return copy.deepcopy(tiny_pipes[kind])

    return get


@pytest.fixture(scope="session")
def saved_pipeline(tmp_path_factory, tiny_pipes):
    """Factory: ``saved_pipeline(kind, fp16_variant=False)`` returns a folder saved once per session.

    With ``fp16_variant=True`` the folder holds both ``*.safetensors`` and ``*.fp16.safetensors`` (and, as
    on the Hub, transformers ``config.json`` files that say ``"dtype": "float16"``).
    """
    from hf_precision.synthetic import make_pipeline, save_pipeline

    folders: dict[tuple[str, bool], Path] = {}

    def get(kind: str, fp16_variant: bool = False) -> Path:
        key = (kind, bool(fp16_variant))
        if key not in folders:
            if kind not in tiny_pipes:
                tiny_pipes[kind] = make_pipeline(kind, size="tiny", seed=0)
            folder = tmp_path_factory.mktemp(f"{kind}-fp16" if fp16_variant else kind)
            folders[key] = save_pipeline(tiny_pipes[kind], folder, fp16_variant=fp16_variant)
        return folders[key]

    return get


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need CUDA: they are skipped (reported as skipped, never as passed) without it."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: run `pytest -m gpu` on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

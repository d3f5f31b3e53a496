"""No silent seams (issue 32): a job the code does in one place is not done again, its own way, elsewhere.

What a pipeline is called with (its ``__call__`` or ``encode_prompt`` parameters) is read by one helper,
``hf_precision.diagnose.steps.call_params``, in every layer that may import it (diagnose and above; the runtime sits
below it). Copies had drifted apart: some read an unreadable signature as empty, others raised.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hf_precision

PACKAGE = Path(hf_precision.__file__).resolve().parent
ABOVE_RUNTIME = ("diagnose", "training", "memory", "apps", "cli")
READ = {"__call__", "encode_prompt"}


def _copies(path: Path) -> list[str]:
    """``file:line`` of each ``inspect.signature(<x>.__call__ / .encode_prompt)`` in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "signature" \
                and node.args and isinstance(node.args[0], ast.Attribute) and node.args[0].attr in READ:
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_a_pipeline_s_call_parameters_are_read_through_call_params_alone():
    files = [p for layer in ABOVE_RUNTIME for p in sorted((PACKAGE / layer).rglob("*.py"))]
    assert len(files) > 50, "the scan found too few modules"
    copies = [c for p in files for c in _copies(p)]
    assert not copies, f"read these through hf_precision.diagnose.steps.call_params(cls, method): {copies}"


def test_call_params_reads_a_class_an_instance_a_name_and_a_method():
    import diffusers

    from hf_precision.diagnose.steps import call_params

    cls = diffusers.QwenImageEditPipeline
    assert "image" in call_params(cls, "encode_prompt") and "image" in call_params("QwenImageEditPipeline")
    assert "self" in call_params(cls) and "self" not in call_params(object.__new__(cls))  # bound: no self
    assert call_params(None) == {} and call_params(cls, "no_such_method") == {}

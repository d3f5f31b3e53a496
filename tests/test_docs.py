"""Citations a reader can open: no private-document references, no dead docs/facts.md anchors, a source in every why.

Every comment, docstring, recipe ``why:`` and doc cites what a reader of the repository can open: an upstream
issue or PR (URL or ``owner/repo#N``), a file:line at a named version, a model card, a ComfyUI file, or a
section of ``docs/facts.md`` (``docs/facts.md#anchor``, GitHub's heading anchors). Short forms such as
"facts 1.3", "facts S15" or "§2.1" point into a notes file that is not in the repository; this file spells them
out only to forbid them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
FACTS = ROOT / "docs" / "facts.md"
SUFFIXES = {".py", ".yaml", ".yml", ".md"}
SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "__pycache__", ".pytest_cache", "node_modules", "model_configs"}
# Files that spell the forbidden forms out to explain the rule.
RULE_FILES = {Path("tests/test_docs.py")}

PRIVATE = re.compile(
    r"diffusers-dtype-facts|shared/reference"
    r"|\bfacts?\s*(?:§|section\s*\d|table\b|[SVPDL]\d|\d)"
    r"|§\s*\d",
    re.IGNORECASE,
)
FACTS_LINK = re.compile(r"docs/facts\.md#([\w-]+)")
SOURCE = re.compile(
    r"https?://\S+"
    r"|\b[\w.-]+/[\w.-]+#\d+"                                  # owner/repo#N
    r"|\b[\w./-]+\.(?:py|pyi|yaml|md|h|cpp|cu|mm):\d+"          # file:line
    r"|\b[\w.-]+/[\w./-]+\.py\b"                               # a file in a named repository
    r"|\bmodel card [\w.-]+/[\w.-]+"                           # a Hugging Face model card id
    r"|docs/facts\.md#[\w-]+"
)


def repo_files() -> list[Path]:
    """Every .py/.yaml/.md file of the repository, outside virtual environments, caches and vendored configs."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info") and not d.startswith(".venv"))
        found += [Path(folder, name) for name in sorted(files) if Path(name).suffix in SUFFIXES]
    return found


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def facts_anchors(text: str) -> set[str]:
    anchors: set[str] = set()
    for line in text.splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if match:
            base = anchor = github_anchor(match.group(1))
            n = 0
            while anchor in anchors:  # GitHub numbers repeated headings
                n += 1
                anchor = f"{base}-{n}"
            anchors.add(anchor)
    return anchors


def private_citations(text: str) -> list[str]:
    return [f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}" for m in PRIVATE.finditer(text)]


def whys(node, where: str = ""):
    """(path, text) of every ``why`` string in a loaded YAML document, however deep."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "why" and isinstance(value, str):
                yield where or "<top>", value
            else:
                yield from whys(value, f"{where}.{key}" if where else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from whys(value, f"{where}[{i}]")


def test_the_rules_can_fail():
    assert private_citations("fails in vae.post_quant_conv (facts S13); and (Facts 1.3) and §2.1")
    assert private_citations("see diffusers-dtype-facts.md section 3")
    assert not private_citations("see docs/facts.md#f11-layout-table, row S13; test_rules_of_their_facts(spec)")
    assert github_anchor("F2. SDXL VAE decode casts only an fp16 force_upcast VAE") == (
        "f2-sdxl-vae-decode-casts-only-an-fp16-force_upcast-vae")
    assert facts_anchors("# A\n## B b\n## B b\n") == {"a", "b-b", "b-b-1"}
    for sourced in ("huggingface/diffusers#8604", "diffusers v0.42.1 pipeline_dit.py:138",
                    "model card madebyollin/sdxl-vae-fp16-fix", "docs/facts.md#f9-cpu-speed", "https://x.org/a",
                    "Comfy-Org/ComfyUI comfy/model_management.py should_use_fp16"):
        assert SOURCE.search(sourced), sourced
    for unsourced in ("the reference weights ship an fp16 variant", "(facts S13)", "A1111 says so"):
        assert not SOURCE.search(unsourced), unsourced
    assert list(whys({"a": {"why": "x", "select": [{"why": "y"}]}})) == [("a", "x"), ("a.select[0]", "y")]


def test_no_file_cites_the_private_notes():
    files = repo_files()
    assert any(f.suffix == ".yaml" for f in files) and any(f.name == "hooks.py" for f in files), "scan found nothing"
    bad = []
    for path in files:
        if path.relative_to(ROOT) in RULE_FILES:
            continue
        hits = private_citations(path.read_text(encoding="utf-8", errors="replace"))
        bad += [f"{path.relative_to(ROOT)} {hit}" for hit in hits]
    assert not bad, ("cite an upstream issue/PR, a file:line at a version, a model card, or docs/facts.md#anchor "
                     "instead of:\n  " + "\n  ".join(bad))


def test_every_facts_anchor_cited_exists():
    anchors = facts_anchors(FACTS.read_text(encoding="utf-8"))
    assert len(anchors) >= 10
    cited, bad = 0, []
    for path in repo_files():
        if path.relative_to(ROOT) in RULE_FILES:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        links = FACTS_LINK.findall(text)
        if path == FACTS:
            links += re.findall(r"\]\(#([\w-]+)\)", text)
        cited += len(links)
        bad += [f"{path.relative_to(ROOT)}: #{link}" for link in links if link not in anchors]
    assert cited >= 10, "no docs/facts.md links found: the scan is broken"
    assert not bad, "docs/facts.md has no heading for:\n  " + "\n  ".join(bad) + "\nheadings: " + ", ".join(sorted(anchors))


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").rglob("*.yaml")), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_recipe_why_names_a_source(path):
    found = list(whys(yaml.safe_load(path.read_text(encoding="utf-8"))))
    bad = [f"{where}: {text}" for where, text in found if not SOURCE.search(text)]
    assert not bad, (f"{path.relative_to(ROOT)}: these why fields name no source a reader can open (URL, owner/repo#N, "
                     "file:line, 'model card owner/name', docs/facts.md#anchor):\n  " + "\n  ".join(bad))


def test_the_layout_table_lists_every_layout():
    try:
        from layouts import LAYOUTS
    except ImportError:  # tests/ imported as a package
        from tests.layouts import LAYOUTS
    text = FACTS.read_text(encoding="utf-8")
    section = text.split("## F11. Layout table", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\|\s*([SVPD]\d+b?)\s*\|", section, re.MULTILINE)
    assert rows == [layout.id for layout in LAYOUTS]


@pytest.mark.slow
@pytest.mark.heavy
def test_the_train_plan_the_docs_show_is_what_the_command_prints(capsys):
    """docs/train-program.md quotes `hf-precision train --plan ...` (issue 34: it quoted 11.47 GiB and an encode peak
    of 4.33 GiB the command no longer printed): run the command it names, compare every line and every figure the
    text after the block quotes, and check the output agrees with itself."""
    import shlex

    from hf_precision.cli import main
    from training_checks import SIZE, assert_plan_output_agrees

    section = (ROOT / "docs" / "train-program.md").read_text().split("## Memory plan", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```\n\$ (hf-precision train --plan[^\n]*)\n(.*?)```", section, re.S)
    assert block, "the memory plan section shows no `$ hf-precision train --plan` block"
    assert f"What `{block[1]}` prints" in section  # the text names the command it quotes
    assert main(shlex.split(block[1])[1:]) == 0
    out = capsys.readouterr().out
    assert block[2].strip().splitlines() == out.strip().splitlines()
    assert_plan_output_agrees(out)
    prose = section[block.end():section.index("Checked against")]
    quoted = re.findall(SIZE, prose)
    assert quoted and all(figure in out for figure in quoted), quoted

"""Recipe and override YAML is user input: anchors, aliases, duplicate keys and oversized files are refused with one
short error, with libyaml's loader and with PyYAML's pure-Python one alike (issue 16)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import yaml

import hf_precision as hp
from hf_precision.recipe import files

from launch import subprocess_env
from hf_precision.errors import excerpt
from hf_precision.recipe.files import parse_yaml, read_yaml, recipes_dir

LOADERS = [pytest.param(False, id="libyaml"), pytest.param(True, id="pure-python")]
HAS_LIBYAML = hasattr(yaml, "CSafeLoader")


def bomb(levels: int = 9) -> str:
    """The alias bomb of issue 16: each level is a list of nine aliases of the level below (9**levels strings)."""
    names = "abcdefghijklmnopqrstuvwxyz"[:levels]
    lines = ["schema: 1", 'a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in zip(names, names[1:])]
    lines += ["components:", f"  unet: {{dtype: *{names[-1]}}}"]
    return "\n".join(lines) + "\n"


def refused(text: str, pure: bool, source: str = "bad.yaml") -> str:
    with pytest.raises(hp.RecipeError) as info:
        parse_yaml(text, source, pure=pure)
    msg = str(info.value)
    assert msg.startswith(f"{source}:") and "\n" not in msg and len(msg) < 400, msg
    return msg


# ------------------------------------------------------------------------------------------- anchors and aliases


def test_plain_yaml_expands_the_bomb():
    # Why the limits exist: PyYAML's safe loader builds the full expansion (9**levels strings); at 9 levels that is
    # 387 million list slots, the 9 GB of issue 16. Four levels show it without the cost.
    data = yaml.safe_load(bomb(4))
    leaves = data["components"]["unet"]["dtype"]
    flat = [x for b in leaves for c in b for d in c for x in d]
    assert len(flat) == 9 ** 4


@pytest.mark.parametrize("pure", LOADERS)
def test_alias_bomb_is_refused_at_its_first_anchor(pure):
    text = bomb(9)
    assert len(text.encode()) < 500
    msg = refused(text, pure)
    assert "line 2:" in msg and "anchors and aliases are not allowed" in msg and "'&a'" in msg
    assert "write the values out" in msg


def test_alias_bomb_cli_one_line_exit_2_fast_and_small(tmp_path):
    """`hf-precision show sdxl --device t4 --overrides bomb.yaml`: one line, exit 2, refused at the first anchor, < 50 MB.

    Run in a child process so peak RSS is the command's own; the child caps its address space (Linux) so that a
    regression fails with MemoryError instead of taking the machine down.
    """
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb(9), encoding="utf-8")
    child = textwrap.dedent(f"""
        import contextlib, io, json, sys
        try:
            import resource
        except ImportError:
            resource = None
        from hf_precision.cli import main
        main(["show", "sdxl", "--device", "t4", "--brief"])  # warm: imports and the shipped recipes
        def rss_mb():
            if resource is None:
                return 0.0
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return peak / (2**20 if sys.platform == "darwin" else 2**10)
        if resource is not None and sys.platform.startswith("linux"):
            vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:")) * 1024
            resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.getrlimit(resource.RLIMIT_AS)[1]))
        import yaml
        events = [0]
        parse = yaml.parse
        def counting_parse(*args, **kwargs):  # the YAML events read before the refusal: the work done
            for event in parse(*args, **kwargs):
                events[0] += 1
                yield event
        yaml.parse = counting_parse
        before = rss_mb()
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(["show", "sdxl", "--device", "t4", "--overrides", {str(path)!r}])
        print(json.dumps({{"rc": rc, "stderr": err.getvalue(), "events": events[0], "grew_mb": rss_mb() - before}}))
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                         env=subprocess_env())
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["rc"] == 2
    lines = result["stderr"].splitlines()
    assert len(lines) == 1 and "bomb.yaml: line 2:" in lines[0] and "anchors and aliases" in lines[0], lines
    # Refused at the first anchor: a few events read, never the 9**9 strings it expands to (bound work, not time).
    assert 0 < result["events"] < 20, result
    assert result["grew_mb"] < 50, result


@pytest.mark.parametrize("pure", LOADERS)
def test_an_unused_anchor_and_a_merge_key_are_refused(pure):
    assert "'&keep'" in refused("components:\n  unet: {keep_fp32: &keep [a]}\n", pure)
    msg = refused("components:\n  vae: {dtype: float32}\n  unet:\n    <<: {dtype: float16}\n", pure)
    assert "line 4:" in msg and "merge keys" in msg and "components.unet" in msg


# ---------------------------------------------------------------------------------------------- duplicate keys


DUPLICATE_VAE = "schema: 1\ncomponents:\n  vae: {dtype: float32}\n  unet: {dtype: float16}\n  vae: {dtype: float16}\n"


def test_plain_yaml_lets_the_second_vae_win():
    # The silent change of issue 16: the fp16 VAE (black images on SDXL) replaces the fp32 one.
    assert yaml.safe_load(DUPLICATE_VAE)["components"]["vae"] == {"dtype": "float16"}


@pytest.mark.parametrize("pure", LOADERS)
def test_duplicate_key_names_path_and_both_lines(pure):
    msg = refused(DUPLICATE_VAE, pure)
    assert "line 5:" in msg and "duplicate key components.vae (lines 3 and 5)" in msg and "merge the two" in msg


@pytest.mark.parametrize("pure", LOADERS)
@pytest.mark.parametrize("text, path", [
    ("a:\n  b:\n    - {c: 1, c: 2}\n", "a.b[0].c"),   # inside a list, flow style
    ("a:\n  true: 1\n  yes: 2\n", "a.yes"),           # two spellings of one key once built (True)
    ("1: a\n0x1: b\n", "0x1"),                        # and of one integer
    ("schema: 1\nschema: 1\n", "schema"),             # the same value twice is still a mistake
])
def test_duplicate_keys_at_any_depth(pure, text, path):
    assert f"duplicate key {path} " in refused(text, pure)


def test_duplicate_vae_in_an_override_file_is_refused(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(DUPLICATE_VAE, encoding="utf-8")
    with pytest.raises(hp.RecipeError, match=r"dup\.yaml: line 5: duplicate key components\.vae \(lines 3 and 5\)"):
        hp.get_recipe("sdxl", device="t4", overrides=path)


def test_duplicate_vae_cli_one_line_exit_2(tmp_path, capsys):
    from hf_precision.cli import main

    path = tmp_path / "dup.yaml"
    path.write_text(DUPLICATE_VAE, encoding="utf-8")
    assert main(["show", "sdxl", "--device", "t4", "--overrides", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "duplicate key components.vae" in err


# ---------------------------------------------------------------------------------------------------- limits


@pytest.mark.parametrize("pure", LOADERS)
def test_long_lists_are_refused_at_the_stated_limit(pure):
    at_limit = "keep: [" + ", ".join(["m"] * files.MAX_ITEMS) + "]\n"
    assert len(parse_yaml(at_limit, "ok.yaml", pure=pure)["keep"]) == files.MAX_ITEMS
    flow = "keep: [" + ", ".join(["m"] * (files.MAX_ITEMS + 1)) + "]\n"
    assert f"keep[{files.MAX_ITEMS}]: a list longer than {files.MAX_ITEMS:,} entries" in refused(flow, pure)
    block = "a: 1\nkeep:\n" + "- m\n" * (files.MAX_ITEMS + 1)
    assert "line 3:" in refused(block, pure)


@pytest.mark.parametrize("pure", LOADERS)
def test_total_values_are_capped(pure, monkeypatch):
    monkeypatch.setattr(files, "MAX_NODES", 500)
    text = "".join(f"k{i}: [" + ", ".join(["m"] * 90) + "]\n" for i in range(10))
    assert "more than 500 values in one file" in refused(text, pure)


@pytest.mark.parametrize("pure", LOADERS)
@pytest.mark.parametrize("text", [
    "[" * 200_000 + "]" * 200_000,     # crashes libyaml's composer (segfault) without the pre-scan
    "- " * 100_000 + "x\n",
    "a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 40)),
], ids=["flow", "compact-block", "indented"])
def test_deep_nesting_is_refused(pure, text):
    assert f"nested deeper than {files.MAX_DEPTH} levels" in refused(text, pure)


@pytest.mark.parametrize("pure", LOADERS)
def test_keys_must_be_short_names(pure):
    assert "a key of 500 characters" in refused("k" * 500 + ": 1\n", pure)
    assert "a list or mapping used as a key" in refused("? [a]\n: 1\n", pure)


def test_oversized_file_is_refused_before_parsing(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("schema: 1\n# " + "x" * files.MAX_YAML_BYTES + "\n", encoding="utf-8")
    with pytest.raises(hp.RecipeError, match=rf"big\.yaml: larger than the {files.MAX_YAML_BYTES:,} bytes"):
        read_yaml(path)
    with pytest.raises(hp.RecipeError, match="more than the"):
        parse_yaml(path.read_text(encoding="utf-8"), "--set")


# ------------------------------------------------------------------------------------------- normal files load


@pytest.mark.parametrize("pure", LOADERS)
def test_shipped_recipes_read_as_plain_yaml_does(pure):
    for path in sorted(recipes_dir().rglob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        assert parse_yaml(text, str(path), pure=pure) == yaml.safe_load(text), path


@pytest.mark.parametrize("pure", LOADERS)
def test_large_but_legal_file_loads(pure):
    # Above the direct-compose threshold: goes through the event pre-scan and still loads.
    text = "schema: 1\ncomponents:\n" + "".join(f"  c{i}: {{dtype: float16, keep_fp32: [a, 'b.*']}}\n" for i in range(200))
    assert sum(map(text.count, "[{-:?,")) > files._DIRECT
    assert parse_yaml(text, "big.yaml", pure=pure) == yaml.safe_load(text)


def test_a_normal_override_still_loads(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("schema: 1\ncomponents:\n  unet: {dtype: float32, keep_fp32: ['down_blocks.*']}\n", encoding="utf-8")
    recipe = hp.get_recipe("sdxl", device="t4", overrides=path)
    assert recipe["unet"].compute == "float32"
    assert hp.get_recipe("sdxl", device="t4")["unet"].compute != "float32"  # the override is what changed it


@pytest.mark.skipif(not HAS_LIBYAML, reason="this PyYAML has no libyaml: only the pure-Python loader exists")
def test_libyaml_is_used_when_present(monkeypatch):
    seen = []
    real = yaml.CSafeLoader

    class Spy(real):  # type: ignore[misc, valid-type]
        def __init__(self, stream):
            seen.append(stream)
            super().__init__(stream)

    monkeypatch.setattr(yaml, "CSafeLoader", Spy)
    assert parse_yaml("a: 1\n", "x.yaml") == {"a": 1}
    assert seen == ["a: 1\n"]


# ------------------------------------------------------------------------------------------- short excerpts


def test_excerpt_is_short_for_any_value():
    assert excerpt("float16") == "'float16'"
    assert excerpt(3) == "3"
    for value in ["x" * 10**6, ["x"] * 10**6, {f"k{i}": list(range(100)) for i in range(1000)}, b"\xff" * 10**6,
                  [[[[[[["deep"]]]]]]]]:
        text = excerpt(value)
        assert len(text) <= 80, text
    assert excerpt("y" * 1000).endswith("...(1,000 characters)")
    assert len(excerpt("z" * 1000, limit=30)) <= 30


def test_a_huge_bad_value_is_quoted_short(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text("schema: 1\ncomponents:\n  unet: {dtype: " + "f" * 500_000 + "}\n", encoding="utf-8")
    with pytest.raises(hp.RecipeError) as info:
        hp.get_recipe("sdxl", device="t4", overrides=path)
    assert "components.unet.dtype: unknown dtype 'fff" in str(info.value) and "(500,000 characters)" in str(info.value)
    assert len(str(info.value)) < 600
    with pytest.raises(hp.RecipeError) as info:
        hp.get_recipe("sdxl", device="t4", overrides={"unet": {"dtype": ["float16"] * 100_000}})
    assert len(str(info.value)) < 600 and "components.unet.dtype" in str(info.value)
    with pytest.raises(hp.RecipeError) as info:
        hp.get_recipe("sdxl", device="cuda:sm=" + "9" * 100_000)
    assert len(str(info.value)) < 1000


@pytest.mark.parametrize("pure", LOADERS)
def test_deep_flow_nesting_is_reported_in_our_words_whichever_layer_stops_it(pure, monkeypatch):
    # PyYAML >= 6.0.3's libyaml stops a long run of '[' at its own depth limit (1,000) with its own wording, before
    # the event pre-scan sees level 33; PyYAML <= 6.0.2 lets the pre-scan see it. With the text scan switched
    # off, whichever of the two stops it, the user still reads the project's limit, not the parser's.
    monkeypatch.setattr(files, "_flow_depth_scan", lambda text: None)
    assert f"nested deeper than {files.MAX_DEPTH} levels" in refused("[" * 5_000 + "]" * 5_000, pure)


@pytest.mark.parametrize("pure", LOADERS)
def test_brackets_in_quotes_and_comments_do_not_count_as_nesting(pure):
    deep = "[" * (files.MAX_DEPTH + 5)
    text = (f"a: \"{deep}\"\nb: '{deep}'\n# {deep}\nc: \"x\\\" {deep}\"\n"
            + "".join(f"k{i}: [1, 2]\n" for i in range(files._DIRECT)))
    data = parse_yaml(text, "ok.yaml", pure=pure)
    assert data["a"] == deep and data["b"] == deep and data["c"] == f"x\" {deep}"
    # One bracket more than allowed, right after those, is still caught by the text scan.
    assert f"nested deeper than {files.MAX_DEPTH} levels" in refused(text + "z: " + deep + "]" * len(deep) + "\n", pure)

"""Finding and safely reading the files hf_precision takes from users: recipes, device rules, overrides, JSON configs.

Recipe and override files may come from anyone, so YAML is read as plain data with limits: no anchors or aliases
(a 421-byte file of nested aliases expands to gigabytes), no duplicate keys (the second ``vae:`` would silently win),
and stated caps on size, list length and nesting (a few hundred thousand nested ``[`` crash libyaml's composer).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import DamagedFileError, RecipeError, excerpt

__all__ = ["shared_mode", "recipes_dir", "read_yaml", "parse_yaml", "read_json", "damaged_file", "download_command",
           "MAX_YAML_BYTES", "MAX_ITEMS", "MAX_DEPTH", "MAX_NODES", "MAX_KEY_CHARS"]

# 200x the largest shipped recipe; the worst legal 1 MiB file parses in under a second with libyaml.
MAX_YAML_BYTES = 1 << 20
# Per list or mapping. The longest real list is a keep_fp32 list of module names; SDXL's UNet has 1,930 modules.
MAX_ITEMS = 10_000
# Shipped recipes nest at most 6 levels; libyaml's C composer recurses per level and crashes near 100,000.
MAX_DEPTH = 32
# All values of one file together: bounds the memory of the parsed nodes (~0.5 KB each) whatever the file holds.
MAX_NODES = 100_000
# Keys are component, policy and module names; a longer key is not a name and would flood every error message.
MAX_KEY_CHARS = 200
# model_index.json and config.json files are a few KB: a file this large is not a config (a weight file renamed?).
MAX_JSON_BYTES = 32 << 20


@lru_cache(maxsize=1)
def recipes_dir() -> Path:
    """The shipped recipes: ``hf_precision/recipes`` in a wheel, the top-level ``recipes/`` in a source checkout.

    Example:
        >>> (recipes_dir() / "sdxl.yaml").is_file()
        True
    """
    here = Path(__file__).resolve().parents[1]  # the hf_precision package
    for candidate in (here / "recipes", here.parent / "recipes"):
        if (candidate / "devices.yaml").is_file():
            return candidate
    raise RecipeError(f"hf_precision's recipes are missing (looked in {here / 'recipes'} and {here.parent / 'recipes'}); "
                      "reinstall the package: pip install --force-reinstall hf-precision")


# ------------------------------------------------------------------------------------------------------- YAML


class _Refused(Exception):
    """Raised while checking; ``parse_yaml`` turns it into a RecipeError naming the source."""

    def __init__(self, mark: Any, message: str, *, line: int | None = None):
        super().__init__(message)
        self.line = mark.line + 1 if mark is not None else line
        self.message = message


_WRITE_OUT = "recipes are plain data: write the values out in full"
# Below this many structure characters ([{-:?,) a file cannot break the limits, so it is composed directly (every
# shipped recipe is); above it, or with an anchor ('&'), an event pre-scan checks the limits first.
_DIRECT = 400


def _path(parts: Any) -> str:
    return "".join(p if p.startswith("[") else f".{p}" for p in parts).lstrip(".") or "top level"


# Flow brackets, quotes, comments and line breaks: all the flow-depth scan needs to look at.
_FLOW_TOKENS = re.compile(r"""[\[\]{}"'#\n]""")


def _flow_depth_scan(text: str) -> None:
    """Refuse flow brackets nested deeper than ``MAX_DEPTH`` from the text alone, before any YAML parser runs.

    libyaml's scanner reads a run of '[' before its first event, and PyYAML 6.0.4's libyaml stops at its own limit of
    1,000 in its own words, so the event pre-scan never sees the 33rd level. Quotes and comments are skipped; a
    bracket in a plain scalar (``a: x[1]``) is counted, over-counting only a file with 32 unclosed brackets already.
    """
    depth, line, pos = 0, 1, 0
    for match in _FLOW_TOKENS.finditer(text):
        ch, at = match.group(), match.start()
        if at < pos:
            continue
        if ch == "\n":
            line += 1
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise _Refused(None, f"nested deeper than {MAX_DEPTH} levels (flow brackets); "
                                     "recipes nest at most 6 levels: flatten it", line=line)
        elif ch in "]}":
            depth = max(depth - 1, 0)
        elif ch == "#":
            if at == 0 or text[at - 1] in " \t\n":
                end = text.find("\n", at)
                pos = len(text) if end < 0 else end  # the newline itself is counted on the next match
        elif at == 0 or text[at - 1] in " \t\n[{,:-?":  # a quote that opens a quoted scalar
            end = _quote_end(text, at, ch)
            line += text.count("\n", at, end)
            pos = end + 1


def _quote_end(text: str, start: int, quote: str) -> int:
    """Index of the quote that closes the scalar opened at ``start`` (``''`` and ``\\"`` are escapes)."""
    i = start + 1
    while True:
        i = text.find(quote, i)
        if i < 0:
            return len(text)
        if quote == "'" and text.startswith("''", i):
            i += 2
        elif quote == '"' and (len(text[:i]) - len(text[:i].rstrip("\\"))) % 2:  # an odd run of backslashes
            i += 1
        else:
            return i


def _prescan(text: str, loader: type) -> None:
    """Check anchors, nesting and lengths on the event stream, before any node is built (constant memory)."""
    import yaml
    from yaml.events import AliasEvent, CollectionEndEvent, CollectionStartEvent, MappingStartEvent, ScalarEvent

    frames: list[list[Any]] = []  # [is_mapping, entries seen, current key, start mark]

    def where() -> str:
        return _path(str(f[2]) if f[0] else f"[{f[1] - 1}]" for f in frames if f[1])

    nodes = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, CollectionEndEvent):
            frames.pop()
            continue
        if not isinstance(event, (ScalarEvent, CollectionStartEvent, AliasEvent)):
            continue
        if isinstance(event, AliasEvent) or event.anchor is not None:
            kind = f"alias '*{event.anchor}'" if isinstance(event, AliasEvent) else f"anchor '&{event.anchor}'"
            raise _Refused(event.start_mark, f"YAML anchors and aliases are not allowed (found {kind} at {where()}); "
                                             f"{_WRITE_OUT}")
        nodes += 1
        if frames:
            frame = frames[-1]
            if frame[0] and frame[1] % 2 == 0:
                frame[2] = event.value if isinstance(event, ScalarEvent) else "?"
            frame[1] += 1
            if frame[1] > (2 * MAX_ITEMS if frame[0] else MAX_ITEMS):
                what = "a mapping with more than {:,} keys" if frame[0] else "a list longer than {:,} entries"
                raise _Refused(frame[3], f"{where()}: {what.format(MAX_ITEMS)}; no recipe needs that many: shorten "
                                         "it (a pattern like 'down_blocks.*' covers many modules)")
        if nodes > MAX_NODES:
            raise _Refused(event.start_mark, f"more than {MAX_NODES:,} values in one file; recipes hold a few hundred")
        if isinstance(event, CollectionStartEvent):
            frames.append([isinstance(event, MappingStartEvent), 0, None, event.start_mark])
            if len(frames) > MAX_DEPTH:
                raise _Refused(event.start_mark, f"nested deeper than {MAX_DEPTH} levels at {where()}; recipes nest "
                                                 "at most 6 levels: flatten it")


def _check_tree(root: Any, loader: Any) -> None:
    """Refuse duplicate keys (the second would silently win), keys that are not names, merge keys, deep nesting."""
    from yaml.constructor import ConstructorError
    from yaml.nodes import MappingNode, ScalarNode

    stack: list[tuple[Any, tuple[str, ...]]] = [] if isinstance(root, ScalarNode) else [(root, ())]
    while stack:
        node, path = stack.pop()  # only collections are pushed
        if len(path) >= MAX_DEPTH:
            raise _Refused(node.start_mark, f"nested deeper than {MAX_DEPTH} levels at {_path(path)}; recipes nest "
                                            "at most 6 levels: flatten it")
        if not isinstance(node, MappingNode):
            items = node.value
            stack.extend((items[i], (*path, f"[{i}]")) for i in range(len(items) - 1, -1, -1)
                         if not isinstance(items[i], ScalarNode))
            continue
        seen: dict[Any, int] = {}
        children = []
        for key, value in node.value:
            if not isinstance(key, ScalarNode):
                raise _Refused(key.start_mark, f"{_path(path)}: a list or mapping used as a key; keys are plain "
                                               "names such as vae or dtype")
            if key.tag == "tag:yaml.org,2002:merge":
                raise _Refused(key.start_mark, f"{_path(path)}: YAML merge keys ('<<') are not allowed; {_WRITE_OUT}")
            if len(key.value) > MAX_KEY_CHARS:
                raise _Refused(key.start_mark, f"{_path(path)}: a key of {len(key.value):,} characters "
                                               f"({excerpt(key.value)}); keys are names of at most {MAX_KEY_CHARS}")
            ident: Any = key.value
            if key.tag != "tag:yaml.org,2002:str":
                try:  # `1:` and `true:` are one dict key once built: compare what the constructor makes of them
                    ident = loader.construct_object(key)
                except ConstructorError:
                    pass
            line = key.start_mark.line + 1
            if ident in seen:
                raise _Refused(key.start_mark, f"duplicate key {_path((*path, key.value))} (lines {seen[ident]} and "
                                               f"{line}); each key may appear once: merge the two entries into one")
            seen[ident] = line
            if not isinstance(value, ScalarNode):
                children.append((value, (*path, key.value)))
        stack.extend(reversed(children))


def parse_yaml(text: str, source: str, *, pure: bool = False) -> Any:
    """Parse YAML as plain data with limits; anything refused or malformed is one ``RecipeError`` naming source and line.

    Refused: object tags, anchors, aliases, merge and duplicate keys, and what passes ``MAX_YAML_BYTES``,
    ``MAX_ITEMS`` or ``MAX_DEPTH``. ``pure=True``: PyYAML's pure-Python loader instead of libyaml's (same rules).

    Example:
        >>> parse_yaml("components: {vae: {dtype: float32}}", "example")
        {'components': {'vae': {'dtype': 'float32'}}}
        >>> parse_yaml("a: 1\\na: 2", "example.yaml")
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: example.yaml: line 2: duplicate key a (lines 1 and 2); each key may appear once: merge the two entries into one
    """
    import yaml

    if len(text) > MAX_YAML_BYTES:
        raise RecipeError(f"{source}: {len(text):,} characters, more than the {MAX_YAML_BYTES:,} a recipe or override "
                          "may have; recipes are a few KB: check that this is the file you meant")
    # libyaml's loader when PyYAML has it (same rules, ~5x faster: recipes are read on every load).
    cls = yaml.SafeLoader if pure else getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = None
    try:
        if "&" in text or sum(map(text.count, "[{-:?,")) > _DIRECT:
            _flow_depth_scan(text)
            _prescan(text, cls)
        loader = cls(text)
        root = loader.get_single_node()
        if root is None:
            return None
        _check_tree(root, loader)
        return loader.construct_document(root)
    except _Refused as err:
        line = f" line {err.line}:" if err.line is not None else ""
        raise RecipeError(f"{source}:{line} {err.message}") from None
    except yaml.constructor.ConstructorError as err:
        mark = err.problem_mark
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise RecipeError(f"{source}:{line}: refused YAML tag ({err.problem}); recipes are plain data: "
                          "remove tags such as !!python/object and write plain mappings, lists and strings") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        if "nesting depth" in str(getattr(err, "problem", "")):  # a parser's own depth limit: say ours
            line = f" line {mark.line + 1}:" if mark is not None else ""
            raise RecipeError(f"{source}:{line} nested deeper than {MAX_DEPTH} levels; recipes nest at most 6 "
                              "levels: flatten it") from None
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise RecipeError(f"{source}:{where}: malformed YAML ({problem}); fix the syntax there "
                          "(indentation, a missing ':' or an unclosed bracket)") from None
    finally:
        if loader is not None:
            loader.dispose()


def _read_text(path: Path, limit: int, kind: str) -> str:
    """The file's text, read no further than ``limit`` bytes (a FIFO or /dev/zero has no size to check first)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise RecipeError(f"{path}: file not found; check the path (relative paths are taken from {Path.cwd()})") from None
    except IsADirectoryError:
        raise RecipeError(f"{path}: is a folder; pass a {kind} file") from None
    except OSError as err:
        raise RecipeError(f"{path}: cannot read it ({err.strerror or err}); check that the file is readable") from None
    if len(data) > limit:
        raise RecipeError(f"{path}: larger than the {limit:,} bytes a {kind} file may have; "
                          "check that this is the file you meant")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RecipeError(f"{path}: not UTF-8 text (byte {err.start}: {excerpt(data[err.start:err.start + 8])}); "
                          f"pass a UTF-8 {kind} file") from None


def read_yaml(path: str | Path) -> Any:
    """Read a recipe or override file safely (see :func:`parse_yaml`); a missing or unreadable file is a ``RecipeError``.

    Example:
        >>> read_yaml(recipes_dir() / "sdxl.yaml")["kind"]
        'pipeline'
    """
    path = Path(path)
    return parse_yaml(_read_text(path, MAX_YAML_BYTES, "YAML"), str(path))


# ------------------------------------------------------------------------------------------------------- JSON


def download_command(repo: str, local_dir: str | Path | None = None, filename: str | None = None) -> str:
    """The command that downloads ``repo`` (or one file of it) again, for the installed huggingface_hub.

    Example:
        >>> download_command("org/name", "./name")  # doctest: +ELLIPSIS
        '... download org/name --local-dir ./name'
    """
    try:
        from huggingface_hub import __version__ as hub
        new = tuple(int(p) for p in hub.split(".")[:2]) >= (0, 34)  # `hf` replaced `huggingface-cli` in 0.34
    except (ImportError, ValueError):
        new = True
    cmd = f"{'hf' if new else 'huggingface-cli'} download {repo}"
    if filename:
        cmd += f" {filename}"
    return cmd + (f" --local-dir {local_dir}" if local_dir is not None else " --force-download")


def _pipeline_root(path: Path) -> Path | None:
    for parent in (path.parent, path.parent.parent):
        if (parent / "model_index.json").is_file():
            return parent
    return None


def _component(path: Path) -> str | None:
    root = _pipeline_root(path)
    return path.parent.name if root is not None and path.parent != root else None


def _cached_repo(path: Path) -> tuple[str, Path] | None:
    """(repo id, snapshot folder) when ``path`` lies in the Hugging Face cache (``models--org--name/snapshots/REV``)."""
    parts = path.parts
    for i, part in enumerate(parts[:-2]):
        if part.startswith("models--") and parts[i + 1] == "snapshots":
            return part[len("models--"):].replace("--", "/"), Path(*parts[:i + 3])
    return None


def damaged_file(path: str | Path, problem: str, *, repo: str | None = None) -> DamagedFileError:
    """The error for a model file that exists but cannot be used: the file, its component, what is wrong, and the
    fix (the download command when the repo is known from ``repo`` or the Hub cache, else saving it again).

    Example:
        >>> print(damaged_file("/m/unet/x.safetensors", "truncated"))  # doctest: +ELLIPSIS
        /m/unet/x.safetensors: damaged file: truncated; ...
    """
    path = Path(path)
    root = _pipeline_root(path)
    cached = _cached_repo(path)
    if cached is not None:
        rel = path.relative_to(cached[1]).as_posix()
        fix = f"download it again: {download_command(cached[0], None, rel)}"
    elif repo is not None:
        fix = f"download it again: {download_command(repo, root or path.parent)}"
    else:
        folder = root or path.parent
        fix = (f"save the pipeline again (pipe.save_pretrained('{folder}')) or, if it came from the Hub, download it "
               f"again: {download_command('ORG/NAME', folder)}")
    return DamagedFileError(path, f"damaged file: {problem}", fix, component=_component(path))


def read_json(path: str | Path, *, repo: str | None = None) -> dict[str, Any]:
    """Read a ``model_index.json`` or ``config.json``; a damaged or unreadable one is a :class:`DamagedFileError`.

    Example:
        >>> import json, tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "config.json"
        >>> _ = p.write_text('{"_class_name": "AutoencoderKL"')
        >>> read_json(p)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.DamagedFileError: ...config.json: damaged file: not valid JSON (line 1, column 32: ...
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_JSON_BYTES + 1)
    except OSError as err:
        raise DamagedFileError(path, f"cannot read it ({err.strerror or err})",
                               "check that it exists and is readable (permissions, a broken link)",
                               component=_component(path)) from None
    if len(data) > MAX_JSON_BYTES:
        raise damaged_file(path, f"larger than {MAX_JSON_BYTES >> 20} MiB, which no config is", repo=repo)
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise damaged_file(path, f"not UTF-8 text (binary data at byte {err.start})", repo=repo) from None
    except json.JSONDecodeError as err:
        what = "empty" if not data.strip() else f"not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})"
        raise damaged_file(path, what, repo=repo) from None
    if not isinstance(value, dict):
        raise damaged_file(path, f"expected a JSON object, found {type(value).__name__} {excerpt(value)}", repo=repo)
    return value


def shared_mode(path: str | Path) -> None:
    """Give a ``tempfile.mkstemp`` file (0600) the mode ``open`` gives (0666 less the umask) before it is shared.

    Example:
        >>> import os, tempfile
        >>> fd, name = tempfile.mkstemp(); os.close(fd)
        >>> mask = os.umask(0o022); shared_mode(name); _ = os.umask(mask)
        >>> oct(os.stat(name).st_mode & 0o777)
        '0o644'
    """
    import os

    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)

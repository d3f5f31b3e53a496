"""What every subcommand shares: the command registry and the recipe options (``--device``, ``--overrides``, ``--set``)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["COMMANDS", "HelpFormatter", "closed_output", "our_warnings", "command", "add_recipe_args", "add_base_arg", "overrides_from", "preflight", "resolve_for", "quiet_optional_dependencies",
           "script_main", "script_parser"]

AddArgs = Callable[[argparse.ArgumentParser], None]
# name -> (help, the function adding its arguments, handler 'module:function', examples shown under --help)
COMMANDS: dict[str, tuple[str, AddArgs, str, str | None]] = {}


def command(name: str, help: str, handler: str, epilog: str | None = None) -> Callable[[AddArgs], AddArgs]:
    """Register a subcommand: the decorated function adds its arguments; ``handler`` is 'module:function';
    ``epilog`` (examples, rules) ends its ``--help``."""
    def wrap(fn: AddArgs) -> AddArgs:
        COMMANDS[name] = (help, fn, handler, epilog)
        return fn
    return wrap


def script_parser(name: str, prog: str | None, description: str) -> argparse.ArgumentParser:
    """The parser of a ``scripts/*.py`` wrapper: the arguments and the ``--help`` examples of the subcommand
    ``name`` (one definition for both), under the script's own ``prog`` and ``description``.

    Example:
        >>> import hf_precision.cli.train
        >>> script_parser("train", "train.py", "Train.").parse_args(["--demo"]).demo
        True
    """
    _, add_arguments, _, epilog = COMMANDS[name]
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog, formatter_class=HelpFormatter)
    add_arguments(parser)
    return parser


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default, unless the help already quotes it: a user is never left to guess
    what ``--steps`` runs when not given. Flags, empty lists and ``None`` (whose help says what happens) add nothing.

    Example:
        >>> p = argparse.ArgumentParser(prog="x", formatter_class=HelpFormatter)
        >>> _ = p.add_argument("--steps", type=int, default=30, help="denoising steps")
        >>> "denoising steps (default: 30)" in p.format_help()
        True
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or default is None or default is argparse.SUPPRESS or isinstance(default, bool)
                or default == [] or "%(default)" in text or ("default" in text and str(default) in text)):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


RUN_DEVICE_HELP = ("where it runs: cpu, cuda, cuda:1, mps, xpu (default: the best present device). To run the dtypes "
                   "of a device you do not have, add --layout (e.g. --layout t4 --device cpu)")
LAYOUT_HELP = ("whose device rules choose the dtypes: a preset (t4, a100, m1-macos13, cpu-amx; see `hf-precision "
               "devices`), a description (cuda:sm75, mps:macos=13.6) or a present device (default: --device)")
PLAN_DEVICE_HELP = ("device to resolve for (nothing runs, so any device): cpu, cuda, mps, a preset (t4, a100, "
                    "m1-macos13, cpu-amx; see `hf-precision devices`) or a description (cuda:sm75, mps:macos=13.6). "
                    "Default: the best present device")


def add_recipe_args(p: argparse.ArgumentParser, device_help: str | None = None, *, layout: bool = True) -> None:
    """Add ``--device``, ``--layout``, ``--overrides`` and ``--set``: the options of every command that resolves a recipe.
    ``--device`` is where it runs, ``--layout`` whose device rules choose the dtypes (default the device's own);
    commands that run nothing take either. ``layout=False`` leaves ``--layout`` to the command (``check``'s ``--for``).
    """
    p.add_argument("--device", default=None, help=device_help or RUN_DEVICE_HELP)
    if layout:
        p.add_argument("--layout", default=None, metavar="DEVICE", help=LAYOUT_HELP)
    p.add_argument("--overrides", action="append", default=[], metavar="YAML",
                   help="override file merged over the recipe (repeatable; later files win)")
    p.add_argument("--set", dest="set_", action="append", default=[], metavar="COMPONENT.KEY=VALUE",
                   help="one override, e.g. --set vae.dtype=float32 or --set unet.keep_fp32=[time_embedding] (repeatable; wins over files)")


BASE_HELP = ("with a single file as {what} (a fine-tuned denoiser .safetensors, diffusers or original layout, a "
             "whole SD/SDXL checkpoint, or .gguf): the diffusers folder, alias or Hub id for the rest of the pipeline; "
             "the file's header is checked against the base's denoiser before loading")


def add_base_arg(p: argparse.ArgumentParser, what: str) -> None:
    """Add ``--base``: every command that takes a model takes a single-file checkpoint the same way, the file as
    its model argument (``what``, as its usage names it) and ``--base`` for the rest (``load_pipeline(file, base=)``).

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_base_arg(p, "MODEL")
        >>> p.parse_args(["--base", "./sdxl"]).base
        './sdxl'
    """
    p.add_argument("--base", default=None, metavar="FOLDER", help=BASE_HELP.format(what=what))


def overrides_from(args: argparse.Namespace) -> list[Any]:
    """The override layers of parsed arguments, in merge order: files, then --set flags."""
    from ..recipe.overrides import Override, parse_set

    layers: list[Any] = list(args.overrides)
    if args.set_:
        layers.append(Override("--set", parse_set(args.set_)))
    return layers


def preflight(path: str, *, recipe: str | None = None, device: Any = None, overrides: Any = None,
              weights: bool = True) -> None:
    """Check what can be checked before torch and diffusers are imported (seconds): a local folder's index and component
    configs, its safetensors headers against the file sizes (``weights=True``), and the recipe with the overrides; the
    first problem is the one-line error loading would raise later. A Hub id or a folder without ``model_index.json``
    is left to the loader.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "model_index.json").write_text('{"_class_name": "StableDiffusionXLPipeline", ')
        >>> preflight(str(folder))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.DamagedFileError: ...model_index.json: damaged file: not valid JSON ...
    """
    from pathlib import Path

    from ..recipe.catalog import recipe_classes
    from ..recipe.files import read_json
    from ..recipe.resolution import get_recipe
    from ..runtime.load import check_files

    index_file = Path(path).expanduser() / "model_index.json"
    if not index_file.is_file():
        return
    check_files(index_file.parent, weights=weights)
    name = recipe or recipe_classes().get(str(read_json(index_file).get("_class_name")))
    if name is None:
        return  # no shipped recipe: load_pipeline composes one, or reports an unknown class with the options
    get_recipe(name, device=device, overrides=overrides)
def script_main(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int | None], argv: Any = None,
                interrupted: str | None = None, prog: Callable[[argparse.Namespace], str] | None = None) -> int:
    """The entry point of every command line (``hf-precision``, ``scripts/*.py``): optional dependencies' notices
    silenced, arguments spelled as flags, bad input one message and exit 2, no traceback for a reader gone away
    (``| head``), Ctrl-C with ``interrupted`` printed and exit 130; ``prog(args)`` names the command (default: prog).

    Example:
        >>> def fails(args):
        ...     from hf_precision.errors import RecipeError
        ...     raise RecipeError("--out x: exists")
        >>> script_main(argparse.ArgumentParser(prog="demo.py"), fails, [])  # prints to stderr
        2
    """
    import sys

    from ..errors import RecipeError, command_line_spelling

    quiet_optional_dependencies()
    try:  # the reader may leave while any command (or --help) still prints
        args = parser.parse_args(argv)
        name = prog(args) if prog is not None else str(parser.prog)
        try:
            with our_warnings(name), command_line_spelling():
                return int(run(args) or 0)
        except RecipeError as err:
            print(f"{name}: error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            if interrupted is None:
                raise
            print(f"{name}: {interrupted}", file=sys.stderr)
            return 130
    except BrokenPipeError:
        return closed_output()


@contextlib.contextmanager
def our_warnings(prog: str) -> Iterator[None]:
    """Inside the block, a warning of hf_precision's own prints as one line of ours (``hf-precision show: warning:
    ...``), not Python's ``file:line: UserWarning`` and source line; other packages' print as Python prints them,
    except diffusers' and transformers' own, held back with what they log (:func:`hf_precision.cli.quiet.library_logs`).
    The previous printer comes back after the block.

    Example:
        >>> import sys, warnings
        >>> from hf_precision.recipe.catalog import recipe_for
        >>> with our_warnings("hf-precision show"), contextlib.redirect_stderr(sys.stdout):
        ...     warnings.warn_explicit("no component recipe for x", UserWarning, recipe_for.__code__.co_filename, 1)
        hf-precision show: warning: no component recipe for x
    """
    import sys
    import warnings
    from pathlib import Path

    package = str(Path(__file__).resolve().parents[1])
    shown = warnings.showwarning

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if route.hold_warning(message, category, filename, lineno):
            return
        if not str(Path(filename).resolve()).startswith(package):
            shown(message, category, filename, lineno, file, line)
            return
        print(f"{prog}: warning: {message}", file=file or sys.stderr)

    from .quiet import library_logs

    with warnings.catch_warnings(), library_logs(prog) as route:
        warnings.showwarning = show
        yield


# The exit status of a program its reader stopped reading (`| head`): 128 + SIGPIPE, as the shell's own tools end.
CLOSED_PIPE_EXIT = 141


def closed_output() -> int:
    """What a command does when whoever reads its output went away (``hf-precision show ... | head``): no traceback,
    and no second one when Python flushes stdout at exit (it is pointed at /dev/null); returns the exit status.

    Example:
        >>> closed_output()  # under doctest stdout has no file descriptor: nothing to redirect
        141
    """
    import os
    import sys

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # a stdout without a file descriptor (a test's capture)
        pass
    return CLOSED_PIPE_EXIT


def resolve_for(args: argparse.Namespace) -> str | None:
    """The device whose rules choose the dtypes: ``--layout``, else ``--device`` (for commands that run nothing)."""
    return getattr(args, "layout", None) or args.device


# Messages optional dependencies print on every command that are not the user's business: what each says is about a
# package's own build or a deprecated argument diffusers passes for the user, never about their command.
#   torchao: its CUDA kernel libraries do not load in a CPU-only torch ("Failed to load ..._C_cutlass_90a.abi3.so"),
#     and its Enum registrations trip a torch deprecation notice; diffusers then says it cannot import torchao tensors.
#   transformers: an image processor falls back to its PIL version without torchvision (same results).
#   huggingface_hub: diffusers' configuration_utils.py passes local_dir_use_symlinks="auto", which the Hub deprecated.
#   What they print while they import at all is held back by hf_precision.cli.quiet.
_QUIET_LOGS = {
    "torchao": ("Failed to load ",),
    "torch.utils._pytree": ("is an Enum subclass and is now natively supported",),
    "diffusers.quantizers.torchao.torchao_quantizer": ("Unable to import `torchao` Tensor objects",),
    "transformers.utils.import_utils": ("requires torchvision (not installed)",),
    # diffusers lists a model's _keep_in_fp32_modules on every `.to(dtype)`, even when empty; the recipe decides and
    # reports which modules stay float32 (the plan's islands)
    "diffusers.models.modeling_utils": ("that should be kept in float32",),
    # on every load of I2VGen-XL, Stable Cascade ...: the same notice each time, about diffusers' plans, not the run
    "diffusers.pipelines.pipeline_utils": ("has been deprecated and will not receive bug fixes",),
    # pipelines that prepend a long instruction to the prompt (Sana's complex_human_instruction) and cut it after
    "transformers.tokenization_utils_base": ("Token indices sequence length is longer than the specified",),
}


class _Drop:
    """A logging filter that drops the records whose message contains one of ``parts``."""

    def __init__(self, parts: tuple[str, ...]):
        self.parts = parts

    def filter(self, record: Any) -> bool:
        message = record.getMessage()
        return not any(p in message for p in self.parts)


def quiet_optional_dependencies() -> None:
    """Silence the notices of optional dependencies listed in ``_QUIET_LOGS`` (exact messages, never whole loggers).

    Called by the command line and the scripts before diffusers is imported; the library itself changes no logging.

    Example:
        >>> import logging
        >>> quiet_optional_dependencies()
        >>> logging.getLogger("torchao").filters[-1].filter(logging.makeLogRecord({"msg": "Failed to load x.so"}))
        False
    """
    import logging
    import warnings

    from .quiet import install

    install()
    for name, parts in _QUIET_LOGS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) for f in logger.filters):
            logger.addFilter(_Drop(parts))
    warnings.filterwarnings("ignore", message=r"The `local_dir_use_symlinks` argument is deprecated")
    # Other libraries' deprecation notices are about their own code or what diffusers passes them, not about the
    # user's command; what one means for the user is said in our words (optimum-quanto leaving diffusers 1.0: the
    # load report, hf_precision.runtime.quantize_load.QUANTO_LEAVES). Our own stay visible.
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
        warnings.filterwarnings("default", category=category, module=r"hf_precision(\.|$)")

"""Readable dtype and device mismatch errors: the failing module, the two dtypes or devices, and a fix that works.

:func:`explain` watches which ``nn.Module`` is executing around a block or a function, and :func:`explain_error`
reads it from a caught exception's traceback; both turn a mismatch into a :class:`MismatchError` that names the
module, the input-side and parameter-side dtypes (or devices) and a fix. Nothing else is caught: other exceptions
propagate as the same object. The work is shared out: ``wordings`` reads torch's messages (:func:`parse_mismatch`),
``locate`` names the executing module, ``fixes`` says what to do; this module is the error and the two doors.

Nothing is imported at import time except the standard library; torch is imported inside functions.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .fixes import Where, mismatch_fix
from .locate import Names, Session, first_dtype, module_at, pipeline_components, pipeline_models
from .quant_errors import parse_quantized, quantized_fix
from .wordings import VALUE_ERROR_FAMILIES, parse_mismatch

if TYPE_CHECKING:
    from torch import nn

__all__ = ["MismatchError", "explain", "explain_error", "parse_mismatch"]

F = TypeVar("F", bound=Callable[..., Any])


def _parse_exception(exc: BaseException | None) -> dict[str, Any] | None:
    """:func:`parse_mismatch` of an exception: a ``RuntimeError``, or a ``ValueError`` of torch's Python checks."""
    if not isinstance(exc, (RuntimeError, ValueError)) or isinstance(exc, MismatchError):
        return None
    parsed = parse_mismatch(str(exc))
    if parsed is None or (not isinstance(exc, RuntimeError) and parsed["family"] not in VALUE_ERROR_FAMILIES):
        return None
    return parsed


# ---------------------------------------------------------------------------------------------------------------
# The error
# ---------------------------------------------------------------------------------------------------------------


class MismatchError(RuntimeError):
    """A dtype or device mismatch, explained: where it happened, the two sides, and the fix.

    Raised by :func:`explain` (``from`` the original error) and returned by :func:`explain_error`. ``str(err)`` is the full message: a first line such as ``dtype mismatch in
    unet.time_embedding.linear_1: input is float32, weights are float16``, a ``fix:`` line, and torch's original
    message quoted at the end.

    Attributes:
        kind (`str`): ``"dtype"`` or ``"device"`` (a device mismatch whose dtypes differ too has ``dtypes``).
        module (`str` or `None`): Dotted path of the innermost module executing when torch raised, e.g.
            ``"unet.time_embedding.linear_1"``; ``None`` when no module was executing (or it is unknown).
        component (`str` or `None`): The pipeline component (first path segment), e.g. ``"unet"``; ``None``
            for a bare module explained without a ``component`` name.
        got (`str` or `None`): Input-side dtype or device (``"float32"``, ``"cpu"``).
        expected (`str` or `None`): Parameter-side dtype or device (``"float16"``, ``"cuda:0"``).
        dtypes (`tuple` or `None`): For a device mismatch whose dtypes differ as well (CUDA's ``Input type
            (torch.FloatTensor) and weight type (torch.cuda.HalfTensor)``): (input dtype, weight dtype).
        sides_known (`bool`): Whether ``got``/``expected`` are known to be the input and parameter sides. When
            neither the message nor the module's parameters tell, they are in the message's order.
        family (`str` or `None`): Which torch wording was recognised (see :func:`parse_mismatch`).
        fix (`str` or `None`): What to do, with the override lines (``--set text_encoder_2.dtype=float16``).
        overrides (`tuple`): The override alternatives the fix prints, each a tuple of ``--set`` values
            (``("text_encoder.dtype=float16", "text_encoder_2.dtype=float16")``); every one changes the dtype of
            the components it names. Empty when the fix has no override line.
        original (`RuntimeError` or `None`): torch's error (also ``__cause__``).
    """

    def __init__(self, message: str, *, kind: str | None = None, module: str | None = None,
                 component: str | None = None, got: str | None = None, expected: str | None = None,
                 fix: str | None = None, original: BaseException | None = None, family: str | None = None,
                 sides_known: bool = True, dtypes: tuple[str, str] | None = None,
                 overrides: tuple[tuple[str, ...], ...] = ()):
        super().__init__(message)
        self.kind = kind
        self.module = module
        self.component = component
        self.got = got
        self.expected = expected
        self.dtypes = dtypes
        self.fix = fix
        self.overrides = overrides
        self.original = original
        self.family = family
        self.sides_known = sides_known


def explain_error(exc: BaseException, module_path: str | None = None, *, target: Any = None
                  ) -> MismatchError | None:
    """Build the :class:`MismatchError` for an exception, if it is a dtype or device mismatch.

    For code that caught the error itself (``hf_precision.explain_error(err)``). Nothing is raised: the
    caller decides (``raise err from exc``). ``err.__cause__`` is already set to ``exc``. Without
    ``module_path`` and ``target``, the failing module and the pipeline are read from the exception's traceback
    (the ``self`` of the ``forward`` frames), so a caught error is explained as well as one raised under
    ``with explain(pipe):``.

    Args:
        exc (`BaseException`): The exception. A ``RuntimeError`` (or one of torch's mismatch ``ValueError``\\ s)
            whose message :func:`parse_mismatch` recognises is explained; a :class:`MismatchError` is returned as is.
        module_path (`str`, *optional*): Dotted path of the failing module, e.g. ``"unet.time_embedding.linear_1"``.
            Its first segment is taken as the component.
        target (pipeline or `nn.Module`, *optional*): When given with ``module_path``, the failing module is looked
            up in it, so that its parameters can tell which side is the input, float32 islands can be named and the
            fix can name the other components.

    Returns:
        `MismatchError` or `None`: ``None`` when ``exc`` is not a mismatch.

    Example:
        >>> err = explain_error(RuntimeError("mat1 and mat2 must have the same dtype, but got Float and Half"),
        ...                     "unet.time_embedding.linear_1")
        >>> print(str(err).splitlines()[0])
        dtype mismatch in unet.time_embedding.linear_1: input is float32, weights are float16
        >>> "load_pipeline" in err.fix, err.overrides   # no pipeline given: no override can be known to help
        (True, ())
        >>> explain_error(ValueError("nope")) is None
        True
    """
    if isinstance(exc, MismatchError):
        return exc
    parsed = _parse_exception(exc)
    if parsed is None and parse_quantized(str(exc)) is None:
        return None
    if module_path is None and (target is None or parsed is None):
        chain, pipeline, input_dtype = _traceback_modules(exc)
        names = Names(pipeline if pipeline is not None else target, None)
        return _build(exc, parsed, Where(*names.locate(chain), names.components, input_dtype))
    component, rel, module, root, components = None, None, None, None, None
    if module_path:
        component, _, rel = module_path.partition(".")
        if target is not None:
            component, rel, module, root = module_at(target, module_path)
            components = pipeline_models(target)
    return _build(exc, parsed, Where(module_path, component, rel, module, root, components))


def _traceback_modules(exc: BaseException) -> tuple[list[nn.Module], Any, str | None]:
    """Modules whose ``forward`` frames are in the traceback (outermost first), the pipeline being called (or
    ``None``) and the dtype of the innermost module's first floating input (from its frame's arguments).

    A mismatch that library code wrapped (``raise RuntimeError(...) from err``) is followed into its cause, whose
    traceback holds the deeper frames.
    """
    from torch import nn

    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and all(e is not c for c in chain):
        chain.append(e)
        nxt = e.__cause__ or e.__context__
        e = nxt if _parse_exception(nxt) is not None else None
    modules: list[nn.Module] = []
    pipeline = None
    input_dtype = None
    for e in chain:
        tb = e.__traceback__
        while tb is not None:
            local = tb.tb_frame.f_locals
            owner = local.get("self")
            if isinstance(owner, nn.Module):
                if all(owner is not m for m in modules):
                    modules.append(owner)
                    input_dtype = first_dtype(v for k, v in local.items() if k != "self")
            elif pipeline is None and owner is not None and pipeline_components(owner) is not None:
                pipeline = owner
            tb = tb.tb_next
    return modules, pipeline, input_dtype


def _build(exc: BaseException, parsed: dict[str, Any] | None, w: Where) -> MismatchError | None:
    """Turn a parsed mismatch, else an fp8/quantized-weight error (quant_errors.py), plus what is known about the
    failing module into a MismatchError with its fix; None when ``exc`` is neither."""
    if parsed is not None:
        fix = mismatch_fix(parsed, w)
        err = MismatchError(f"{fix.header}\nfix: {fix.text}\ntorch: {str(exc)!r}", kind=parsed["kind"], module=w.path,
                            component=w.component, got=fix.got, expected=fix.expected, fix=fix.text, original=exc,
                            family=parsed["family"], sides_known=fix.sides_known, dtypes=parsed.get("dtypes"),
                            overrides=fix.overrides)
    else:
        found = parse_quantized(str(exc))
        if found is None or not isinstance(exc, (RuntimeError, NotImplementedError, ValueError)) \
                or isinstance(exc, MismatchError):
            return None
        header, text = quantized_fix(found["family"], w.component, w.input_dtype)
        err = MismatchError(f"{header}{' (' + w.path + ')' if w.path else ''}\nfix: {text}\ntorch: {str(exc)!r}",
                            kind="quantized", module=w.path, component=w.component, fix=text, original=exc,
                            family=found["family"])
    err.__cause__ = exc
    return err


# ---------------------------------------------------------------------------------------------------------------
# The context manager / decorator
# ---------------------------------------------------------------------------------------------------------------


class _Explain:
    """Context manager and decorator returned by :func:`explain`."""

    def __init__(self, target: Any, component: str | None):
        self._target = target
        self._component = component
        self._session: Session | None = None

    def __enter__(self) -> _Explain:
        if self._session is not None:
            raise RuntimeError("this hf_precision.explain() context is already active; use a new explain(...)")
        session = Session(self._target, self._component)
        session.start()
        self._session = session
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        session, self._session = self._session, None
        if session is None:
            return False
        try:
            session.stop()
            parsed = _parse_exception(exc)
            if parsed is None and parse_quantized(str(exc)) is None:
                return False
            assert exc is not None
            try:
                seen = session.chain_for(exc)
                modules, pipeline, traced_dtype = _traceback_modules(exc)
                chain, input_dtype = seen if seen is not None else (modules, traced_dtype)
                names: Names = session
                if self._target is None and pipeline is not None:  # name modules inside the pipeline being called
                    names = Names(pipeline, None)
                where = Where(*names.locate(chain), names.components, input_dtype)
                err = _build(exc, parsed, where)
                if err is None:
                    return False
            except Exception:  # a bug here must never hide the user's error: let the original propagate
                return False
        finally:
            session.failures.clear()
            session.stack.clear()
        raise err from exc

    def __call__(self, func: F) -> F:
        target, component = self._target, self._component

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _Explain(target, component):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def explain(target: Any = None, *, component: str | None = None) -> Any:
    """Explain dtype and device mismatches raised in a block or a function.

    As a context manager or decorator, torch's global module hooks (``register_module_forward_pre_hook`` /
    ``register_module_forward_hook``) track which module is executing while it is active; they are removed on
    exit, also on error. An error whose message :func:`parse_mismatch` recognises is re-raised as a
    :class:`MismatchError` naming the innermost module that was executing when torch raised, the input-side and
    parameter-side dtypes (or devices) and the fix, ``from`` the original error. Every other exception propagates
    unchanged, as the same object. The hooks put every module call on torch's slow path (tens of microseconds per
    call), so use this for debugging, not in production loops.

    For an error you caught yourself, :func:`explain_error` returns its :class:`MismatchError` (``None`` when it is
    not a mismatch), reading the failing module and the pipeline from the exception's traceback.

    Every override line of a fix changes the dtype of the components it names. When a component received another
    component's activations (its weights already have the dtype it computes in), the fix names the loader, which
    casts at component boundaries, or the components to change so that the pipeline agrees on one dtype, never
    the dtype the failing component already has.

    Args:
        target (pipeline, `nn.Module` or function, *optional*): Where module names come from. A
            diffusers pipeline (anything with a ``components`` dict) names modules ``f"{component}.{name}"``
            (``unet.time_embedding.linear_1``) and lets the fix name other components; an ``nn.Module`` by its
            ``named_modules()`` names; ``None`` names them inside the pipeline being called, else inside the
            outermost module that was executing. Modules outside the target are named by class. A plain
            function passed directly (``@explain``) is decorated.
        component (`str`, *optional*): For an ``nn.Module`` target, the pipeline attribute it will live under
            (``"unet"``), used as the path prefix and in the override line.

    Returns:
        A context manager (``with explain(pipe): ...``) that is also a decorator (``@explain()``,
        ``@explain(pipe)``).

    Raises:
        MismatchError: From the original error, when the block raised a dtype or device mismatch.
        TypeError: ``target`` is neither ``None``, a pipeline (an object with a ``components`` mapping), an
            ``nn.Module`` nor a function; for a caught exception the message names :func:`explain_error`.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4)).to(torch.float16)
        >>> try:
        ...     with explain(model, component="unet"):
        ...         model(torch.randn(2, 4))
        ... except MismatchError as err:
        ...     print(str(err).splitlines()[0])
        ...     print(err.got, err.expected, type(err.__cause__).__name__)
        dtype mismatch in unet.0: input is float32, weights are float16
        float32 float16 RuntimeError
        >>> @explain(model, component="unet")
        ... def run(x):
        ...     return model(x)
        >>> try:
        ...     run(torch.randn(2, 4, dtype=torch.float64))
        ... except MismatchError as err:
        ...     print(err.got, err.expected)
        float64 float16
    """
    if isinstance(target, BaseException):  # explain_error() is the one door for a caught error
        raise TypeError(f"explain() watches a block or a function; for an error you caught, call "
                        f"hf_precision.explain_error(err): it returns the MismatchError, or None when "
                        f"{type(target).__name__} is not a dtype or device mismatch")
    if target is not None and inspect.isroutine(target):  # bare @explain
        return _Explain(None, component)(target)
    if target is not None:
        from torch import nn

        if not isinstance(target, nn.Module) and pipeline_components(target) is None:
            raise TypeError(f"explain() expects a diffusers pipeline (an object with a `components` mapping), an "
                            f"nn.Module, a function or None, not {type(target).__name__} (for a caught exception, "
                            f"call hf_precision.explain_error(err))")
    return _Explain(target, component)

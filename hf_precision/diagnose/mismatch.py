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


class MismatchError(RuntimeError):
    """A dtype or device mismatch, explained: where it happened, the two sides, and the fix.

    ``str(err)`` is a first line such as ``dtype mismatch in unet.time_embedding.linear_1: input is float32, weights
    are float16``, a ``fix:`` line, and torch's message quoted. Attributes: ``kind`` (``"dtype"``, ``"device"``),
    ``module`` (dotted path of the innermost executing module, or None), ``component`` (its first segment), ``got`` /
    ``expected`` (input-side / parameter-side dtype or device), ``dtypes`` (a device mismatch's differing dtypes),
    ``sides_known`` (False when neither message nor parameters tell the sides: message order), ``family`` (the torch
    wording, :func:`parse_mismatch`), ``fix``, ``overrides`` (the ``--set`` alternatives the fix prints, each changing
    the dtype of the components it names) and ``original`` (torch's error, also ``__cause__``).
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
    """The :class:`MismatchError` for a caught exception (``__cause__`` set), or None when it is not a mismatch.

    Without ``module_path`` (e.g. ``"unet.time_embedding.linear_1"``) and ``target`` (pipeline or module to look it up
    in, so the fix can name sides, islands and other components), both are read from the traceback's ``forward``
    frames, so a caught error is explained as well as one raised under ``with explain(pipe):``.

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
    """Explain dtype and device mismatches raised in a block or a function (context manager and decorator).

    While active, torch's global module hooks track the executing module; a recognised mismatch is re-raised as a
    :class:`MismatchError` ``from`` the original, anything else propagates as the same object. The hooks put every
    module call on torch's slow path (tens of microseconds), so this is for debugging. A fix never names the dtype the
    failing component already has: where it received another component's activations, it names the loader (which casts
    at component boundaries) or the components to change so the pipeline agrees on one dtype.

    ``target``: a pipeline (modules named ``f"{component}.{name}"``), an ``nn.Module`` (named as in
    ``named_modules()``, prefixed by ``component``), a function (``@explain``), or None (named inside the pipeline being
    called, else the outermost executing module). Anything else is a TypeError.

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

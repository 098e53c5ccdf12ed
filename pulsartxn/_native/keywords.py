"""Strict keyword arguments: an unknown keyword is a TypeError naming the nearest valid one
(Python 3.11 does not suggest one). The wrappers do work only once a call failed to bind, so
a call that binds pays one frame and nothing else. Hot methods (send, receive, acknowledge)
take ``**unknown: NoReturn`` instead and raise ``refused(method, unknown)``: no extra frame,
a type checker still flags a typo, and their signature is shown without it."""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def nearest(name: str, valid: Iterable[str]) -> str | None:
    """The valid name closest to `name` (case ignored), or None when none is close."""
    valid = list(valid)
    by_lower = {v.lower(): v for v in valid}
    hit = difflib.get_close_matches(str(name).lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[hit[0]] if hit else None


def unexpected_keyword(where: str, name: str, valid: Iterable[str]) -> TypeError:
    """The TypeError of an unknown keyword `name` of `where`, naming the nearest valid one."""
    valid = sorted(valid)
    hint = nearest(name, valid)
    text = f"{where}() got an unexpected keyword argument {name!r}"
    if hint is not None:
        return TypeError(f"{text}; did you mean {hint!r}?")
    return TypeError(f"{text}; valid keywords: {', '.join(valid)}")


def keywords_of(func: Callable) -> list[str] | None:
    """The names `func` takes by keyword; None when it takes any (``**kwargs``)."""
    try:
        params = inspect.signature(func, follow_wrapped=False).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD and p.name != HOT for p in params):
        return None
    return [p.name for p in params if p.kind in _NAMED and p.name not in ("self", "cls")]


def explain(func: Callable, kwargs: dict) -> TypeError | None:
    """After `func(**kwargs)` raised TypeError: the error naming the nearest valid keyword if
    one of `kwargs` is unknown to it (then binding failed), else None (the body raised)."""
    if not kwargs:
        return None
    valid = keywords_of(func)
    if valid is None:
        return None
    for name in kwargs:
        if name not in valid:
            where = func.__qualname__.removesuffix(".__init__").removesuffix(".__new__")
            return unexpected_keyword(where, name, valid)
    return None


def refused(func: Callable, unknown: dict) -> TypeError:
    """The TypeError of a hot method called with keywords `unknown` it does not take."""
    where = func.__qualname__
    valid = [n for n in (keywords_of(func) or ()) if n != HOT]
    return unexpected_keyword(where, next(iter(unknown)), valid)


HOT = "unknown"  # the name of a hot method's catch-all: it checks its keywords itself


def _is_hot(func: Callable) -> bool:
    try:
        params = inspect.signature(func, follow_wrapped=False).parameters
    except (TypeError, ValueError):
        return False
    p = params.get(HOT)
    return p is not None and p.kind is inspect.Parameter.VAR_KEYWORD


def _hide_hot(func: Callable) -> Callable:
    """A hot method as it is shown: its signature without the catch-all."""
    sig = inspect.signature(func)
    func.__strict__ = True  # type: ignore[attr-defined]
    func.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[p for p in sig.parameters.values() if p.name != HOT]
    )
    return func


def strict(func: Callable[..., T]) -> Callable[..., T]:
    """`func`, whose unknown keywords raise TypeError naming the nearest valid one."""
    if getattr(func, "__strict__", False):
        return func
    if _is_hot(func):
        return _hide_hot(func)

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> T:
        try:
            return func(*args, **kwargs)
        except TypeError:
            better = explain(func, kwargs)
            if better is None:
                raise
            raise better from None

    call.__strict__ = True  # type: ignore[attr-defined]
    return call


def strict_class(cls: type[T]) -> type[T]:
    """Make every public method of `cls` (and of its subclasses, as they are defined)
    strict: one decoration covers the methods added to it later."""
    _wrap_methods(cls)
    previous = cls.__dict__.get("__init_subclass__")

    def __init_subclass__(sub, **kw):  # noqa: N807 - the hook's own name
        if previous is not None:
            previous.__func__(sub, **kw)
        else:
            super(cls, sub).__init_subclass__(**kw)
        _wrap_methods(sub)

    cls.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]
    return cls


def _wrap_methods(cls: type) -> None:
    for name, value in list(vars(cls).items()):
        if name.startswith("_") and name not in ("__init__", "__new__", "__call__"):
            continue
        if isinstance(value, staticmethod):
            setattr(cls, name, staticmethod(strict(value.__func__)))
        elif isinstance(value, classmethod):
            setattr(cls, name, classmethod(strict(value.__func__)))
        elif inspect.isfunction(value):
            setattr(cls, name, strict(value))

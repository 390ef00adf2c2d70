"""A structural fingerprint of a Fusion: the same text for two fusions built
by the same definition, in any process, and a different one when anything
the compile reads differs (an op, a constant, a dtype, an extent, a
contiguity or stride order, an alias, ...).

It walks the fusion's object graph (every attribute of every object reached,
as ``copy.deepcopy`` would copy it) and writes each object as its type and
attributes, an object reached again as a back-reference to its first visit.
Process-wide counters (an IterDomain's ``id``) are left out, so the text does
not depend on what else the process built; the order of a set is its
elements' texts, sorted. The compile driver keys its disk cache of finished
kernels with it (:mod:`circbuf.compiler`).

>>> import circbuf as cb
>>> def build():
...     with cb.FusionDefinition() as fd:
...         fd.add_output(fd.ops.exp(fd.define_tensor([-1])))
...     return fd.fusion
>>> fingerprint(build()) == fingerprint(build())
True
"""

from __future__ import annotations

import hashlib
from enum import Enum
from types import BuiltinFunctionType, FunctionType, MethodType

# attributes that say nothing about what is compiled: a process-wide counter
# (IterDomain.id), and the count of schedule() calls (the overrides themselves
# are keyed by the compile driver)
_SKIP = frozenset({"id", "schedule_version", "schedule_overrides"})


class Unfingerprintable(TypeError):
    """The graph holds an object the walk cannot write deterministically."""


def _slots(t) -> tuple:
    names = []
    for c in t.__mro__:
        s = c.__dict__.get("__slots__", ())
        names += [s] if isinstance(s, str) else list(s)
    return tuple(sorted(set(names) - {"__dict__", "__weakref__"}))


def fingerprint(root) -> str:
    """The walk's text for ``root``, hashed (sha256, hex)."""
    h = hashlib.sha256()
    for piece in _walk(root, {}):
        h.update(piece.encode())
        h.update(b"\0")
    return h.hexdigest()


def _walk(root, memo: dict):
    """The tokens of ``root``'s object graph, depth first (an explicit stack:
    a fusion's chains of exprs are deeper than Python's recursion limit)."""
    keep = []  # objects memoized by id stay alive until the walk ends
    stack = [root]
    slots_of: dict = {}
    while stack:
        x = stack.pop()
        t = type(x)
        if t is _End:
            yield x.text
            continue
        if x is None or t is bool or t is int or t is str or t is bytes:
            yield f"{t.__name__}:{x!r}"
            continue
        if t is float:
            yield f"float:{x!r}"  # repr round-trips every float (nan, inf included)
            continue
        if isinstance(x, Enum):
            yield f"enum:{t.__module__}.{t.__qualname__}.{x.name}"
            continue
        if t in (FunctionType, BuiltinFunctionType, MethodType) or isinstance(x, type):
            yield f"fn:{getattr(x, '__module__', '')}.{getattr(x, '__qualname__', repr(x))}"
            continue
        k = id(x)
        if k in memo:
            yield f"@{memo[k]}"
            continue
        memo[k] = len(memo)
        keep.append(x)
        if t is list or t is tuple:
            yield f"{t.__name__}[{len(x)}"
            stack.append(_END)
            stack.extend(reversed(x))
            continue
        if t is dict:
            yield f"dict[{len(x)}"
            stack.append(_END)
            for key, v in reversed(list(x.items())):
                stack.append(v)
                stack.append(key)
            continue
        if t is set or t is frozenset:
            texts = []
            for v in x:
                if type(v) not in (bool, int, str, float, bytes) and not isinstance(v, Enum):
                    raise Unfingerprintable(f"a set of {type(v).__name__}")
                texts.append(next(_walk(v, {})))
            yield f"{t.__name__}[{','.join(sorted(texts))}]"
            continue
        names = slots_of.get(t)
        if names is None:
            names = slots_of[t] = _slots(t)
        d = getattr(x, "__dict__", None)
        items = [(n, getattr(x, n)) for n in names if n not in _SKIP and hasattr(x, n)]
        if d is not None:
            items += sorted((n, v) for n, v in d.items() if n not in _SKIP)
        if not items and d is None and not names:
            raise Unfingerprintable(f"an object of type {t.__qualname__} with no attributes to write")
        yield f"obj:{t.__module__}.{t.__qualname__}[{len(items)}"
        stack.append(_END)
        for n, v in reversed(items):
            stack.append(v)
            stack.append(_End(f".{n}"))


class _End:
    __slots__ = ("text",)

    def __init__(self, text):
        self.text = text


_END = _End("]")

__all__ = ["fingerprint", "Unfingerprintable"]

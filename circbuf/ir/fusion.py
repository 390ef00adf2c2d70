"""The Fusion: a DAG of Exprs over TensorViews, with inputs and outputs.

>>> # f = Fusion(); ...; print(f.print_math())
"""

from __future__ import annotations

import warnings

from .errors import CircbufError
from .iterdomain import transforms_behind
from .nodes import ELEMENTWISE, Expr, MemoryType, TensorView
from .scalar import Scalar, Var


class Fusion:
    """Owns TensorViews (named T0, T1, ... in creation order), inputs, outputs,
    symbolic extents and the equalities between them found while defining."""

    def __init__(self):
        self.inputs: list = []  # TensorViews and scalar Vars
        self.outputs: list[TensorView] = []
        self.tvs: list[TensorView] = []
        self.extent_vars: list[Var] = []
        # (a, b): the user promised these symbolic extents are equal (checked at run time)
        self.extent_equalities: list[tuple[Scalar, Scalar]] = []
        self.equality_reasons: dict[tuple[str, str], str] = {}  # (a, b) -> what requires it
        # what execute returns, in add_output order: ("output", k) is
        # outputs[k]; ("input", k) is inputs[k] itself, returned unchanged;
        # ("view", k) is input_views[k]: (j, tv), tv a reshape/squeeze of
        # inputs[j], returned as a view of it (no kernel, no copy)
        self.returns: list[tuple[str, int]] = []
        self.input_views: list[tuple[int, TensorView]] = []
        # outputs[k] is written in place into inputs[aliases[k]] (add_output(alias_input=))
        self.aliases: dict[int, int] = {}
        # extent name -> the expression it stands for (a reshape's -1 or computed sizes)
        self.derived_extents: dict[str, Scalar] = {}
        self.schedule_overrides: dict = {}
        # set by the frontend: overrides -> (overrides, deprecation notes), raising on
        # names no scheduler of this fusion takes (the ir cannot ask the schedulers)
        self.check_overrides = None
        self.schedule_version = 0
        # CTAs per SM the schedule's grid counts on being resident (0: none);
        # lowering turns it into __launch_bounds__(threads, n), capping registers
        self.launch_min_blocks = 0
        self._caches_added = False
        self._tv_counter = 0

    def clone(self) -> Fusion:
        """A deep copy (schedulers transform a copy). Copying a DAG recurses
        along its longest chain of exprs, which passes Python's default
        recursion limit at about 40 ops; the limit is raised for the copy.

        >>> # f2 = fd.fusion.clone(); f2 is not fd.fusion
        """
        import copy
        import sys

        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, 200_000))
        try:
            return copy.deepcopy(self)
        finally:
            sys.setrecursionlimit(old)

    @property
    def manual_schedule(self) -> bool:
        """True once the user transformed, parallelized, inlined or cached any
        tensor: then the fusion is lowered as scheduled, without heuristics."""
        from .iterdomain import ParallelType

        if self._caches_added:
            return True
        for tv in self.tvs:
            if tv.compute_at_pos or tv.loop != tv.logical:
                return True
            if any(i.parallel_type != ParallelType.Serial for i in tv.loop):
                return True
        return False

    def register(self, tv: TensorView) -> TensorView:
        tv.fusion = self
        tv.name = f"T{self._tv_counter}"
        self._tv_counter += 1
        self.tvs.append(tv)
        return tv

    def new_extent(self) -> Var:
        v = Var(f"i{len(self.extent_vars)}", lo=1)  # kernels never run on empty tensors
        self.extent_vars.append(v)
        return v

    def require_equal(self, a: Scalar, b: Scalar, reason: str) -> None:
        """Extents ``a`` and ``b`` must be equal at run time, because of ``reason``
        (named in the error when they are not; the first reason given for a
        pair stays: the one the user's own op gave)."""
        self.extent_equalities.append((a, b))
        self.equality_reasons.setdefault((str(a), str(b)), reason)

    def derived_extent(self, expr: Scalar) -> Var:
        """A new extent name for ``expr`` (e.g. a reshape's ``-1``): tensors
        carry the name, so axes of one size compare equal; the runtime
        computes its value from ``expr``."""
        v = self.new_extent()
        self.derived_extents[v.name] = expr
        return v

    def add_input(self, x):
        if isinstance(x, TensorView):
            x.is_input = True
        self.inputs.append(x)

    def add_output(self, tv: TensorView, alias_input: TensorView | None = None):
        """Make ``tv`` an output. A fusion input returned as an output is
        returned as is (the same tensor, as nvFuser does), not copied; a
        tensor added twice is returned twice.

        ``alias_input``: write ``tv`` in place into that input (running
        statistics, optimizer updates) and do not return it, as nvFuser
        does; adding ``tv`` again without it returns the updated input.

        >>> # fd.add_output(fd.ops.add(rm, d), alias_input=rm)   # rm += d
        """
        if not isinstance(tv, TensorView):
            raise CircbufError(f"add_output: fusion outputs are tensors; {tv} is a scalar")
        if tv.fusion is not self:
            raise CircbufError(f"add_output: {tv.name} is not a tensor of this fusion")
        if alias_input is not None:
            self._alias(tv, alias_input)
            return
        if tv.is_input:
            self.returns.append(("input", self.inputs.index(tv)))
            return
        src = _viewed_input(tv)
        if src is not None and self.inputs.index(src) not in self.aliases.values():
            # as nvFuser: an alias of the input, not a kernel's copy (unless the fusion
            # also writes that input in place: then the view would show the new values)
            self.input_views.append((self.inputs.index(src), tv))
            self.returns.append(("view", len(self.input_views) - 1))
            return
        self.returns.append(("output", self._kernel_output(tv)))

    def _kernel_output(self, tv: TensorView) -> int:
        """Make ``tv`` an output the kernels write; its position in ``outputs``."""
        if tv not in self.outputs:
            tv.memory_type = MemoryType.Global
            if tv.domain.stride_order is None:
                tv.domain.stride_order = _elementwise_layout(tv)
            self.outputs.append(tv)
        return self.outputs.index(tv)

    def _alias(self, tv: TensorView, x: TensorView):
        what = f"add_output({tv.name}, alias_input={getattr(x, 'name', x)})"
        if not isinstance(x, TensorView) or x.fusion is not self or not x.is_input:
            raise CircbufError(f"{what}: alias_input must be a tensor input of this fusion")
        if tv.is_input:
            raise CircbufError(f"{what}: {tv.name} is an input; an aliased output is computed")
        if x.dtype != tv.dtype:
            raise CircbufError(
                f"{what}: dtypes differ ({tv.dtype.name} vs {x.dtype.name}); cast {tv.name} to "
                f"{x.dtype.name} first"
            )
        if tv.ndim != x.ndim:
            raise CircbufError(f"{what}: ranks differ ({tv.ndim} vs {x.ndim})")
        k_in = self.inputs.index(x)
        if k_in in self.aliases.values():
            raise CircbufError(f"{what}: {x.name} already receives another output")
        for d, (a, b) in enumerate(zip(tv.domain.no_reductions(), x.logical)):
            if a.is_broadcast and a.expanded_extent is not None and not b.is_broadcast:
                raise CircbufError(
                    f"{what}: axis {d} of {tv.name} is an expanded broadcast; "
                    f"the kernel would write one element of {x.name}'s {b.extent}"
                )
            if a.extent == b.extent:
                continue
            from .scalar import Const

            if isinstance(a.extent, Const) and isinstance(b.extent, Const):
                raise CircbufError(f"{what}: axis {d} has extent {a.extent} vs {b.extent}")
            self.require_equal(b.extent, a.extent, f"{tv.name} written in place into {x.name}")
        if tv not in self.outputs:
            tv.memory_type = MemoryType.Global
            self.outputs.append(tv)
        self.aliases[self.outputs.index(tv)] = k_in
        # views of x returned earlier would show x's new values: the kernels copy them instead
        for r, (kind, k) in enumerate(self.returns):
            if kind == "view" and self.input_views[k][0] == k_in:
                self.returns[r] = ("output", self._kernel_output(self.input_views[k][1]))

    # -------------------------------------------------------- traversal
    def exprs(self) -> list[Expr]:
        """Exprs needed by the outputs, in topological order."""
        order, seen = [], set()

        def visit(tv):
            d = tv.definition
            if d is None or id(d) in seen:
                return
            seen.add(id(d))
            for i in d.tv_inputs():
                visit(i)
            order.append(d)

        for o in self.outputs:
            visit(o)
        return order

    def used_tvs(self) -> list[TensorView]:
        """TensorViews reachable from the outputs, in topological order."""
        out, seen = [], set()
        for e in self.exprs():
            for t in e.tv_inputs() + e.outputs:
                if id(t) not in seen:
                    seen.add(id(t))
                    out.append(t)
        for t in self.outputs:
            if id(t) not in seen:
                out.append(t)
        return out

    def consumers(self, tv: TensorView) -> list[TensorView]:
        live = {id(e) for e in self.exprs()}
        return [e.out for e in tv.uses if id(e) in live]

    # ---------------------------------------------------------- printing
    def print_math(self) -> str:
        """The fusion's math, one expr a line, nvFuser style.

        Returns the text (``print(fd.fusion.print_math())``).
        """
        lines = ["Inputs:"]
        for i in self.inputs:
            lines.append(f"  {i}" if isinstance(i, TensorView) else f"  {i.name}: {i.dtype.short}")
        lines.append("Outputs:")
        for kind, k in self.returns:
            if kind == "output":
                lines.append(f"  {self.outputs[k]}")
            elif kind == "view":
                j, tv = self.input_views[k]
                lines.append(f"  {tv} (a view of input {self.inputs[j].name}, no kernel)")
            else:
                lines.append(f"  {self.inputs[k].name} (input, returned as is)")
        for k, j in self.aliases.items():
            lines.append(f"  {self.outputs[k].name} -> {self.inputs[j].name} (in place, not returned)")
        if self.derived_extents:
            lines.append("Extents:")
            lines += [f"  {name} = {e}" for name, e in self.derived_extents.items()]
        lines.append("")
        lines.append("%kernel_math {")
        lines += [f"  {e}" for e in self.exprs()]
        lines.append("}")
        return "\n".join(lines)

    def print_transforms(self) -> str:
        """Each TensorView with the splits and merges behind its loop domain."""
        lines = []
        for tv in self.used_tvs():
            lines.append(str(tv))
            for t in transform_history(tv):
                lines.append(f"  {t}")
        return "\n".join(lines)

    def schedule(self, **overrides):
        """Record overrides of the scheduler heuristics (``persistent``, ``stages``,
        ``vectorize``, ``unroll``, ``threads``, ...). They are applied when the
        fusion is compiled, where bad values raise. A name no scheduler of the
        fusion takes raises here (for a fusion of a FusionDefinition; else at
        compile); a deprecated name warns and is renamed.

        >>> import circbuf as cb
        >>> with cb.FusionDefinition() as fd:
        ...     fd.add_output(fd.ops.exp(fd.define_tensor([-1])))
        >>> print(fd.fusion.schedule(vectorize=4))
        ScheduleOverrides(vectorize=4)
        """
        if self.check_overrides is not None:
            overrides, notes = self.check_overrides(self, overrides)
            for note in notes:
                warnings.warn(note, DeprecationWarning, stacklevel=2)
        self.schedule_overrides = dict(overrides)
        self.schedule_version += 1  # launch plans made under older overrides are not reused
        return ScheduleRequest(self.schedule_overrides)

    def __str__(self):
        return self.print_math()


def _elementwise_layout(tv: TensorView):
    """The stride order an output inherits from the inputs it is computed
    from elementwise (as torch keeps channels-last through pointwise ops and
    nvFuser infers allocation orders): that of every input of ``tv``'s rank
    reached through elementwise exprs only, when they agree and are not
    row-major; else None (row-major)."""
    orders, todo, seen = set(), [tv], set()
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.is_input:
            if t.ndim == tv.ndim:
                orders.add(tuple(t.domain.stride_order) if t.domain.stride_order is not None else None)
            continue
        d = t.definition
        if isinstance(d, ELEMENTWISE):
            todo += [x for x in d.tv_inputs() if x.ndim == tv.ndim]
    if len(orders) == 1 and None not in orders:
        return list(orders.pop())
    return None


class ScheduleRequest(dict):
    """What ``fusion.schedule`` recorded; printed as the overrides."""

    def __str__(self):
        body = ", ".join(f"{k}={v!r}" for k, v in self.items())
        return f"ScheduleOverrides({body})"


def transform_history(tv: TensorView) -> list:
    """Split/Merge records from the logical to the loop domain, in order."""
    return transforms_behind(tv.loop)


def _viewed_input(tv: TensorView):
    """The fusion input ``tv`` is a reshape, squeeze or unsqueeze of (ops
    that keep the row-major order of elements, so ``tv`` is that input
    reshaped), or None."""
    from .nodes import BroadcastOp, ReshapeOp, SqueezeOp

    while tv.definition is not None:
        e = tv.definition
        if not isinstance(e, (BroadcastOp, ReshapeOp, SqueezeOp)):
            return None
        if any(i.is_broadcast and i.expanded_extent is not None for i in tv.logical):
            return None  # an expanded broadcast repeats elements: not a reshape
        tv = e.tv_inputs()[0]
    return tv if tv.is_input else None

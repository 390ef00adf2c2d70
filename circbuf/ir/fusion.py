"""The Fusion: a DAG of Exprs over TensorViews, with inputs and outputs.

>>> # f = Fusion(); ...; print(f.print_math())
"""

from __future__ import annotations

import warnings

from .errors import CircbufError
from .nodes import Expr, MemoryType, TensorView
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
        # extents no input tensor has: name -> a scalar expression of the
        # scalar inputs (``full([n, 4], ...)`` with ``n`` a fusion scalar)
        self.extent_definitions: dict[str, Scalar] = {}
        # what execute returns, in add_output order: ("output", k) is
        # outputs[k]; ("input", k) is inputs[k] itself, returned unchanged
        self.returns: list[tuple[str, int]] = []
        self.schedule_overrides: dict = {}
        # set by the frontend: overrides -> (overrides, deprecation notes), raising on
        # names no scheduler of this fusion takes (the ir cannot ask the schedulers)
        self.check_overrides = None
        self.schedule_version = 0
        self._caches_added = False
        self._tv_counter = 0

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

    def add_input(self, x):
        if isinstance(x, TensorView):
            x.is_input = True
        self.inputs.append(x)

    def add_output(self, tv: TensorView):
        """Make ``tv`` an output. A fusion input returned as an output is
        returned as is (the same tensor, as nvFuser does), not copied."""
        if not isinstance(tv, TensorView):
            raise CircbufError(f"add_output: fusion outputs are tensors; {tv} is a scalar")
        if tv.fusion is not self:
            raise CircbufError(f"add_output: {tv.name} is not a tensor of this fusion")
        if tv.is_input:
            self.returns.append(("input", self.inputs.index(tv)))
            return
        if tv in self.outputs:
            raise CircbufError(f"add_output: {tv.name} is already an output")
        tv.memory_type = MemoryType.Global
        self.outputs.append(tv)
        self.returns.append(("output", len(self.outputs) - 1))

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
            lines.append(
                f"  {self.outputs[k]}"
                if kind == "output"
                else f"  {self.inputs[k].name} (input, returned as is)"
            )
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


class ScheduleRequest(dict):
    """What ``fusion.schedule`` recorded; printed as the overrides."""

    def __str__(self):
        body = ", ".join(f"{k}={v!r}" for k, v in self.items())
        return f"ScheduleOverrides({body})"


def transform_history(tv: TensorView) -> list:
    """Split/Merge records from the logical to the loop domain, in order."""
    seen, out = set(), []

    def visit(i):
        d = i.definition
        if d is None or id(d) in seen:
            return
        for x in d.inputs:
            visit(x)
        seen.add(id(d))
        out.append(d)

    for i in tv.loop:
        visit(i)
    return out

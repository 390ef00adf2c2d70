"""Randomized differential test of circbuf (issue 16).

Each case is a random fusion of the ops in README's "Supported ops" table on
random inputs (dtypes, shapes with extents 0, 1 and primes, symbolic and fixed
extents, layouts: contiguous, transposed, stride-0 expanded, sliced, offset by
one element), sometimes with outputs written in place (``alias_input``) and
random ``fd.fusion.schedule(...)`` overrides. The generator evaluates every
step on the actual input values with torch in float64 (int64 for integers) as
it goes and drops steps whose values would make the comparison meaningless
(overflow, a division by zero, a comparison or rounding within rounding error
of its edge), so the reference at the end is the expected result.

A case is reproducible from ``(seed, index, profile)`` and prints as Python
source (``Case.source()``) to paste into a bug report.

Modes:

- ``cpu-compile``: build and ``fd.compile(cpu_inputs, arch="sm_90a")`` (NVRTC, no GPU);
- ``interp``: run the kernels in the package's interpreter (``circbuf.interpret``)
  on the CPU, TMA rings, mbarriers and wgmma included, and compare (each output
  element must be stored exactly once);
- ``cuda``: ``fd.execute`` on GPU tensors, outputs NaN-poisoned, compared.

Outcomes: ``ok``; ``refused`` (a CircbufError that is a documented refusal, by
message); ``bug:lowering-check`` (a CircbufError raised in circbuf/lowering or
circbuf/ir while compiling a fusion nobody scheduled by hand); ``bug:internal``
(any other exception); ``bug:nvrtc`` (generated code NVRTC rejects);
``bug:dtype`` (a result dtype unlike README's rules); ``bug:mismatch`` (wrong
values, NaN where the reference has none); ``skip:*`` (not runnable in the mode).

    python -m tests.fuzz --mode cpu-compile --n 300 --seed 0
    python -m tests.fuzz --mode interp --n 50
    python -m tests.fuzz --mode cpu-compile --case 0:17 --show 1   # one case, its source
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import time
import traceback
import zlib
from dataclasses import dataclass, field

import torch

os.environ.setdefault("CIRCBUF_POISON_OUTPUTS", "1")

import circbuf as cb  # noqa: E402
from tests.util import TORCH  # noqa: E402  (DataType -> torch dtype)

D = cb.DataType
FLOATS = (D.Float, D.Double, D.Half, D.BFloat16)
INTS = (D.Int32, D.Int64)
# comparison tolerance of the least precise floating type a case computes in
TOL = {D.BFloat16: 1.6e-2, D.Half: 2e-3, D.Float: 2e-5, D.Double: 1e-12}
TF32_TOL = 1e-3  # an fp32 matmul on TF32 tensor cores (10 mantissa bits read of each operand)
EXTENTS = (0, 1, 1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 32, 33, 64, 127, 128, 257)
BIG = 1 << 16  # most elements a case's base shape has
INTERP_MAX = 1 << 11  # the interpreter runs every thread in Python: small cases only


# ------------------------------------------------------------------ dtype rules (README)
def compute_type(dt):
    return D.Float if dt in (D.Half, D.BFloat16) else dt


def _kind(dt):
    return 2 if dt in FLOATS else 1 if dt in INTS else 0


def promote(a, b):
    """torch's promotion of two tensor dtypes, written again here on purpose: the
    judge checks circbuf's dtypes (ir/dtype.py) against README's rules, not
    against themselves."""
    if a == b:
        return a
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        return a if ka > kb else b
    if ka == 2:
        return D.Double if D.Double in (a, b) else D.Float
    return D.Int64 if ka == 1 else D.Bool


def promote_scalar(t, s):
    """A Python number does not widen a tensor of its own kind (torch)."""
    sk = 2 if isinstance(s, float) else 0 if isinstance(s, bool) else 1
    if sk > _kind(t):
        return D.Float if sk == 2 else D.Int64
    return t


def to_float(dt):
    """README's "Float": Double stays Double, every other type gives Float."""
    return D.Double if dt == D.Double else D.Float


# ------------------------------------------------------------------ values
@dataclass
class Val:
    """A value of the fusion: its reference (float64 / int64 / bool), dtype,
    which axes circbuf sees as broadcast, and whether it is exact (inputs,
    selections, integer math) or carries rounding error."""

    name: str
    dtype: object
    ref: torch.Tensor
    bcast: tuple
    exact: bool = True

    @property
    def shape(self):
        return tuple(self.ref.shape)


def ref_of(t: torch.Tensor, dt):
    """A tensor's values as the reference holds them."""
    if dt in FLOATS:
        return t.detach().cpu().double()
    if dt in INTS:
        return t.detach().cpu().long()
    return t.detach().cpu().bool()


def round_to(r: torch.Tensor, dt):
    """The reference rounded to ``dt`` as a result of that dtype is stored."""
    if dt in (D.Half, D.BFloat16, D.Float):
        return r.to(TORCH[dt]).double()
    if dt == D.Double:
        return r.double()
    if dt in INTS:
        return r.long() if not r.is_floating_point() else r.trunc().long()
    return r != 0 if r.dtype != torch.bool else r


class Reject(Exception):
    """A step the generator drops (values make it meaningless)."""


@dataclass
class Ref:
    """A reference to a value of the fusion in a step's arguments."""

    name: str

    def __repr__(self):
        return self.name


@dataclass
class DT:
    dtype: object

    def __repr__(self):
        return f"D.{self.dtype.name}"


@dataclass
class InputSpec:
    name: str
    dtype: object
    define: list  # define_tensor's shape: -1, 1 or fixed extents
    base_shape: tuple  # the storage the view is taken of
    view: tuple  # ("contig",) ("permute", inv) ("expand", shape) ("slice", d, n) ("pad", n) ("offset", shape)
    kind: str  # value distribution
    contiguity: list | None = None


@dataclass
class Case:
    seed: int
    index: int
    profile: str
    inputs: list = field(default_factory=list)
    steps: list = field(default_factory=list)  # (outs tuple, op, args, kwargs)
    outputs: list = field(default_factory=list)  # (name, alias input name or None)
    overrides: dict | None = None
    vals: dict = field(default_factory=dict)
    base: list = field(default_factory=list)  # input storages (CPU), in input order
    has_matmul: bool = False
    numel: int = 0
    tf32: bool = False  # run with torch's TF32 switch on (a case with an fp32 matmul, half of them)

    # ---------------------------------------------------------- inputs
    def input_tensors(self, device="cpu"):
        # copies: an input written in place must not change the reference (a view of it, say)
        return [_apply_view(b.to(device, copy=True), s.view) for b, s in zip(self.base, self.inputs)]

    # ---------------------------------------------------------- building
    def build(self, overrides=None):
        """The FusionDefinition, and for each step the dtypes circbuf gave
        its results (checked against README's rules by :func:`check_dtypes`)."""
        env, got = {}, {}
        with cb.FusionDefinition() as fd:
            for s in self.inputs:
                env[s.name] = fd.define_tensor(s.define, contiguity=s.contiguity, dtype=s.dtype)
            for outs, op, args, kwargs in self.steps:
                res = getattr(fd.ops, op)(*_resolve(args, env), **_resolve(kwargs, env))
                res = res if isinstance(res, tuple) else (res,)
                for n, r in zip(outs, res):
                    env[n] = r
                    got[n] = r.dtype
            for n, alias in self.outputs:
                fd.add_output(env[n], alias_input=env[alias] if alias else None)
        ov = self.overrides if overrides is None else overrides
        if ov:
            fd.fusion.schedule(**ov)
        return fd, got

    def check_dtypes(self, got):
        for n, dt in got.items():
            if dt != self.vals[n].dtype:
                return f"{n} is {dt.name}, README's rules give {self.vals[n].dtype.name}"
        return None

    # ---------------------------------------------------------- printing
    def source(self):
        L = [
            f"# circbuf fuzz case seed={self.seed} index={self.index} profile={self.profile}",
            f"# (python -m tests.fuzz --case {self.seed}:{self.index} --profile {self.profile} --show 1)",
            "import torch",
            "import circbuf as cb",
            "D = cb.DataType",
        ]
        if self.tf32:
            L.append("torch.backends.cuda.matmul.allow_tf32 = True  # the fp32 matmul on TF32 tensor cores")
        L.append("with cb.FusionDefinition() as fd:")
        for s in self.inputs:
            c = f", contiguity={s.contiguity}" if s.contiguity is not None else ""
            L.append(f"    {s.name} = fd.define_tensor({s.define}{c}, dtype=D.{s.dtype.name})")
        for outs, op, args, kwargs in self.steps:
            a = ", ".join([repr(x) for x in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
            L.append(f"    {', '.join(outs)} = fd.ops.{op}({a})")
        for n, alias in self.outputs:
            L.append(f"    fd.add_output({n}{f', alias_input={alias}' if alias else ''})")
        if self.overrides:
            L.append(f"fd.fusion.schedule({', '.join(f'{k}={v!r}' for k, v in self.overrides.items())})")
        L.append("inputs = [")
        for s in self.inputs:
            L.append(f"    {_view_source(s)},")
        L.append("]")
        L.append('ck = fd.compile(inputs, arch="sm_90a")  # or: fd.execute([x.cuda() for x in inputs])')
        return "\n".join(L)


def _resolve(x, env):
    if isinstance(x, Ref):
        return env[x.name]
    if isinstance(x, DT):
        return x.dtype
    if isinstance(x, list):
        return [_resolve(y, env) for y in x]
    if isinstance(x, dict):
        return {k: _resolve(v, env) for k, v in x.items()}
    return x


def _apply_view(b, view):
    k = view[0]
    if k == "contig":
        return b
    if k == "permute":
        return b.permute(view[1])
    if k == "expand":
        return b.expand(view[1])
    if k == "slice":  # every other element of axis d, from the second: an odd storage offset
        return b[(slice(None),) * view[1] + (slice(1, None, 2),)]
    if k == "pad":  # the last axis narrowed: rows not 16-byte multiples
        return b[..., : view[1]]
    if k == "offset":  # storage offset of one element
        return b[1:].view(view[1])
    raise ValueError(view)


def _view_source(s: InputSpec):
    dt = f"torch.{str(TORCH[s.dtype]).split('.')[-1]}"
    shape = list(s.base_shape)
    if s.dtype == D.Bool:
        mk = f"torch.rand({shape}) > 0.5"
        mk = f"({mk})"
    elif s.dtype in INTS:
        mk = f"torch.randint(-9, 10, {shape}, dtype={dt})"
    else:
        mk = f"torch.randn({shape}, dtype={dt})"
    v = s.view
    if v[0] == "contig":
        return mk
    if v[0] == "permute":
        return f"{mk}.permute({list(v[1])})"
    if v[0] == "expand":
        return f"{mk}.expand({list(v[1])})"
    if v[0] == "slice":
        return f"{mk}[{', '.join([':'] * v[1] + ['1::2'])}]"
    if v[0] == "pad":
        return f"{mk}[..., :{v[1]}]"
    return f"{mk}[1:].view({list(v[1])})"


# ------------------------------------------------------------------ ops the generator knows
FLOAT_UNARY = {  # name: (torch fn, domain check or None)
    "exp": (torch.exp, lambda x: x.abs().max() < 15),
    "exp2": (torch.exp2, lambda x: x.abs().max() < 20),
    "log": (torch.log, lambda x: x.min() > 0.05),
    "sqrt": (torch.sqrt, lambda x: x.min() >= 0),
    "rsqrt": (torch.rsqrt, lambda x: x.min() > 0.05),
    "reciprocal": (torch.reciprocal, lambda x: x.abs().min() > 0.05),
    "tanh": (torch.tanh, None),
    "sigmoid": (torch.sigmoid, None),
    "gelu": (torch.nn.functional.gelu, None),
    "silu": (torch.nn.functional.silu, None),
    "sin": (torch.sin, lambda x: x.abs().max() < 100),
    "cos": (torch.cos, lambda x: x.abs().max() < 100),
    "atan": (torch.atan, None),
    "asinh": (torch.asinh, None),
    "erf": (torch.erf, None),
    "erfc": (torch.erfc, None),
    "log1p": (torch.log1p, lambda x: x.min() > -0.9),
    "expm1": (torch.expm1, lambda x: x.abs().max() < 15),
    "log2": (torch.log2, lambda x: x.min() > 0.05),
    "lgamma": (torch.lgamma, lambda x: x.min() > 0.1),
}
ROUNDING = {"floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc}
PREDICATES = {
    "isnan": torch.isnan,
    "isinf": torch.isinf,
    "isfinite": torch.isfinite,
    "signbit": torch.signbit,
}
ARITH = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
}
COMPARE = {"lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne}
BITWISE = {"bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor}
# ops the interp profile draws (small, quick cases)
INTERP_OPS = {
    "neg", "abs", "exp", "exp2", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "relu", "gelu", "silu",
    "add", "sub", "mul", "div", "maximum", "minimum", "lt", "le", "gt", "ge", "eq", "ne", "where", "cast", "set",
    "sum", "max", "min", "mean", "var", "var_mean", "softmax", "layer_norm", "rms_norm", "addcmul",
    "broadcast", "broadcast_in_dim", "expand", "reshape", "permute", "squeeze", "stride_order",
}  # fmt: skip


class Gen:
    """Builds one case step by step, evaluating the reference as it goes."""

    def __init__(self, seed, index, profile="full"):
        self.c = Case(seed, index, profile)
        key = zlib.crc32(f"{seed}:{index}:{profile}".encode())
        self.r = random.Random(key)
        self.g = torch.Generator().manual_seed(key)
        self.n = 0
        self.pool: list[Val] = []
        self.interp = profile == "interp"

    # ------------------------------------------------------------ naming
    def _name(self, p="t"):
        self.n += 1
        return f"{p}{self.n}"

    # ------------------------------------------------------------ inputs
    def rand_dtype(self, floats_only=False):
        r = self.r.random()
        if floats_only or r < 0.7:
            return self.r.choice((D.Float, D.Float, D.BFloat16, D.Half, D.Double))
        return self.r.choice((D.Int32, D.Int64, D.Bool)) if r < 0.95 else D.Bool

    def new_input(self, shape, dtype, bcast=None, kind=None, layout=None, symbolic=None):
        """An input of logical ``shape`` (``bcast[k]``: axis defined as a broadcast 1)."""
        r = self.r
        shape = tuple(shape)
        bcast = tuple(bcast) if bcast is not None else tuple(False for _ in shape)
        name = self._name("x")
        define = []
        for e, b in zip(shape, bcast):
            if b:
                define.append(1)
            elif e == 1 or (symbolic if symbolic is not None else r.random() < 0.7):
                define.append(-1)  # an extent-1 axis not meant to broadcast is symbolic
            else:
                define.append(e)
        if kind is None:
            kind = r.choice(("signed", "nonzero", "small")) if dtype in INTS else "normal"
        # the layout: the storage allocated and the view taken of it
        rank = len(shape)
        layouts = ["contig"] * 4 + ["offset"]
        if rank >= 2:
            layouts += ["permute"] * 2
        if rank >= 1 and any(e > 1 for e, b in zip(shape, bcast) if not b):
            layouts += ["expand", "slice", "pad"]
        lay = layout or r.choice(layouts)
        base_shape, view, gen_shape = shape, ("contig",), shape
        if lay == "permute":
            perm = list(range(rank))
            while perm == list(range(rank)):
                r.shuffle(perm)
            base_shape = tuple(shape[p] for p in perm)
            inv = [perm.index(k) for k in range(rank)]
            view = ("permute", tuple(inv))
            gen_shape = base_shape
        elif lay == "expand":
            ax = [k for k, e in enumerate(shape) if e > 1 and not bcast[k]]
            chosen = r.sample(ax, r.randint(1, len(ax)))
            base_shape = tuple(1 if k in chosen else e for k, e in enumerate(shape))
            view = ("expand", tuple(shape))
            gen_shape = base_shape
        elif lay == "slice":
            d = r.choice([k for k, e in enumerate(shape) if e > 1 and not bcast[k]])
            base_shape = tuple(2 * e if k == d else e for k, e in enumerate(shape))
            view = ("slice", d, shape[d])
            gen_shape = base_shape
        elif lay == "pad" and shape[-1] > 0:
            base_shape = shape[:-1] + (shape[-1] + r.choice((1, 3)),)
            view = ("pad", shape[-1])
            gen_shape = base_shape
        elif lay == "offset":
            n = math.prod(shape)
            base_shape = (n + 1,)
            view = ("offset", shape)
            gen_shape = base_shape
        else:
            lay = "contig"
        base = self._values(gen_shape, dtype, kind)
        spec = InputSpec(name, dtype, define, tuple(base_shape), view, kind)
        if r.random() < 0.1 and lay == "contig":
            spec.contiguity = [True if not b else None for b in bcast]
        self.c.inputs.append(spec)
        self.c.base.append(base)
        t = _apply_view(base, view)
        v = Val(name, dtype, ref_of(t, dtype), bcast, True)
        self.c.vals[name] = v
        self.pool.append(v)
        return v

    def _values(self, shape, dtype, kind):
        g = self.g
        if dtype == D.Bool:
            return torch.rand(shape, generator=g) > 0.5
        if dtype in INTS:
            if kind == "small":
                x = torch.randint(0, 8, shape, generator=g)
            elif kind == "nonzero":
                x = torch.randint(1, 10, shape, generator=g) * (
                    torch.randint(0, 2, shape, generator=g) * 2 - 1
                )
            else:
                x = torch.randint(-20, 21, shape, generator=g)
            return x.to(TORCH[dtype])
        return (torch.randn(shape, generator=g, dtype=torch.float64) * self.r.choice((1.0, 1.0, 3.0))).to(
            TORCH[dtype]
        )

    # ------------------------------------------------------------ steps
    def add(self, op, args, kwargs, results):
        """Record a step whose results (Vals without names) were computed."""
        if self.interp and op not in INTERP_OPS:
            raise Reject("the interpreter lacks it")
        outs = []
        for v in results:
            v.name = self._name()
            self._check_val(v)
        for v in results:
            self.c.vals[v.name] = v
            self.pool.append(v)
            outs.append(v.name)
        self.c.steps.append((tuple(outs), op, args, kwargs))
        return results

    def _check_val(self, v: Val):
        r = v.ref
        if r.numel() == 0:
            return
        if v.dtype in FLOATS:
            if not torch.isfinite(r).all():
                raise Reject("non-finite")
            lim = 6e4 if v.dtype in (D.Half, D.BFloat16) else 1e6
            if r.abs().max() > lim:
                raise Reject("too large")
        elif v.dtype == D.Int32 and r.abs().max() >= 1 << 24:
            raise Reject("int32 overflow risk")
        elif v.dtype == D.Int64 and r.abs().max() >= 1 << 40:
            raise Reject("int64 overflow risk")

    # ------------------------------------------------------------ helpers
    def pick(self, pred=lambda v: True, recent=True):
        c = [v for v in self.pool if pred(v)]
        if not c:
            return None
        if recent and self.r.random() < 0.6:
            return c[-1]
        return self.r.choice(c)

    def compatible(self, a: Val, b: Val):
        """Can circbuf combine these elementwise (torch broadcasting where a
        broadcast axis meets an extent, equal extents otherwise)?"""
        for k in range(1, min(a.ref.dim(), b.ref.dim()) + 1):
            ea, eb = a.shape[-k], b.shape[-k]
            ba, bb = a.bcast[-k], b.bcast[-k]
            if ba or bb:
                if not ((ba and ea == 1) or (bb and eb == 1)):
                    if ea != eb:
                        return False
            elif ea != eb:
                return False
        return True

    def out_bcast(self, vals):
        rank = max(v.ref.dim() for v in vals)
        out = []
        for k in range(rank):
            fl = []
            for v in vals:
                j = k - (rank - v.ref.dim())
                if j >= 0:
                    fl.append(v.bcast[j] and v.shape[j] == 1)
            out.append(all(fl))
        return tuple(out)

    def operand_like(self, a: Val, dtype=None, kind=None):
        """Another operand for an elementwise op with ``a``: a compatible pool
        value, a Python number, or a new input of a's shape (some axes broadcast)."""
        r = self.r
        x = r.random()
        if x < 0.35:
            b = self.pick(
                lambda v: v is not a and self.compatible(a, v) and (dtype is None or v.dtype == dtype)
            )
            if b is not None:
                return b
        if x < 0.55 and kind is None:
            dt = dtype or a.dtype
            if dt in FLOATS:
                return r.choice((0.5, 2.0, -1.5, 3.0, 1e-3))
            if dt in INTS:
                return r.choice((2, 3, -1, 7))
            return r.choice((True, False))
        shape = list(a.shape)
        bc = [False] * len(shape)
        for k in range(len(shape)):
            if r.random() < 0.25:
                shape[k], bc[k] = 1, True
        drop = r.randint(0, len(shape)) if r.random() < 0.2 else 0
        return self.new_input(shape[drop:], dtype or self.rand_dtype(), bc[drop:], kind=kind)

    def ensure_positive(self, a: Val, lo=0.1):
        """``abs(a) + lo``, when a's values leave a domain."""
        (b,) = self.add("abs", [Ref(a.name)], {}, [self._unary_val("abs", a)])
        ref = b.ref + lo
        dt = promote_scalar(b.dtype, lo)
        return self.add(
            "add",
            [Ref(b.name), lo],
            {},
            [Val("", compute_type(dt), round_to(ref, compute_type(dt)), b.bcast, False)],
        )[0]

    def _unary_val(self, op, a):
        dt = compute_type(a.dtype)
        fn = {"neg": torch.neg, "abs": torch.abs, "relu": torch.relu}[op]
        return Val("", dt, fn(a.ref), a.bcast, a.exact)

    # ------------------------------------------------------------ op families
    def step(self):
        r = self.r
        fam = r.choices(
            ("unary", "binary", "ternary", "reduce", "view", "norm", "cast"),
            weights=(20, 30, 6, 12, 14, 5, 6),
        )[0]
        getattr(self, "s_" + fam)()

    def s_unary(self):
        r = self.r
        a = self.pick()
        choice = r.choices(("float", "keep", "round", "pred", "bnot"), weights=(10, 4, 2, 1, 1))[0]
        if choice == "float":
            op = r.choice(sorted(FLOAT_UNARY))
            fn, dom = FLOAT_UNARY[op]
            if a.dtype == D.Bool or (a.dtype in INTS and op in ("lgamma",)):
                a = self.pick(lambda v: v.dtype in FLOATS) or a
            if dom is not None and a.ref.numel() and not dom(a.ref.double()):
                if op in ("exp", "exp2", "expm1", "sin", "cos"):
                    raise Reject("domain")
                a = self.ensure_positive(a, 0.5 if op != "log1p" else 0.1)
            dt = to_float(compute_type(a.dtype)) if a.dtype in FLOATS else D.Float
            ref = round_to(fn(a.ref.double()), dt)
            self.add(op, [Ref(a.name)], {}, [Val("", dt, ref, a.bcast, False)])
        elif choice == "keep":
            op = r.choice(("neg", "abs", "relu"))
            if a.dtype == D.Bool:
                raise Reject("bool")
            self.add(op, [Ref(a.name)], {}, [self._unary_val(op, a)])
        elif choice == "round":
            op = r.choice(sorted(ROUNDING))
            if a.dtype == D.Bool:
                raise Reject("bool")
            if a.dtype in FLOATS:
                x = a.ref
                if not a.exact and x.numel() and _near(x - torch.floor(x), (0.0, 0.5, 1.0)):
                    raise Reject("edge")
                ref = ROUNDING[op](x)
            else:
                ref = a.ref
            self.add(op, [Ref(a.name)], {}, [Val("", compute_type(a.dtype), ref, a.bcast, a.exact)])
        elif choice == "pred":
            op = r.choice(sorted(PREDICATES))
            if op == "signbit" and not a.exact and a.ref.numel() and _near(a.ref, (0.0,)):
                raise Reject("edge")
            ref = PREDICATES[op](a.ref) if a.dtype != D.Bool else PREDICATES[op](a.ref.double())
            self.add(op, [Ref(a.name)], {}, [Val("", D.Bool, ref, a.bcast, True)])
        else:
            a = self.pick(lambda v: v.dtype not in FLOATS)
            if a is None:
                raise Reject("no int")
            ref = ~a.ref if a.dtype != D.Bool else ~a.ref
            self.add("bitwise_not", [Ref(a.name)], {}, [Val("", a.dtype, ref, a.bcast, True)])

    def s_cast(self):
        a = self.pick()
        dt = self.rand_dtype()
        if a.dtype in FLOATS and dt in INTS:
            x = a.ref
            if x.numel() and (
                x.abs().max() > 1e6 or (not a.exact and _near(x - torch.trunc(x), (0.0, 1.0, -1.0)))
            ):
                raise Reject("edge")
        if a.dtype in FLOATS and dt == D.Bool and not a.exact and a.ref.numel() and _near(a.ref, (0.0,)):
            raise Reject("edge")
        ref = round_to(a.ref, dt)
        exact = a.exact and (dt not in FLOATS or _wider(dt, a.dtype))
        if dt == a.dtype and self.r.random() < 0.3:
            self.add("set", [Ref(a.name)], {}, [Val("", dt, ref, a.bcast, exact)])
        else:
            self.add("cast", [Ref(a.name), DT(dt)], {}, [Val("", dt, ref, a.bcast, exact)])

    def s_binary(self):
        r = self.r
        a = self.pick()
        fam = r.choices(("arith", "div", "compare", "bitwise", "shift", "misc"), weights=(10, 4, 4, 2, 1, 3))[
            0
        ]
        if fam == "arith":
            op = r.choice(sorted(ARITH))
            b = self.operand_like(a)
            self._binary(op, a, b, ARITH[op])
        elif fam == "div":
            op = r.choice(("div", "truediv", "fmod", "remainder", "mod"))
            if a.dtype == D.Bool:
                raise Reject("bool")
            b = self.operand_like(a, kind="nonzero" if r.random() < 0.7 else None)
            self._binary(op, a, b, None)
        elif fam == "compare":
            op = r.choice(sorted(COMPARE))
            b = self.operand_like(a)
            self._binary(op, a, b, COMPARE[op], compare=True)
        elif fam == "bitwise":
            a = self.pick(lambda v: v.dtype not in FLOATS)
            if a is None:
                raise Reject("no int")
            op = r.choice(sorted(BITWISE))
            b = self.operand_like(a, dtype=a.dtype if r.random() < 0.5 else None)
            if _dt(b) in FLOATS:
                raise Reject("float")
            self._binary(op, a, b, BITWISE[op])
        elif fam == "shift":
            a = self.pick(lambda v: v.dtype in INTS)
            if a is None:
                raise Reject("no int")
            op = r.choice(("bitwise_left_shift", "bitwise_right_shift", "logical_right_shift"))
            b = self.operand_like(a, dtype=a.dtype, kind="small")
            self._binary(op, a, b, None)
        else:
            op = r.choice(("pow", "atan2", "gcd"))
            if op == "gcd":
                a = self.pick(lambda v: v.dtype in INTS)
                if a is None:
                    raise Reject("no int")
                b = self.operand_like(a, dtype=a.dtype)
            else:
                if a.dtype == D.Bool:
                    raise Reject("bool")
                b = self.operand_like(a, kind="small") if op == "pow" else self.operand_like(a)
            self._binary(op, a, b, None)

    def _binary(self, op, a: Val, b, fn, compare=False):
        if isinstance(b, Val) and not self.compatible(a, b):
            raise Reject("shapes")
        if self.r.random() < 0.15 and not isinstance(b, Val) and op not in ("gcd",) and "shift" not in op:
            a, b = b, a  # a number on the left
        va = a if isinstance(a, Val) else None
        vb = b if isinstance(b, Val) else None
        tv = [v for v in (va, vb) if v is not None]
        dt = tv[0].dtype
        for v in tv[1:]:
            dt = promote(dt, v.dtype)
        for x in (a, b):
            if not isinstance(x, Val):
                dt = promote_scalar(dt, x)
        if op in ("truediv", "atan2") and dt not in FLOATS:
            dt = D.Float
        if op in ("bitwise_and", "bitwise_or", "bitwise_xor", "gcd") or "shift" in op:
            if dt in FLOATS:
                raise Reject("float")
        if op in ("pow", "fmod", "remainder", "mod") and dt == D.Bool:
            raise Reject("bool")
        cdt = compute_type(dt)
        xa = va.ref if va is not None else a
        xb = vb.ref if vb is not None else b
        # operands in the compute type
        if cdt in FLOATS:
            xa = xa.double() if isinstance(xa, torch.Tensor) else float(xa)
            xb = xb.double() if isinstance(xb, torch.Tensor) else float(xb)
        elif cdt in INTS:
            xa = xa.long() if isinstance(xa, torch.Tensor) else int(xa)
            xb = xb.long() if isinstance(xb, torch.Tensor) else int(xb)
        exact = all(v.exact for v in tv) and cdt not in FLOATS
        ta = xa if isinstance(xa, torch.Tensor) else _scalar_tensor(xa)
        tb = xb if isinstance(xb, torch.Tensor) else _scalar_tensor(xb)
        if op in ("div", "fmod", "remainder", "mod", "truediv"):
            if (
                tb.numel() and (tb == 0).any()
                if cdt not in FLOATS
                else tb.numel() and (tb.abs() < 0.05).any()
            ):
                raise Reject("div by ~0")
            if op == "truediv" or (op == "div" and cdt in FLOATS):
                ref = ta / tb
            elif op == "div":
                ref = torch.div(ta, tb, rounding_mode="trunc")
            elif op == "remainder":
                ref = torch.remainder(ta, tb)
            else:
                ref = torch.fmod(ta, tb)
            if cdt in FLOATS and op in ("fmod", "remainder", "mod"):
                q = ta / tb
                if q.numel() and _near(q - torch.floor(q), (0.0, 1.0), 1e-4):
                    raise Reject("edge")
        elif op == "pow":
            if cdt in FLOATS:
                if ta.numel() and (ta <= 0.05).any():
                    raise Reject("domain")
                if tb.numel() and tb.abs().max() > 4:
                    raise Reject("domain")
            elif tb.numel() and ((tb < 0).any() or tb.max() > 4):
                raise Reject("domain")
            ref = torch.pow(ta, tb)
        elif op == "atan2":
            ref = torch.atan2(ta.double(), tb.double())
            if ref.numel() and _near(tb.double().expand_as(ref).abs(), (0.0,), 1e-3):
                raise Reject("edge")
        elif op == "gcd":
            ref = torch.gcd(ta, tb)
        elif op in ("bitwise_left_shift", "bitwise_right_shift", "logical_right_shift"):
            if tb.numel() and ((tb < 0).any() or tb.max() >= 8):
                raise Reject("shift")
            if op == "bitwise_left_shift":
                ref = torch.bitwise_left_shift(ta, tb)
            elif op == "bitwise_right_shift":
                ref = torch.bitwise_right_shift(ta, tb)
            else:
                bits = 32 if cdt == D.Int32 else 64
                ta2, tb2 = torch.broadcast_tensors(ta, tb)
                vals = [
                    ((int(x) % (1 << bits)) >> int(s))
                    for x, s in zip(ta2.flatten().tolist(), tb2.flatten().tolist())
                ]
                vals = [v - (1 << bits) if v >= 1 << (bits - 1) else v for v in vals]
                ref = torch.tensor(vals, dtype=torch.long).reshape(ta2.shape)
        else:
            if compare and cdt in FLOATS and not exact and not (va and va.exact and (vb is None or vb.exact)):
                d = (ta - tb).abs()
                if d.numel() and ((d > 0) & (d < 1e-3 * (1 + ta.abs() + tb.abs()))).any():
                    raise Reject("edge")
            if compare and cdt in FLOATS:
                d = (ta - tb).abs()
                if (
                    d.numel()
                    and ((d > 0) & (d < 1e-3 * (1 + ta.abs() + tb.abs()))).any()
                    and not (all(v.exact for v in tv))
                ):
                    raise Reject("edge")
            ref = fn(ta, tb)
        rdt = D.Bool if compare else cdt
        if rdt == D.Bool:
            ref = ref.bool()
        else:
            ref = round_to(ref, rdt)
        exact = all(v.exact for v in tv) and (rdt not in FLOATS or op in ("maximum", "minimum"))
        bc = self.out_bcast(tv)
        ref = ref.expand(_bshape(tv)) if ref.dim() < len(bc) else ref
        self.add(
            op, [Ref(x.name) if isinstance(x, Val) else x for x in (a, b)], {}, [Val("", rdt, ref, bc, exact)]
        )

    def s_ternary(self):
        r = self.r
        if r.random() < 0.6:
            c = self.pick(lambda v: v.dtype == D.Bool)
            if c is None:
                a = self.pick()
                if a.dtype == D.Bool:
                    c = a
                else:
                    b = self.operand_like(a)
                    self._binary("gt", a, b, torch.gt, compare=True)
                    c = self.pool[-1]
            a = self.operand_like(c, dtype=self.rand_dtype())
            b = self.operand_like(c, dtype=_dt(a) if r.random() < 0.5 and isinstance(a, Val) else None)
            vs = [x for x in (c, a, b) if isinstance(x, Val)]
            for x in vs:
                for y in vs:
                    if not self.compatible(x, y):
                        raise Reject("shapes")
            tvs = [x for x in (a, b) if isinstance(x, Val)]
            if tvs:
                dt = tvs[0].dtype
                for v in tvs[1:]:
                    dt = promote(dt, v.dtype)
                for x in (a, b):
                    if not isinstance(x, Val):
                        dt = promote_scalar(dt, x)
            else:  # two scalars: their own promoted type (Python float Double, int Int64; nvFuser)
                kinds = [
                    D.Double if isinstance(x, float) else D.Bool if isinstance(x, bool) else D.Int64
                    for x in (a, b)
                ]
                dt = promote(*kinds)
            xa = a.ref if isinstance(a, Val) else _scalar_tensor(a)
            xb = b.ref if isinstance(b, Val) else _scalar_tensor(b)
            cref = c.ref
            ref = torch.where(
                cref,
                round_to(xa, dt) if dt in FLOATS else xa.to(round_to(xa, dt).dtype),
                round_to(xb, dt) if dt in FLOATS else xb.to(round_to(xb, dt).dtype),
            )
            ref = round_to(ref, dt)
            exact = all(v.exact for v in vs)
            bc = self.out_bcast(vs)
            self.add(
                "where",
                [Ref(x.name) if isinstance(x, Val) else x for x in (c, a, b)],
                {},
                [Val("", dt, ref.expand(_bshape(vs)), bc, exact)],
            )
        else:
            a = self.pick(lambda v: v.dtype != D.Bool)
            if a is None:
                raise Reject("none")
            t1 = self.operand_like(a, dtype=a.dtype if r.random() < 0.5 else None)
            t2 = self.operand_like(a)
            xs = [a, t1, t2]
            if not all(isinstance(x, Val) for x in xs):
                raise Reject("scalars")
            for x in xs:
                for y in xs:
                    if not self.compatible(x, y):
                        raise Reject("shapes")
            dt = a.dtype
            for v in xs[1:]:
                dt = promote(dt, v.dtype)
            dt = compute_type(dt)
            if dt == D.Bool:
                raise Reject("bool")
            value = r.choice((0.5, 2.0, -1.0)) if dt in FLOATS else r.choice((2, -1, 3))
            conv = (lambda t: t.double()) if dt in FLOATS else (lambda t: t.long())
            ref = conv(a.ref) + value * conv(t1.ref) * conv(t2.ref)
            ref = round_to(ref, dt)
            self.add(
                "addcmul",
                [Ref(a.name), Ref(t1.name), Ref(t2.name), value],
                {},
                [Val("", dt, ref.expand(_bshape(xs)), self.out_bcast(xs), dt not in FLOATS)],
            )

    def s_reduce(self):
        r = self.r
        a = self.pick(lambda v: v.ref.dim() >= 1)
        if a is None:
            raise Reject("rank 0")
        n = a.ref.dim()
        dims = sorted(r.sample(range(n), r.randint(1, n)))
        if r.random() < 0.2:
            dims = [d - n for d in dims]  # negative dims
        pos = [d % n for d in dims]
        keep = r.random() < 0.3
        op = r.choice(("sum", "sum", "prod", "max", "min", "mean", "var", "var_mean"))
        x = a.ref
        bc = tuple((True if keep else None) if k in pos else a.bcast[k] for k in range(n))
        bc = tuple(b for b in bc if b is not None)
        kw = {"keepdim": True} if keep else {}
        if op in ("sum", "prod"):
            dt = compute_type(a.dtype)
            if dt not in FLOATS:
                dt = D.Int64
            xx = x.double() if dt in FLOATS else x.long()
            if op == "sum":
                ref = xx.sum(pos, keepdim=keep)
            else:
                ref = xx
                for d in sorted(pos, reverse=True):
                    ref = ref.prod(d, keepdim=True)
                if not keep:
                    ref = ref.squeeze(pos) if pos else ref
                # (partial products in any order stay small too: an fp32 running product
                # that overflows to inf before a zero factor is NaN, float64's 0; 834:10)
                cnt = math.prod(x.shape[d] for d in pos) if pos else 1
                top = float(xx.abs().clamp(min=1).amax()) if xx.numel() else 1.0
                big = cnt * math.log(top) > math.log(1e4)  # (NaN-free: a NaN top compares False)
                if dt in FLOATS and ref.numel() and (ref.abs().max() > 1e4 or big):
                    raise Reject("prod")
            exact = a.exact and dt not in FLOATS
        elif op in ("max", "min"):
            dt = compute_type(a.dtype)
            try:
                ref = (x.amax if op == "max" else x.amin)(pos, keepdim=keep)
            except (RuntimeError, IndexError) as e:  # torch: no identity for max of nothing
                raise Reject("max of nothing") from e
            exact = a.exact
        elif op == "mean":
            dt = to_float(compute_type(a.dtype)) if a.dtype in FLOATS else D.Float
            if (
                math.prod(x.shape[d] for d in pos) == 0
                and x.numel() == 0
                and math.prod(e for k, e in enumerate(x.shape) if k not in pos) > 0
            ):
                raise Reject("mean of nothing")
            ref = x.double().mean(pos, keepdim=keep) if x.numel() else x.double().sum(pos, keepdim=keep)
            exact = False
        else:
            dt = to_float(compute_type(a.dtype)) if a.dtype in FLOATS else D.Float
            corr = r.choice((0, 1, 1))
            cnt = math.prod(x.shape[d] for d in pos)
            if cnt - corr <= 0 and math.prod(e for k, e in enumerate(x.shape) if k not in pos) > 0:
                raise Reject("var of too few")
            xd = x.double()
            if x.numel():
                var = xd.var(pos, correction=corr, keepdim=keep)
                mean = xd.mean(pos, keepdim=keep)
            else:
                var = mean = xd.sum(pos, keepdim=keep)
            if corr != 1:
                kw["correction"] = corr
            if op == "var":
                self.add("var", [Ref(a.name), dims], kw, [Val("", dt, round_to(var, dt), bc, False)])
            else:
                self.add(
                    "var_mean",
                    [Ref(a.name), dims],
                    kw,
                    [Val("", dt, round_to(var, dt), bc, False), Val("", dt, round_to(mean, dt), bc, False)],
                )
            return
        self.add(op, [Ref(a.name), dims], kw, [Val("", dt, round_to(ref, dt), bc, exact)])

    def s_view(self):
        r = self.r
        op = r.choice(
            (
                "broadcast",
                "broadcast_in_dim",
                "expand",
                "reshape",
                "reshape",
                "permute",
                "permute",
                "squeeze",
                "set",
                "stride_order",
            )
        )
        a = self.pick()
        n = a.ref.dim()
        if op == "broadcast":
            flags = [False] * n
            for _ in range(r.randint(1, 2)):
                flags.insert(r.randint(0, len(flags)), True)
            it = iter(range(n))
            shape, bc = [], []
            for f in flags:
                if f:
                    shape.append(1), bc.append(True)
                else:
                    k = next(it)
                    shape.append(a.shape[k]), bc.append(a.bcast[k])
            self.add(
                op, [Ref(a.name), flags], {}, [Val("", a.dtype, a.ref.reshape(shape), tuple(bc), a.exact)]
            )
        elif op == "broadcast_in_dim":
            m = n + r.randint(0, 2)
            bdims = sorted(r.sample(range(m), n))
            shape, out_shape, bc = [], [], []
            it = iter(range(n))
            for k in range(m):
                if k in bdims:
                    j = next(it)
                    shape.append(-1), out_shape.append(a.shape[j]), bc.append(a.bcast[j])
                else:
                    e = r.choice((1, 1, r.choice(EXTENTS[3:10])))
                    shape.append(e), out_shape.append(e), bc.append(e == 1)
            view = a.ref.reshape([a.shape[bdims.index(k)] if k in bdims else 1 for k in range(m)])
            self.add(
                op,
                [Ref(a.name), shape, bdims],
                {},
                [Val("", a.dtype, view.expand(out_shape), tuple(bc), a.exact)],
            )
        elif op == "expand":
            ax = [k for k in range(n) if a.bcast[k] and a.shape[k] == 1]
            if not ax:
                raise Reject("nothing to expand")
            shape = [-1] * n
            out = list(a.shape)
            for k in ax:
                if r.random() < 0.8:
                    shape[k] = out[k] = r.choice(EXTENTS[3:12])
            bc = tuple(a.bcast[k] and shape[k] == -1 for k in range(n))
            self.add(op, [Ref(a.name), shape], {}, [Val("", a.dtype, a.ref.expand(out), bc, a.exact)])
        elif op == "reshape":
            new = _reshape_target(r, list(a.shape))
            if new is None:
                raise Reject("reshape")
            given = list(new)
            if r.random() < 0.4 and 0 not in new and len(new) > 0:
                given[r.randrange(len(new))] = -1
            self.add(
                op,
                [Ref(a.name), given],
                {},
                [Val("", a.dtype, a.ref.reshape(new), tuple(e == 1 for e in new), a.exact)],
            )
        elif op == "permute":
            if n < 2:
                raise Reject("rank")
            perm = list(range(n))
            r.shuffle(perm)
            self.add(
                op,
                [Ref(a.name), perm],
                {},
                [Val("", a.dtype, a.ref.permute(perm), tuple(a.bcast[p] for p in perm), a.exact)],
            )
        elif op == "squeeze":
            ones = [k for k in range(n) if a.shape[k] == 1]
            if not ones:
                raise Reject("no 1")
            dims = sorted(r.sample(ones, r.randint(1, len(ones))))
            keep = [k for k in range(n) if k not in dims]
            self.add(
                op,
                [Ref(a.name), dims],
                {},
                [
                    Val(
                        "",
                        a.dtype,
                        a.ref.reshape([a.shape[k] for k in keep]),
                        tuple(a.bcast[k] for k in keep),
                        a.exact,
                    )
                ],
            )
        elif op == "set":
            self.add(op, [Ref(a.name)], {}, [Val("", a.dtype, a.ref, a.bcast, a.exact)])
        else:
            order = list(range(n))
            r.shuffle(order)
            self.add(op, [Ref(a.name), order], {}, [Val("", a.dtype, a.ref, a.bcast, a.exact)])

    def s_norm(self):
        r = self.r
        a = self.pick(lambda v: v.dtype in FLOATS and v.ref.dim() >= 1 and v.shape[-1] > 0)
        if a is None:
            raise Reject("none")
        op = r.choice(("softmax", "layer_norm", "rms_norm"))
        x = a.ref
        if op == "softmax":
            dim = r.randrange(-x.dim(), x.dim())
            if x.shape[dim] == 0:
                raise Reject("empty")
            ref = round_to(torch.softmax(x, dim), a.dtype)
            self.add(op, [Ref(a.name), dim], {}, [Val("", a.dtype, ref, a.bcast, False)])
            return
        k = 2 if x.dim() >= 2 and r.random() < 0.25 else 1
        nshape = list(x.shape[-k:])
        if math.prod(nshape) == 0:
            raise Reject("empty")
        w = self.new_input(nshape, a.dtype, layout="contig") if r.random() < 0.8 else None
        eps = r.choice((1e-5, 1e-6, 0.1))
        wr = w.ref if w is not None else None
        if op == "layer_norm":
            b = (
                self.new_input(nshape, a.dtype, layout="contig")
                if w is not None and r.random() < 0.7
                else None
            )
            ref = torch.nn.functional.layer_norm(x, nshape, wr, b.ref if b else None, eps)
            args = [Ref(a.name), Ref(w.name) if w else None, Ref(b.name) if b else None, eps]
            if w is None:
                args.append(k)
        else:
            dims = list(range(x.dim() - (k if w is not None else 1), x.dim()))
            ref = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
            if w is not None:
                ref = ref * wr
            args = [Ref(a.name), Ref(w.name) if w else None, eps]
        if x.numel() and (x - x.mean(-1, keepdim=True)).abs().amax(-1).min() < 1e-3 and op == "layer_norm":
            raise Reject("constant rows")
        self.add(op, args, {}, [Val("", a.dtype, round_to(ref, a.dtype), a.bcast, False)])

    # ------------------------------------------------------------ the case
    def generate(self):
        r = self.r
        c = self.c
        if not self.interp and r.random() < 0.06:
            self._matmul_start()
        else:
            rank = r.choices((0, 1, 2, 3, 4), weights=(1, 4, 8, 5, 2))[0]
            while True:
                shape = [r.choice(EXTENTS) for _ in range(rank)]
                if r.random() < 0.8:
                    shape = [e if e != 0 else r.choice(EXTENTS[1:]) for e in shape]
                if math.prod(shape) <= (INTERP_MAX if self.interp else BIG):
                    break
            self.new_input(shape, self.rand_dtype(), symbolic=r.random() < 0.7 if r.random() < 0.5 else None)
        nsteps = r.randint(1, 8)
        tries = 0
        while len(c.steps) < nsteps and tries < 60:
            tries += 1
            ninputs, nvals, nsteps0 = len(c.inputs), dict(c.vals), len(c.steps)
            pool0, base0 = list(self.pool), list(c.base)
            try:
                self.step()
            except (Reject, RuntimeError):  # RuntimeError: torch refuses it (bool - bool)
                # undo what the failed step added (inputs and helper steps)
                del c.inputs[ninputs:]
                c.base[:] = base0
                c.vals = nvals
                del c.steps[nsteps0:]
                self.pool = pool0
        computed = [v for v in self.pool if v.name.startswith("t")]
        if not computed:
            a = self.pool[0]
            self.add("set", [Ref(a.name)], {}, [Val("", a.dtype, a.ref, a.bcast, a.exact)])
            computed = [self.pool[-1]]
        outs = [computed[-1]]
        for v in computed[:-1]:
            if r.random() < 0.2 and len(outs) < 3:
                outs.append(v)
        c.outputs = [(v.name, None) for v in outs]
        if r.random() < 0.15:
            self._alias()
        if self.interp:
            c.profile = "interp"
        if r.random() < 0.25:
            self._overrides()
        c.numel = max(v.ref.numel() for v in c.vals.values())
        return c

    def _matmul_start(self):
        r, c = self.r, self.c
        c.has_matmul = True
        dt = r.choice((D.BFloat16, D.Half, D.BFloat16, D.Float))
        if dt == D.Float:  # (a stream of its own: the cases' other draws stay as they were)
            c.tf32 = random.Random(zlib.crc32(f"{c.seed}:{c.index}:tf32".encode())).random() < 0.5
        M, N, K = (r.choice((1, 7, 16, 33, 64, 128, 130)) for _ in range(3))
        # K = 0 (a fill) or K defined as a broadcast 1 (an outer product), in a stream of
        # its own (as tf32: the cases' other draws stay as they were)
        edge = random.Random(zlib.crc32(f"{c.seed}:{c.index}:edge k".encode())).random()
        K = 0 if edge < 0.1 else 1 if edge < 0.2 else K
        kb = edge >= 0.1 and edge < 0.2
        if r.random() < 0.5:
            # linear(x, x), the Gram matrix x @ x.T, in a stream of its own (as tf32)
            gram = random.Random(zlib.crc32(f"{c.seed}:{c.index}:gram".encode())).random() < 0.3
            a = self.new_input(
                [M, K], dt, bcast=(False, kb), layout=r.choice(("contig", "contig", "permute"))
            )
            w = (
                a
                if gram
                else self.new_input([N, K], dt, bcast=(False, kb), layout=r.choice(("contig", "permute")))
            )
            N = M if gram else N
            bias = self.new_input([N], dt, layout="contig") if r.random() < 0.5 else None
            ref = _tf32(a.ref, c) @ _tf32(w.ref, c).T + (bias.ref if bias else 0)
            args = [Ref(a.name), Ref(w.name)] + ([Ref(bias.name)] if bias else [])
            self.add("linear", args, {}, [Val("", dt, round_to(ref, dt), (False, False), False)])
        else:
            batch = [r.choice((2, 3))] if r.random() < 0.3 else []
            a = self.new_input(
                batch + [M, K],
                dt,
                bcast=[False] * len(batch) + [False, kb],
                layout=r.choice(("contig", "permute")),
            )
            b = self.new_input([K, N], dt, bcast=(kb, False), layout=r.choice(("contig", "permute")))
            ref = _tf32(a.ref, c) @ _tf32(b.ref, c)
            self.add(
                "matmul",
                [Ref(a.name), Ref(b.name)],
                {},
                [Val("", dt, round_to(ref, dt), tuple(False for _ in ref.shape), False)],
            )

    def _alias(self):
        """Write one result in place into an input of its shape and dtype."""
        r, c = self.r, self.c
        cands = [s for s in c.inputs if s.view[0] != "expand" and s.dtype != D.Bool]
        if not cands:
            return
        s = r.choice(cands)
        x = c.vals[s.name]
        if r.random() < 0.6 or not any(v.shape == x.shape and v.name.startswith("t") for v in self.pool):
            # an elementwise update of x (as a running-statistics update)
            try:
                b = self.operand_like(x, dtype=x.dtype)
                self._binary("add", x, b, torch.add)
            except Reject:
                return
            v = self.pool[-1]
        else:
            v = r.choice([v for v in self.pool if v.shape == x.shape and v.name.startswith("t")])
        if v.shape != x.shape:
            return
        if v.dtype != x.dtype:
            self.add(
                "cast",
                [Ref(v.name), DT(x.dtype)],
                {},
                [Val("", x.dtype, round_to(v.ref, x.dtype), v.bcast, v.exact)],
            )
            v = self.pool[-1]
        c.outputs.append((v.name, s.name))

    def _overrides(self):
        from circbuf.scheduler.registry import SCHEDULERS, candidates

        r, c = self.r, self.c
        try:
            fd, _ = c.build(overrides={})
            scheds = candidates(fd.fusion)
        except Exception:  # noqa: BLE001 - the case's own run classifies it
            scheds = SCHEDULERS[-1:]
        names = sorted(set().union(*(set(a) for _, a in scheds)))
        if self.interp:
            names = [
                n for n in names if n in ("vectorize", "unroll", "threads", "rows", "blocks_per_sm", "cols")
            ]
        if not names:
            return
        ov = {}
        for n in r.sample(names, min(len(names), r.randint(1, 3))):
            ov[n] = r.choice(OVERRIDE_VALUES.get(n, (None,)))
        c.overrides = ov


OVERRIDE_VALUES = {
    "vectorize": (1, 2, 4, 8),
    "unroll": (1, 2, 4),
    "threads": (32, 64, 128, 256, 512),
    "stages": (2, 3, 4),
    "prefetch": (1, 2),
    "tma": (True, False),
    "war": ("block_sync", "mbarrier"),
    "warp_specialized": (True, False),
    "tile_rows": (8, 16, 32),
    "tma_store": (True, False),
    "rows": (1, 2, 4),
    "rows_in_registers": (True, False),
    "blocks_per_sm": (1, 2),
    "staging": ("registers", "tma"),
    "cols": (32, 64, 128),
    "persistent": (True, False),
    "pingpong": (True, False),
    "tile": ((128, 128, 64), (128, 256, 64), (64, 128, 64)),
    "cluster": ((1, 1),),
    "raster": ("M", "N"),
    "group": (1, 4, 8),
    "registers": ((40, 232),),
    "epilogue_tile": ((64, 64), (64, 32)),
    "epilogue": ("inline", "role"),
    "split_k": (1, 2, 3, 4),  # (more than the k steps: refused by name)
    "split_k_sum": ("kernel", "reduction"),
}


def _dt(x):
    return (
        x.dtype
        if isinstance(x, Val)
        else D.Float
        if isinstance(x, float)
        else D.Bool
        if isinstance(x, bool)
        else D.Int64
    )


def _bshape(vals):
    return torch.broadcast_shapes(*[v.shape for v in vals])


def _wider(to, frm):
    order = {D.BFloat16: 0, D.Half: 0, D.Float: 1, D.Double: 2}
    if frm not in FLOATS:
        return to == D.Double or frm == D.Bool
    return order[to] >= order[frm] and not (to in (D.Half, D.BFloat16) and to != frm)


def _scalar_tensor(v):
    """A Python number as a 0-dim reference tensor in float64 / int64 / bool
    (``torch.tensor(0.001)`` would round it to float32 first)."""
    if isinstance(v, bool):
        return torch.tensor(v)
    if isinstance(v, int):
        return torch.tensor(v, dtype=torch.int64)
    return torch.tensor(float(v), dtype=torch.float64)


def _near(x, edges, tol=1e-3):
    x = x.double()
    return any(((x - e).abs() < tol * (1 + x.abs())).any() for e in edges)


def _reshape_target(r, shape):
    """A new shape of the same element count by merging or splitting axes."""
    shape = list(shape)
    for _ in range(r.randint(1, 2)):
        if len(shape) >= 2 and r.random() < 0.5:
            k = r.randrange(len(shape) - 1)
            shape[k : k + 2] = [shape[k] * shape[k + 1]]
        else:
            if not shape:
                shape = [1]
                continue
            k = r.randrange(len(shape))
            e = shape[k]
            fs = [f for f in range(1, e + 1) if e % f == 0] if e > 0 else [1]
            f = r.choice(fs)
            shape[k : k + 1] = [f, e // f if f else 0]
    return shape if len(shape) <= 5 else None


def _tf32(x, case):
    """``x`` as TF32 tensor cores read it (the low 13 mantissa bits of each fp32
    value dropped) in a case run with TF32 allowed, else itself: the
    reference keeps only the accumulation's error, not TF32's (which
    ops downstream amplify: rsqrt of |x @ w| + 0.5 was off by 2% once, 893:21)."""
    if not case.tf32 or not _EMULATE_TF32:
        return x
    return (x.float().view(torch.int32) & ~0x1FFF).view(torch.float32).double()


# False while :func:`judge` builds a TF32 case's IEEE reference (a path with no TF32 form, the
# FFMA kernel of an N = 1 matmul say, runs the exact fp32 products: 913:19)
_EMULATE_TF32 = True


def make_case(seed, index, profile="full") -> Case:
    return Gen(seed, index, profile).generate()


# ------------------------------------------------------------------ running and judging
def _tolerance(case: Case):
    dts = [v.dtype for v in case.vals.values() if v.dtype in FLOATS]
    if not dts and any(v.dtype in FLOATS for v in case.vals.values()):
        dts = [D.Float]
    t = max((TOL[d] for d in dts), default=TOL[D.Float])
    return 8 * max(t, TF32_TOL if case.tf32 else 0)


def compare(out, v: Val, tol):
    """None when ``out`` matches ``v``'s reference, else what differs."""
    ref = v.ref
    if tuple(out.shape) != tuple(ref.shape):
        return f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    if out.dtype != TORCH[v.dtype]:
        return f"dtype {out.dtype}, expected {TORCH[v.dtype]}"
    o = out.detach().cpu()
    if ref.numel() == 0:
        return None
    if v.dtype not in FLOATS:
        o = o.long() if v.dtype in INTS else o.bool()
        bad = o != ref
        if bad.any():
            i = tuple(int(j) for j in bad.nonzero()[0])
            return f"{int(bad.sum())}/{ref.numel()} wrong, first at {i}: {o[i].item()} != {ref[i].item()}"
        return None
    o = o.double()
    if torch.isnan(o).any():
        i = tuple(int(j) for j in torch.isnan(o).nonzero()[0])
        return f"{int(torch.isnan(o).sum())}/{ref.numel()} NaN (unwritten?), first at {i}"
    scale = max(1.0, float(ref.abs().square().mean().sqrt()))
    bad = (o - ref).abs() > tol * scale + tol * ref.abs()
    if bad.any():
        i = tuple(int(j) for j in bad.nonzero()[0])
        return (
            f"{int(bad.sum())}/{ref.numel()} beyond tol {tol:.1e}, first at {i}: "
            f"{o[i].item():.6g} != {ref[i].item():.6g}"
        )
    return None


def _normalize(msg):
    msg = str(msg).splitlines()[0] if str(msg) else ""
    msg = re.sub(r"\b[Tt]\d+\b", "T#", msg)
    msg = re.sub(r"\b[xts]\d+\b", "v#", msg)
    msg = re.sub(r"\d+", "N", msg)
    return msg[:170]


def _origin(exc):
    """The innermost circbuf (or test-tool) frame of a traceback: file:function."""
    tb = traceback.extract_tb(exc.__traceback__)
    for fr in reversed(tb):
        f = fr.filename.replace(os.sep, "/")
        if "/circbuf/" in f:
            return f[f.rindex("/circbuf/") + 1 :], fr.name, fr.lineno
    return (tb[-1].filename if tb else "?"), (tb[-1].name if tb else "?"), (tb[-1].lineno if tb else 0)


# refusals README documents (its "Limits today", "Views" and "In-place outputs"
# sections, and override values, which "raise a CircbufError naming the rule")
DOCUMENTED = (
    r"combined with a permutation of itself",
    r"combined with a view of itself",  # a reshape of symbolic sizes (README, Views)
    r"joined through a broadcast, but their extents differ",
    r"written in place into",
    r"is written in place \(alias_input\) by a kernel whose inputs need",  # no segment order: named
    r"^schedule\(",
    r"reduces no axis",
    r"must be equal: ",  # input sizes the definition requires equal (symbolic extents that differ)
)


def classify(exc, phase, case=None):
    """(outcome, signature) of an exception raised in ``phase``: a CircbufError
    is a refusal when raised while defining the fusion or for a limit README
    documents; else a bug (lowering check, undocumented refusal)."""
    from circbuf.runtime.nvrtc import CompileError

    f, fn, line = _origin(exc)
    if f.endswith("tests/fuzz.py") or f.endswith("fuzz.py"):
        return "fuzz-error", f"{type(exc).__name__} at {fn}: {_normalize(exc)}"
    if isinstance(exc, CompileError):
        log = str(exc.log or exc).strip().splitlines()
        err = next((x for x in log if "error" in x), log[0] if log else "")
        return "bug:nvrtc", _normalize(err.split(": ", 1)[-1])
    if isinstance(exc, cb.CircbufError) and phase == "run" and f.startswith("circbuf/interpret/"):
        # the kernel misbehaved in the interpreter: out of bounds, an element
        # stored twice or never, a deadlock, or a node it has no semantics for
        msg = str(exc)
        if "has no semantics" in msg:
            return "skip:interp-op", _normalize(msg.split(": ", 1)[-1])
        if "outside its" in msg:
            return "bug:out-of-bounds", _normalize(msg.split(": ", 1)[-1])
        if "stored" in msg and "once per element" in msg:
            return "bug:stores", _normalize(msg.split(": ", 1)[-1])
        return "bug:interp", f"{f}:{fn}: {_normalize(msg.split(': ', 1)[-1])}"
    if isinstance(exc, cb.CircbufError):
        if phase != "define" and (f.startswith("circbuf/lowering/") or f.startswith("circbuf/ir/")):
            return "bug:lowering-check", f"{f}:{fn}: {_normalize(exc)}"
        if phase == "define" or any(re.search(p, str(exc)) for p in DOCUMENTED):
            return "refused", f"{phase}: {_normalize(exc)}"
        return "bug:refusal", f"{f}:{fn}: {_normalize(exc)}"
    return "bug:internal", f"{type(exc).__name__} at {f}:{fn}: {_normalize(exc)}"


@dataclass
class Result:
    case: Case
    outcome: str
    signature: str = ""
    detail: str = ""
    seconds: float = 0.0


def run_case(case: Case, mode: str) -> Result:
    t0 = time.perf_counter()
    switch = torch.backends.cuda.matmul
    switch.allow_tf32 = case.tf32
    try:
        res = _run_case(case, mode)
    finally:
        switch.allow_tf32 = False
    res.seconds = time.perf_counter() - t0
    return res


def _run_case(case, mode):
    overrides = case.overrides
    if mode == "interp":
        if case.numel > INTERP_MAX:
            return Result(case, "skip:too-big")
    try:
        fd, got = case.build(overrides={})
    except Exception as e:  # noqa: BLE001
        o, s = classify(e, "define")
        return Result(case, o, s, traceback.format_exc(limit=-3))
    why = case.check_dtypes(got)
    if why:
        return Result(case, "bug:dtype", _normalize(why).replace("v#", "t#"), why)
    try:
        if overrides:
            fd.fusion.schedule(**overrides)
    except Exception as e:  # noqa: BLE001
        o, s = classify(e, "schedule", case)
        return Result(case, o, s, traceback.format_exc(limit=-3))
    phase = "compile"
    try:
        if mode == "cpu-compile":
            fd.compile(case.input_tensors("cpu"), arch="sm_90a")
            return Result(case, "ok")
        if mode == "interp":
            inputs = case.input_tensors("cpu")
            fd.compile(inputs, arch="sm_90a")
            phase = "run"
            outs = _interp_run(fd, inputs)
        else:
            inputs = case.input_tensors("cuda")
            phase = "run"
            outs = fd.execute(inputs)
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        o, s = classify(e, phase, case)
        return Result(case, o, s, traceback.format_exc(limit=-4))
    return judge(case, inputs, outs)


def judge(case: Case, inputs, outs):
    """The outputs against the case's reference. A TF32 case may have run on
    TF32 tensor cores or, where circbuf's TF32 path declined the shapes, on
    IEEE fp32 (torch's switch allows TF32, it does not require it): it passes
    against either reference."""
    r = _judge(case, inputs, outs)
    if r.outcome != "ok" and case.tf32:
        global _EMULATE_TF32
        _EMULATE_TF32 = False
        try:
            exact = make_case(case.seed, case.index, case.profile)
        finally:
            _EMULATE_TF32 = True
        exact.tf32 = case.tf32
        if _judge(exact, inputs, outs).outcome == "ok":
            return Result(case, "ok")
    return r


def _judge(case: Case, inputs, outs):
    tol = _tolerance(case)
    plain = [n for n, a in case.outputs if a is None]
    if len(outs) != len(plain):
        return Result(
            case, "bug:mismatch", "number of outputs", f"{len(outs)} outputs, expected {len(plain)}"
        )
    for k, (n, o) in enumerate(zip(plain, outs)):
        why = compare(o, case.vals[n], tol)
        if why:
            return Result(
                case, "bug:mismatch", f"output {k}: {_normalize(why).split(',')[0]}", f"output {n}: {why}"
            )
    names = [s.name for s in case.inputs]
    for n, a in case.outputs:
        if a is not None:
            v = case.vals[n]
            why = compare(inputs[names.index(a)], Val(a, v.dtype, v.ref, v.bcast), tol)
            if why:
                return Result(
                    case,
                    "bug:mismatch",
                    f"aliased input: {_normalize(why).split(',')[0]}",
                    f"input {a} written from {n}: {why}",
                )
    aliased = {a for _, a in case.outputs if a}
    for s, t in zip(case.inputs, inputs):
        if s.name not in aliased:
            why = compare(t, case.vals[s.name], 0.0)
            if why:
                return Result(case, "bug:mismatch", "input modified", f"input {s.name} changed: {why}")
    return Result(case, "ok")


def _interp_run(fd, inputs):
    """``fd.execute`` on the CPU: each kernel (of each segment) in circbuf.interpret."""
    from circbuf.interpret import interpret

    return interpret(fd, inputs)


def run(n=100, seed=0, mode="cpu-compile", profile=None, start=0, indices=None, verbose=False, budget=None):
    """Run cases ``start .. start+n-1`` (or ``indices``); returns the Results."""
    profile = profile or ("interp" if mode == "interp" else "full")
    results = []
    t0 = time.perf_counter()
    for i in indices if indices is not None else range(start, start + n):
        if budget is not None and time.perf_counter() - t0 > budget:
            break
        try:
            case = make_case(seed, i, profile)
        except Exception as e:  # noqa: BLE001 - a generator bug must not stop the run
            c = Case(seed, i, profile)
            results.append(Result(c, "fuzz-error", f"{type(e).__name__}: {e}", traceback.format_exc()))
            continue
        res = run_case(case, mode)
        results.append(res)
        if verbose:
            print(f"[{seed}:{i}] {res.outcome} {res.signature} ({res.seconds:.1f}s)", flush=True)
    return results


def summary(results, show=5):
    """The counts per outcome, refusals and bugs by signature, and the
    source of the first ``show`` failing cases (one per signature)."""
    from collections import Counter, defaultdict

    L = [f"cases: {len(results)}"]
    counts = Counter(r.outcome for r in results)
    for o, k in sorted(counts.items()):
        L.append(f"  {o:22s} {k}")
    by = defaultdict(list)
    for r in results:
        if r.outcome != "ok":
            by[(r.outcome, r.signature)].append(r)
    for kind in ("refused", "skip", "bug", "fuzz-error"):
        rows = [(k, v) for k, v in by.items() if k[0].startswith(kind)]
        if not rows:
            continue
        L.append(f"{kind}:")
        for (o, s), rs in sorted(rows, key=lambda kv: -len(kv[1])):
            ids = " ".join(f"{r.case.seed}:{r.case.index}" for r in rs[:6])
            L.append(f"  {len(rs):4d}  {o}  {s}   [{ids}]")
    shown = 0
    for (o, s), rs in by.items():
        if shown >= show or not (o.startswith("bug") or o == "fuzz-error"):
            continue
        shown += 1
        r = min(rs, key=lambda r: (len(r.case.steps), r.case.numel))  # the smallest reproducer
        L.append(f"\n===== {o}: {s}\n{r.detail.rstrip()}\n{r.case.source()}")
    return "\n".join(L)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", type=int, default=0)
    p.add_argument(
        "--mode", "--device", dest="mode", default="cpu-compile", choices=("cpu-compile", "interp", "cuda")
    )
    p.add_argument("--profile", default=None, choices=("full", "interp"))
    p.add_argument("--case", default=None, help="SEED:INDEX: run (and with --show, print) one case")
    p.add_argument("--show", type=int, default=5, help="print the source of this many failing cases")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    if a.case:
        s, i = (int(x) for x in a.case.split(":"))
        res = run(seed=s, mode=a.mode, profile=a.profile, indices=[i], verbose=True)
        print(res[0].detail)
        print(res[0].case.source())
        return 0
    results = run(a.n, a.seed, a.mode, a.profile, a.start, verbose=a.verbose)
    print(summary(results, a.show))
    return int(any(r.outcome.startswith("bug") or r.outcome == "fuzz-error" for r in results))


if __name__ == "__main__":
    raise SystemExit(main())

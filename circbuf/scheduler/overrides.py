"""The ``fd.fusion.schedule(**overrides)`` names: one table per scheduler.

Each :class:`Override` gives a name's type and allowed values (checked at the
``schedule()`` call, and again at compile for a fusion not built by a
FusionDefinition), the variants of its scheduler that use it and a one-line
doc. Rules that depend on the inputs (shared memory, threads per CTA, the
inputs' item size) are checked by the scheduler at compile, in the same words.
Every error names the ``schedule()`` argument and the rule. An override the
chosen variant does not use raises (``registry.compute_params``). The README's
override tables are generated from these (:func:`readme_tables`).

>>> print(NORMALIZATION["rows"].why(0))
schedule(rows=0): must be an int in [1, 32]
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import CircbufError
from ..ir.circular import REGISTERS_RULE


@dataclass(frozen=True)
class Override:
    """One ``schedule()`` name of one scheduler. ``used_by``: the variants that use
    it (``"scheduler:variant"``), or a dict value -> variants where the value picks
    the kernel (``tma=False``: the plain reduction kernel)."""

    name: str
    type: str
    allowed: str
    used_by: tuple | dict
    doc: str
    ok: object = field(repr=False, default=None)  # value -> bool: the type and range rule

    def why(self, v) -> str | None:
        """The error text for value ``v``, or None when the rule allows it."""
        if self.ok(v):
            return None
        return f"schedule({self.name}={v!r}): must be {self.allowed}"

    def check(self, v) -> None:
        why = self.why(v)
        if why:
            raise CircbufError(why)

    def variants(self, v) -> tuple:
        """The variants that use value ``v``."""
        if isinstance(self.used_by, dict):
            return self.used_by.get(v, ())
        return self.used_by

    def used_text(self) -> str:
        """The variants for the README (a declined TMA variant is the plain kernel: left out)."""

        def said(vs):
            return ", ".join(v for v in vs if not v.endswith(":declined")) or "-"

        if isinstance(self.used_by, dict):
            return "; ".join(f"{k!r}: {said(v)}" for k, v in self.used_by.items())
        return said(self.used_by)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # True is an int to Python, not a count


def _int(lo, hi=None, pow2=False, mult=None):
    """(allowed text, rule) of an int in [lo, hi]."""

    def ok(v):
        return (
            _is_int(v)
            and v >= lo
            and (hi is None or v <= hi)
            and (not pow2 or v & (v - 1) == 0)
            and (mult is None or v % mult == 0)
        )

    rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
    kind = "a power of two" if pow2 else f"a multiple of {mult}" if mult else "an int"
    return dict(type="int", allowed=f"{kind} in {rng}" if hi is not None else f"{kind} {rng}", ok=ok)


def _choice(*vals):
    return dict(
        type="str", allowed=" or ".join(repr(v) for v in vals), ok=lambda v: isinstance(v, str) and v in vals
    )


_BOOL = dict(type="bool", allowed="True or False", ok=lambda v: isinstance(v, bool))


def _ints(n, names, lo=1):
    return dict(
        type=f"({', '.join(['int'] * n)})",
        allowed=f"({', '.join(names)}), {'two' if n == 2 else 'three'} ints >= {lo}",
        ok=lambda v: isinstance(v, (tuple, list)) and len(v) == n and all(_is_int(x) and x >= lo for x in v),
    )


def _table(*rows) -> dict:
    return {o.name: o for o in rows}


def names(table: dict) -> tuple:
    return tuple(table)


# variants
PW = "pointwise:plain"
PW_TMA = "pointwise_tma:tma ring"
PW_DECLINED = "pointwise_tma:declined"  # a 1-D fusion: the plain kernel, the params say why
NORM_REG = "normalization:registers"
NORM_TMA = "normalization:tma"
RED = "reduction:plain"
OUTER = "outer_reduction:tma ring"
MM = "matmul:tensor cores"
MM_SIMT = "matmul:simt"
MM_FFMA = "matmul:ffma"

_RING_STAGES = _int(2, 32)
_RING_PREFETCH = _int(1, 31)
_PREFETCH_DOC = "copies in flight ahead of the consumer (default stages - 1); 1 <= prefetch < stages"
_WAR_DOC = "how a ring slot is known free: a __syncthreads, or consumers arriving on an mbarrier"
_WS_DOC = "a producer row of threads issues the copies (slots freed by mbarrier)"

POINTWISE = _table(
    Override("vectorize", used_by=(PW,), doc="elements per vector access; vectorize x itemsize <= 16 bytes",
             **_int(1, 16, pow2=True)),
    Override("unroll", used_by=(PW,), doc="vectors per thread", **_int(1, 16)),
    Override("threads", used_by=(PW,), doc="threads per CTA", **_int(32, 1024, pow2=True)),
)  # fmt: skip

# the TMA variant is asked for by any of its names (a default-valued war, warp_specialized
# or tma_store describes the plain kernel as well)
_PW_RING = (PW_TMA, PW_DECLINED)
POINTWISE_TMA = _table(
    Override("stages", used_by=_PW_RING, doc="ring slots (asks for the TMA variant)", **_RING_STAGES),
    Override("prefetch", used_by=_PW_RING, doc=_PREFETCH_DOC + " (asks for the TMA variant)", **_RING_PREFETCH),
    Override("tma", used_by={True: _PW_RING, False: (PW,)}, doc="True: the TMA variant; False: the plain kernel",
             **_BOOL),
    Override("war", used_by={"block_sync": (*_PW_RING, PW), "mbarrier": _PW_RING}, doc=_WAR_DOC,
             **_choice("block_sync", "mbarrier")),
    Override("warp_specialized", used_by={True: _PW_RING, False: (*_PW_RING, PW)}, doc=_WS_DOC, **_BOOL),
    Override("tile_rows", used_by=_PW_RING, doc="rows of a tile, a multiple of the CTA's thread rows (asks for the TMA variant)",
             **_int(1, 256)),
    Override("tma_store", used_by={True: _PW_RING, False: (*_PW_RING, PW)},
             doc="outputs staged in shared memory, stored by TMA per tile", **_BOOL),
)  # fmt: skip

_NORM = (NORM_REG, NORM_TMA)
NORMALIZATION = _table(
    Override("staging", used_by=_NORM, doc="how rows come in (default: registers where a row fits)",
             **_choice("registers", "tma")),
    Override("tma", used_by={True: _NORM, False: (RED,)},
             doc="False: the plain reduction kernel (no staging)", **_BOOL),
    Override("stages", used_by=(NORM_TMA,), doc="TMA ring slots (asks for the ring)", **_RING_STAGES),
    Override("prefetch", used_by=(NORM_TMA,), doc=_PREFETCH_DOC + " (asks for the ring)", **_RING_PREFETCH),
    Override("war", used_by={"block_sync": _NORM, "mbarrier": (NORM_TMA,)},
             doc=_WAR_DOC + " ('mbarrier' asks for the ring)", **_choice("block_sync", "mbarrier")),
    Override("warp_specialized", used_by={True: (NORM_TMA,), False: _NORM},
             doc=_WS_DOC + "; adds rows x threads threads (True asks for the ring)", **_BOOL),
    Override("rows", used_by=_NORM, doc="rows per CTA (threadIdx.y); rows x threads <= 1024", **_int(1, 32)),
    Override("threads", used_by=_NORM, doc="threads per row (threadIdx.x)", **_int(32, 1024, mult=32)),
    Override("blocks_per_sm", used_by=_NORM,
             doc="CTAs per SM (__launch_bounds__; tma: the grid); x rows x threads <= 2048", **_int(1, 64)),
    Override("rows_in_registers", used_by=_NORM,
             doc="rows copied once into registers (staging='registers' needs True)", **_BOOL),
)  # fmt: skip

REDUCTION = _table(
    Override("threads", used_by=(RED,), doc="threads per CTA", **_int(32, 1024, pow2=True)),
)

OUTER_REDUCTION = _table(
    Override("stages", used_by=(OUTER,), doc="TMA ring slots", **_RING_STAGES),
    Override("prefetch", used_by=(OUTER,), doc=_PREFETCH_DOC, **_RING_PREFETCH),
    Override("tma", used_by={True: (OUTER,), False: (RED,)},
             doc="False: the plain reduction kernel", **_BOOL),
    Override("war", used_by=(OUTER,), doc=_WAR_DOC, **_choice("block_sync", "mbarrier")),
    Override("warp_specialized", used_by=(OUTER,), doc=_WS_DOC, **_BOOL),
    Override("cols", used_by=(OUTER,), doc="columns per CTA strip; cols x itemsize a multiple of 16 bytes",
             **_int(1, 256)),
)  # fmt: skip

MATMUL = _table(
    Override("persistent", used_by=(MM,), doc="one CTA per SM walks the tiles", **_BOOL),
    Override("stages", used_by=(MM,), doc="operand ring slots (shared memory permitting)", **_int(2)),
    Override("prefetch", used_by=(MM,), doc=_PREFETCH_DOC, **_int(1)),
    Override("pingpong", used_by=(MM,), doc="each consumer warpgroup owns whole tiles (needs persistent)",
             **_BOOL),
    Override("epilogue", used_by=(MM,),
             doc="'inline': the MMA warpgroups run the epilogue; 'role': an epilogue warpgroup fed finished sub-tiles",
             **_choice("inline", "role")),
    Override("tile", used_by=(MM,), doc="bm: 64 per warpgroup (128 or 256 cooperative), bn: 16 to 256 by 16, bk: one or two 128-byte rows of K (64 or 128 16-bit, 32 or 64 TF32)",
             **_ints(3, ("bm", "bn", "bk"))),
    Override("cluster", used_by=(MM,), doc="thread-block clusters: cx CTAs along M share B's tile, cy along N share A's (TMA multicast); must divide the tile grid",
             **_ints(2, ("cx", "cy"))),
    Override("raster", used_by=(MM,), doc="the tile index that runs fastest inside a band", **_choice("M", "N")),
    Override("group", used_by=(MM,), doc="tiles per band (L2 reuse)", **_int(1)),
    Override("registers", used_by=(MM,), doc="setmaxnreg counts: producer <= 168 <= consumers",
             type="(int, int)", allowed=f"(producer, consumers), {REGISTERS_RULE}",
             ok=lambda v: _ints(2, ("producer", "consumers"), lo=24)["ok"](v) and all(x <= 256 and x % 8 == 0 for x in v)),
    Override("epilogue_tile", used_by=(MM,), doc="output sub-tile: 64 rows by a multiple of 8 dividing bn",
             **_ints(2, ("rows", "cols"))),
    Override("fill", used_by=(MM,), doc="operand ring fill: 'tma' (tensor maps) or 'cp.async' (producer threads); "
             "default: tma, an operand a tensor map cannot describe copied to aligned rows first (realign; CIRCBUF_CP_ASYNC=1: cp.async)", **_choice("tma", "cp.async")),
    Override("realign", used_by={True: (MM,), False: (MM, MM_SIMT, MM_FFMA)}, doc="copy an operand a tensor map cannot describe into 16-byte-aligned rows "
             "before the kernel (default True; False: no copy, the producer threads' cp.async fill)", **_BOOL),
    Override("store", used_by=(MM,), doc="how outputs are stored: 'tma' (staging tile, TMA store; 16-byte rows), "
             "'rows' (staging tile, the threads store rows, 4-byte pieces as each row's alignment allows; "
             "the default for 16-bit outputs with an odd N) or 'direct' (from the accumulator registers)",
             **_choice("tma", "rows", "direct")),
    Override("split_k", used_by=(MM,), doc="chunks of K run as partial products, summed in a fixed order "
             "(deterministic); at most the k steps of 64", **_int(1)),
    Override("split_k_sum", used_by=(MM,), doc="where split-K's partial products are summed: 'kernel' (the "
             "last CTA of a tile, in the GEMM kernel; the default where the kernel can) or 'reduction' (a "
             "second kernel)", **_choice("kernel", "reduction")),
    Override("thread_tile", used_by=(MM_FFMA,), doc="fp32/fp64 (FFMA path): outputs a thread computes along M and "
             "along N; 8: [128 x 128] CTA tiles, 4: [64 x 64] (default 8, 4 where 8 makes fewer tiles than SMs)",
             **_int(4, 8, pow2=True)),
    Override("k_step", used_by=(MM_FFMA,), doc="fp32/fp64 (FFMA path): values of K per step of the k loop, "
             "a multiple of one 16-byte load (4 Float, 2 Double)", **_int(2, 16, pow2=True)),
    Override("blocks_per_sm", used_by=(MM_FFMA,), doc="fp32/fp64 (FFMA path): CTAs per SM "
             "(__launch_bounds__ caps the registers)", **_int(1, 8)),
    Override("ffma_smem", used_by=(MM_FFMA,), doc="fp32/fp64 (FFMA path): operand tiles [k_step x 128] staged "
             "in shared memory by cp.async, double-buffered (the next k step's copies in flight during this "
             "one's FFMAs; operands that are fusion inputs; default True for fp32 8 x 8 thread tiles)", **_BOOL),
)  # fmt: skip

TABLES = {
    "matmul": MATMUL,
    "normalization": NORMALIZATION,
    "outer_reduction": OUTER_REDUCTION,
    "reduction": REDUCTION,
    "pointwise_tma": POINTWISE_TMA,
    "pointwise": POINTWISE,
}


class Declined:
    """A scheduler's answer when it does not take these inputs: the next scheduler is
    asked, and an override only the declining one uses raises with ``why``."""

    def __init__(self, why: str):
        self.why = why

    def __repr__(self):
        return f"Declined({self.why!r})"


def ring(stages, prefetch, overrides: dict) -> None:
    """A TMA ring's rules that join two names (the defaults are consistent)."""
    if not prefetch < stages:
        named = ", ".join(f"{k}={overrides[k]!r}" for k in ("prefetch", "stages") if k in overrides)
        raise CircbufError(f"schedule({named}): prefetch must be less than stages ({stages})")
    if overrides.get("warp_specialized") and overrides.get("war") == "block_sync":
        raise CircbufError(
            "schedule(war='block_sync', warp_specialized=True): a warp-specialized ring frees its slots "
            "by mbarrier; give war='mbarrier' or leave war out"
        )


def readme_tables() -> str:
    """The README's override tables (markdown), one per scheduler."""
    out = []
    for sched, table in TABLES.items():
        out.append(
            f"`{sched}`:\n\n| name | type | allowed | used by | doc |\n| --- | --- | --- | --- | --- |"
        )
        for o in table.values():
            out.append(f"| `{o.name}` | {o.type} | {o.allowed} | {o.used_text()} | {o.doc} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":  # the README's tables, between its overrides markers
    print(readme_tables(), end="")

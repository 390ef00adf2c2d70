"""schedule() overrides (issue 16): one table per scheduler validates every name at the
schedule() call (type, range) and at compile (rules that depend on the inputs); an
override the chosen kernel does not use raises; the README lists the tables."""

from __future__ import annotations

VALID = {  # a value every scheduler taking the name allows
    "vectorize": 4, "unroll": 2, "threads": 256,
    "stages": 3, "prefetch": 1, "tma": True, "war": "mbarrier", "warp_specialized": True, "tile_rows": 32,
    "tma_store": True, "cols": 64, "staging": "tma", "rows": 2, "blocks_per_sm": 2, "rows_in_registers": False,
    "persistent": True, "pingpong": False, "tile": (128, 128, 64), "cluster": (1, 1), "raster": "M", "group": 4,
    "registers": (40, 232), "epilogue_tile": (64, 64),
}  # fmt: skip

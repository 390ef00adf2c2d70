"""Valid fusions nobody scheduled by hand never end in a lowering check
(issue 16, part 3): the schedulers' can_schedule refuses what they cannot
lower, and another scheduler or the segmenter takes it. Each case came from
the randomized differential test (tests/fuzz.py, its seed:index named)."""

import torch

import circbuf as cb
from tests.util import D


def test_unrelated_outputs_get_a_kernel_each():
    """Two outputs no loop covers together (``[5]`` and ``[n]``, joined by no
    expr) are two segments, not a pointwise kernel refused by a lowering check
    (fuzz case 104:3)."""
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([5], dtype=D.Double)
        y = fd.define_tensor([1], dtype=D.Int64)
        z = fd.define_tensor([-1], dtype=D.Int64)
        fd.add_output(fd.ops.gcd(y, z))
        fd.add_output(fd.ops.atan(fd.ops.gt(x, 3.0)))
    inputs = [torch.randn(5, dtype=torch.float64), torch.ones(1, dtype=torch.int64), torch.ones(3, dtype=torch.int64)]
    ck = fd.compile(inputs, arch="sm_90a")
    assert len(ck.kernels) == 2
    assert all(k.params.brief().startswith("Pointwise") for k in ck.kernels)

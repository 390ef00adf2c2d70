"""Whether torch would run an fp32 matmul on TF32 tensor cores now: the
matmul scheduler follows the same setting (issue 18).

torch has two switches for it: the newer ``torch.backends.cuda.matmul.fp32_precision``
("tf32", "ieee", or "none": defer to ``torch.backends.fp32_precision``, then to
the legacy one) and the legacy ``torch.backends.cuda.matmul.allow_tf32`` /
``torch.set_float32_matmul_precision`` ("high" and "medium" allow TF32). torch
raises when the legacy getter is read after the two were mixed; that reads as
"not allowed" here (fp32 math is never less exact than asked).

>>> import torch
>>> allows_tf32()  # torch's default: IEEE fp32 matmuls
False
"""

from __future__ import annotations


def allows_tf32() -> bool:
    import torch

    for where in (torch.backends.cuda.matmul, torch.backends):
        p = getattr(where, "fp32_precision", None)
        if p == "tf32":
            return True
        if p == "ieee":
            return False
    try:
        return bool(torch.backends.cuda.matmul.allow_tf32)
    except RuntimeError:  # the legacy and new APIs mixed: torch refuses to say
        return False

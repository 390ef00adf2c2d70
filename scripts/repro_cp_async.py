"""The cp.async fill on the GPU, case by case, each in its own process under
CIRCBUF_DEBUG_HANG: which shapes and schedules finish, which hang (issue 18's
784:30).  python scripts/repro_cp_async.py [filter]"""

import os
import subprocess
import sys

CASE = r"""
import sys, torch
import circbuf as cb
D = cb.DataType
b, m, n, k, a_t, ov = eval(sys.argv[1])
with cb.FusionDefinition() as fd:
    x1 = fd.define_tensor([b, -1, -1] if b else [-1, -1], dtype=D.BFloat16)
    x2 = fd.define_tensor([-1, -1], dtype=D.BFloat16)
    fd.add_output(fd.ops.matmul(x1, x2))
fd.fusion.schedule(fill="cp.async", **ov)
a = torch.randn([m, b or 1, k], dtype=torch.bfloat16).permute([1, 0, 2]) if a_t else torch.randn([b or 1, m, k], dtype=torch.bfloat16)
a = a if b else a[0]
ins = [a.cuda(), torch.randn([k, n], dtype=torch.bfloat16).cuda()]
try:
    o = fd.execute(ins)[0]; torch.cuda.synchronize()
    err = (o.double() - ins[0].double() @ ins[1].double()).abs().max().item()
    print("OK" if err < 0.05 * max(1, k) ** 0.5 else "WRONG", f"err={err:.3g}", fd.last_params().brief())
except Exception as e:
    print("ERR", type(e).__name__, str(e)[:700])
"""
CASES = [
    (3, 128, 130, 7, True, {}),
    (3, 128, 130, 7, True, dict(pingpong=True)),
    (0, 128, 130, 7, False, {}),
    (0, 128, 130, 7, False, dict(pingpong=True)),
    (0, 128, 130, 8, False, {}),
    (0, 128, 136, 7, False, {}),
    (0, 128, 136, 8, False, {}),
    (0, 256, 256, 63, False, {}),
    (0, 256, 256, 64, False, {}),
    (0, 130, 130, 72, False, {}),
    (0, 2047, 2047, 2047, False, {}),
    (0, 2047, 2047, 2047, False, dict(pingpong=True)),
    (0, 1024, 1023, 1024, False, {}),
    (0, 4096, 4095, 1024, False, {}),
]
flt = sys.argv[1] if len(sys.argv) > 1 else ""
for c in CASES:
    if flt not in repr(c):
        continue
    env = dict(os.environ, CIRCBUF_DEBUG_HANG="2000000", CIRCBUF_CACHE_DIR="", CIRCBUF_CP_ASYNC="1")
    try:
        r = subprocess.run(
            [sys.executable, "-c", CASE, repr(c)], capture_output=True, text=True, timeout=90, env=env
        )
        print(c, "->", (r.stdout + r.stderr[-500:]).strip()[:900], flush=True)
    except subprocess.TimeoutExpired:
        print(c, "-> TIMEOUT", flush=True)

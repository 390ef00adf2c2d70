"""Fuzz case 784:30 (a hang on the H100): the batched matmul with cp.async fills under a few schedules."""
import subprocess, sys, os
CASE = r'''
import torch, sys
import circbuf as cb
D = cb.DataType
with cb.FusionDefinition() as fd:
    x1 = fd.define_tensor([3, 128, -1], dtype=D.BFloat16)
    x2 = fd.define_tensor([7, -1], dtype=D.BFloat16)
    x12 = fd.define_tensor([-1, -1], dtype=D.Double)
    t3 = fd.ops.matmul(x1, x2)
    t5 = fd.ops.cast(t3, D.Double)
    fd.add_output(fd.ops.mul(t5, x12)); fd.add_output(t3); fd.add_output(t5)
fd.fusion.schedule(**eval(sys.argv[1]))
ins = [torch.randn([128, 3, 7], dtype=torch.bfloat16).permute([1, 0, 2]), torch.randn([7, 130], dtype=torch.bfloat16), torch.randn([128, 130], dtype=torch.float64)]
ins = [x.cuda() for x in ins]
try:
    o = fd.execute(ins); torch.cuda.synchronize()
    print("OK", (o[1].double() - ins[0].double() @ ins[1].double()).abs().max().item(), fd.last_params().brief())
except Exception as e:
    print("ERR", type(e).__name__, str(e)[:900])
'''
for ov in ("dict(group=8, pingpong=True)", "dict(pingpong=True)", "dict()", "dict(pingpong=True, persistent=True, tile=(128, 128, 64), stages=2)"):
    env = dict(os.environ, CIRCBUF_DEBUG_HANG="200000", CIRCBUF_CACHE_DIR="")
    try:
        r = subprocess.run([sys.executable, "-c", CASE, ov], capture_output=True, text=True, timeout=60, env=env)
        print(ov, "->", (r.stdout + r.stderr[-600:]).strip()[:1200], flush=True)
    except subprocess.TimeoutExpired:
        print(ov, "-> TIMEOUT", flush=True)

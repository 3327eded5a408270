#!/opt/loom/venv/bin/python3
"""ZenFlow's selective AdamW with every column selected equals Debian's torch.optim.AdamW
(torch 2.11, the project venv): 10 steps of randn gradients on a [2, 4] and a [6, 5] weight and a [10]
bias, lr 1e-3, weight decay 0.01 (torch's defaults otherwise), |diff| <= 1e-6 (DeepSpeed's
ZF-U4 equivalence test, with its atol 1e-4 tightened). Usage: zenflow_adamw_test.py TOOL"""
import os
import struct
import subprocess
import sys
import tempfile

import torch

LR, WD, STEPS = 1e-3, 0.01, 10
SHAPES = [(2, 4), (10, 0), (6, 5)]


def main():
    tool = sys.argv[1]
    torch.manual_seed(7)
    params = [torch.randn(r, c) if c else torch.randn(r) for r, c in SHAPES]
    grads = [[torch.randn_like(p) for p in params] for _ in range(STEPS)]
    d = tempfile.mkdtemp(prefix="zf_adamw_")
    inp, out = os.path.join(d, "in.bin"), os.path.join(d, "out.bin")
    with open(inp, "wb") as f:
        f.write(struct.pack("<q", len(SHAPES)))
        for r, c in SHAPES:
            f.write(struct.pack("<qq", r, c))
        f.write(struct.pack("<q", STEPS))
        for p in params:
            f.write(p.contiguous().numpy().astype("<f4").tobytes())
        for step in grads:
            for g in step:
                f.write(g.contiguous().numpy().astype("<f4").tobytes())
    subprocess.run([tool, inp, out, repr(LR), repr(WD)], check=True)
    ref = [p.clone().requires_grad_() for p in params]
    opt = torch.optim.AdamW(ref, lr=LR, weight_decay=WD)
    for step in grads:
        for p, g in zip(ref, step):
            p.grad = g.clone()
        opt.step()
    data = open(out, "rb").read()
    off, worst = 0, 0.0
    for p in ref:
        n = p.numel()
        got = torch.frombuffer(bytearray(data[off:off + 4 * n]), dtype=torch.float32)
        off += 4 * n
        worst = max(worst, (got - p.detach().reshape(-1)).abs().max().item())
    print("max |zenflow - torch.optim.AdamW| = %.3g" % worst)
    if worst > 1e-6:
        print("FAIL: above 1e-6")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

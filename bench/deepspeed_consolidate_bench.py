#!/opt/loom/venv/bin/python3
"""Benchmark: one DeepSpeed-layout ZeRO-3 checkpoint (>= 2 GB, Llama-shaped, 3 ranks; written by
tests/python/deepspeed_ckpt.py through consolidate_peer.py make) consolidated into safetensors by
`loomctl consolidate --from-deepspeed` and by the zero_to_fp32-equivalent Python reference
(consolidate_peer.py consolidate: torch.load of every rank file, zero_to_fp32's stage-3
concatenation, one safetensors file, fsynced), alternately, `--runs` times each. Both outputs are
compared tensor for tensor with each other and with the value formula (consolidate_peer.py
compare) after every Loom run. Peak RSS of each is GNU time's %M (wait4 ru_maxrss of the
consolidating process). Page cache is left warm for both (the checkpoint was just written).

  bazel run //storage/checkpoint:deepspeed_consolidate_bench -- [--size_gb=2.1]
      [--runs=3] [--work=DIR] [--keep]

Last line: deepspeed_consolidate vs_python_speedup=<median of python_s / loom_s>
  peak_rss_bytes=<largest Loom peak RSS> checkpoint_bytes=<bytes of the tag directory's files>
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "consolidate_peer.py")
PYTHON = "/opt/loom/venv/bin/python3"


def llama_shapes(size_gb):
    """A Llama-shaped parameter list (hidden 2048, MLP 5504, vocab 32003: the vocabulary not
    divisible by the 3 ranks) with enough layers for >= size_gb GB of fp32."""
    hidden, inter, vocab = 2048, 5504, 32003
    shapes = [("model.embed_tokens.weight", [vocab, hidden])]
    per_layer = [("self_attn.q_proj.weight", [hidden, hidden]),
                 ("self_attn.k_proj.weight", [hidden, hidden]),
                 ("self_attn.v_proj.weight", [hidden, hidden]),
                 ("self_attn.o_proj.weight", [hidden, hidden]),
                 ("mlp.gate_proj.weight", [inter, hidden]),
                 ("mlp.up_proj.weight", [inter, hidden]),
                 ("mlp.down_proj.weight", [hidden, inter]),
                 ("input_layernorm.weight", [hidden]),
                 ("post_attention_layernorm.weight", [hidden])]
    tail = [("model.norm.weight", [hidden]), ("lm_head.weight", [vocab, hidden])]

    def numel(s):
        n = 1
        for d in s:
            n *= d
        return n

    total = sum(numel(s) for _, s in shapes + tail) * 4
    layer_bytes = sum(numel(s) for _, s in per_layer) * 4
    layers = 0
    while total < size_gb * 1e9:
        shapes += [("model.layers.%d.%s" % (layers, n), s) for n, s in per_layer]
        total += layer_bytes
        layers += 1
    return [{"name": n, "shape": s} for n, s in shapes + tail]


def timed(cmd, log):
    """(wall seconds, peak RSS bytes) of cmd under /usr/bin/time; raises on failure."""
    with tempfile.NamedTemporaryFile("r") as rss:
        t0 = time.monotonic()
        p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name] + cmd,
                           stdout=log, stderr=log)
        wall = time.monotonic() - t0
        if p.returncode != 0:
            raise SystemExit("failed (%d): %s (log: %s)" % (p.returncode, " ".join(cmd), log.name))
        return wall, int(rss.read().split()[-1]) * 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size_gb", type=float, default=2.1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", default=os.environ.get("TMPDIR", "/tmp"))
    ap.add_argument("--loomctl", default=os.path.join(os.getcwd(), "services/cli/loomctl"))
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ds_consolidate_bench.", dir=args.work)
    log = open(os.path.join(work, "log.txt"), "w+")
    try:
        shapes_path = os.path.join(work, "shapes.json")
        with open(shapes_path, "w") as f:
            json.dump(llama_shapes(args.size_gb), f)
        save = os.path.join(work, "ds")
        t0 = time.monotonic()
        subprocess.run([PYTHON, PEER, "make", shapes_path, save, "3", "3", "0"], check=True,
                       stdout=log, stderr=log)
        tag = os.path.join(save, "global_step1")
        ckpt_bytes = sum(os.path.getsize(os.path.join(tag, f)) for f in os.listdir(tag))
        print("checkpoint: %d bytes, ZeRO-3, 3 ranks, written in %.1f s" %
              (ckpt_bytes, time.monotonic() - t0), flush=True)
        loom_out, py_out = os.path.join(work, "loom"), os.path.join(work, "python.safetensors")
        ratios, loom_s, py_s, loom_rss, py_rss = [], [], [], [], []
        for run in range(args.runs):
            shutil.rmtree(loom_out, ignore_errors=True)
            if os.path.exists(py_out):
                os.remove(py_out)
            lw, lr = timed([args.loomctl, "consolidate", "--from-deepspeed", save,
                            "--output_dir", loom_out], log)
            pw, pr = timed([PYTHON, PEER, "consolidate", save, py_out], log)
            cmp = subprocess.run([PYTHON, PEER, "compare", shapes_path,
                                  os.path.join(loom_out, "model.safetensors"), py_out],
                                 capture_output=True, text=True)
            result = json.loads(cmp.stdout.strip().splitlines()[-1])
            if cmp.returncode != 0 or not result["equal"]:
                raise SystemExit("outputs differ: %s" % result)
            load = os.getloadavg()[0]
            print("run %d: loom %.2f s (%.0f MB/s) peak RSS %.1f MiB | python %.2f s (%.0f MB/s) "
                  "peak RSS %.1f MiB | speedup %.2fx | %d tensors equal | load %.1f" %
                  (run + 1, lw, ckpt_bytes / lw / 1e6, lr / 2**20, pw, ckpt_bytes / pw / 1e6,
                   pr / 2**20, pw / lw, result["tensors_compared"], load), flush=True)
            ratios.append(pw / lw)
            loom_s.append(lw)
            py_s.append(pw)
            loom_rss.append(lr)
            py_rss.append(pr)
        print("median: loom %.2f s, python %.2f s; peak RSS loom %.1f MiB, python %.1f MiB" %
              (statistics.median(loom_s), statistics.median(py_s), max(loom_rss) / 2**20,
               max(py_rss) / 2**20))
        print("deepspeed_consolidate vs_python_speedup=%.2f peak_rss_bytes=%d checkpoint_bytes=%d"
              % (statistics.median(ratios), max(loom_rss), ckpt_bytes))
    finally:
        log.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/opt/loom/venv/bin/python3
"""Pre-tokenized flat token files through loom-trainer (issue 17).

Usage: /opt/loom/venv/bin/python3 token_file_job_test.py --trainer PATH

Writes a nanoGPT-style uint16 .bin file with numpy (documents of random ids < 500 separated by the
EOS id 2) and asserts:
  * a 2-rank job on it (dataset.format: tokens) trains, and every window each rank trained on
    (--trajectory_dir dump) is a contiguous run of the file's training part: the memory-mapped
    reader returns the file's ids;
  * a file with one id >= model.config.vocab_size stops the trainer at start with an error event
    naming the file and the byte offset of that id;
  * a file whose size is not a multiple of 2 bytes is refused naming the file and its size.
"""

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer_gang  # noqa: E402

VOCAB, EOS, SEQ = 512, 2, 16


def spec(path):
    return {"model": {"config": {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
                                 "num_hidden_layers": 1, "num_attention_heads": 2,
                                 "max_position_embeddings": 64, "eos_token_id": EOS}},
            "dataset": {"path": path, "format": "tokens", "token_dtype": "uint16",
                        "holdout_fraction": 0.1},
            "deepspeed_config": {"train_micro_batch_size_per_gpu": 2,
                                 "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
                                 "zero_optimization": {"stage": 3}},
            "training": {"steps": 2, "sequence_length": SEQ, "seed": 5, "eval_batches": 1}}


def write_spec(tmp, name, path):
    return trainer_gang.write_spec(spec(path), os.path.join(tmp, name))


def run(trainer, spec_path, world, extra=(), deadline_s=300):
    return trainer_gang.run_gang(trainer, spec_path, world, extra=lambda rank: extra,
                                 collective_timeout_s=120, deadline_s=deadline_s, check=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", required=True)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    rng = np.random.default_rng(0)
    docs = [np.append(rng.integers(3, 500, size=int(rng.integers(20, 60))), EOS)
            for _ in range(200)]
    ids = np.concatenate(docs).astype("<u2")
    good = os.path.join(tmp, "train.bin")
    ids.tofile(good)

    # 1. A 2-rank job on the memory-mapped file.
    traj = os.path.join(tmp, "traj")
    rcs, events = run(args.trainer, write_spec(tmp, "good.json", good), 2,
                      [f"--trajectory_dir={traj}"])
    assert rcs == [0, 0], (rcs, events[-3:])
    assert any(e.get("event") == "done" for e in events), events[-3:]
    text = ids.astype(np.int64)
    for rank in range(2):
        with open(os.path.join(traj, f"tokens_rank_{rank}.json")) as f:
            shape = json.load(f)["shape"]
        w = np.fromfile(os.path.join(traj, f"tokens_rank_{rank}.bin"), dtype="<i8")
        rows = w.reshape(-1, shape[-1])
        for row in rows:
            hits = [s for s in np.flatnonzero(text[:len(text) - SEQ] == row[0])
                    if np.array_equal(text[s:s + len(row)], row)]
            assert hits, f"rank {rank}: window {row[:8]}... is not a run of the file"
        print(f"rank {rank}: {len(rows)} windows, each a contiguous run of {good}")

    # 2. An id >= vocab_size, at token 1000 (byte offset 2000).
    bad = ids.copy()
    bad[1000] = VOCAB
    bad_path = os.path.join(tmp, "bad_id.bin")
    bad.tofile(bad_path)
    rcs, events = run(args.trainer, write_spec(tmp, "bad.json", bad_path), 1)
    errors = [e["message"] for e in events if e.get("event") == "error"]
    assert rcs[0] != 0 and errors, (rcs, events[-3:])
    want = f"dataset.path: {bad_path} byte offset 2000: token id {VOCAB} >= vocab_size {VOCAB}"
    assert want in errors[0], errors[0]
    print(f"exit {rcs[0]}: {errors[0]}")

    # 3. A size that is not a multiple of the token width.
    odd_path = os.path.join(tmp, "odd.bin")
    with open(odd_path, "wb") as f:
        f.write(ids.tobytes() + b"\x07")
    rcs, events = run(args.trainer, write_spec(tmp, "odd.json", odd_path), 1)
    errors = [e["message"] for e in events if e.get("event") == "error"]
    assert rcs[0] != 0 and errors, (rcs, events[-3:])
    want = f"{odd_path}: size {ids.nbytes + 1} bytes is not a multiple of the token width 2"
    assert want in errors[0], errors[0]
    print(f"exit {rcs[0]}: {errors[0]}")
    print("token_file_job_test: OK")


if __name__ == "__main__":
    sys.exit(main())

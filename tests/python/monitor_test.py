#!/opt/loom/venv/bin/python3
"""DeepSpeed's `tensorboard` and `csv_monitor` blocks through loom-trainer, judged by TensorBoard.

Usage: /opt/loom/venv/bin/python3 monitor_test.py --trainer PATH

A 2-rank job with both blocks (as DeepSpeed's monitor tutorial writes them) trains 4 steps with
2 micro-batches of 2 accumulated per step (train_batch_size 8) and a held-out evaluation every 2
steps. Asserted against rank 0's own step and eval events:
  * TensorBoard's EventAccumulator (the tensorboard package from PyPI, not code written here)
    reads <checkpoint dir>/ds_logs/tiny: Train/Samples/train_loss and Train/Samples/lr at
    samples 8, 16, 24, 32 and Train/Samples/eval_loss at 0, 16, 32, each value the event's as a
    float32 (TensorBoard's simple_value);
  * the csv_monitor files <checkpoint dir>/csv/DeepSpeedJobName/Train_Samples_*.csv, read with
    Python's csv module: header "step,<name>", then the same samples and values (full doubles);
  * only rank 0 writes (one event file);
  * an output_path outside the job's directory ends the trainer at start with the configuration
    exit code (78) and an error naming the key.
"""

import argparse
import csv
import glob
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer_gang  # noqa: E402


def spec(tensorboard_path="ds_logs"):
    return {"model": {"config": {"vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,
                                 "num_hidden_layers": 1, "num_attention_heads": 2,
                                 "max_position_embeddings": 64}},
            "dataset": {"name": "fortunes", "tokenizer": "byte"},
            "deepspeed_config": {
                "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
                "scheduler": {"type": "WarmupLR",
                              "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01,
                                         "warmup_num_steps": 3}},
                "zero_optimization": {"stage": 2},
                "tensorboard": {"enabled": True, "output_path": tensorboard_path,
                                "job_name": "tiny"},
                "csv_monitor": {"enabled": True, "output_path": "csv"}},
            "training": {"steps": 4, "sequence_length": 16, "seed": 3, "eval_batches": 1,
                         "eval_every_steps": 2}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", required=True)
    a = ap.parse_args()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tmp = tempfile.mkdtemp(prefix="monitor_test_")
    ckpt = os.path.join(tmp, "ckpt")
    path = trainer_gang.write_spec(spec(), os.path.join(tmp, "spec.json"))
    _, events = trainer_gang.run_gang(a.trainer, path, 2, ckpt=ckpt, deadline_s=300)
    steps = [e for e in events if e["event"] == "step"]
    evals = [e for e in events if e["event"] == "eval"]
    assert [e["step"] for e in steps] == [1, 2, 3, 4], steps
    assert [e["step"] for e in evals] == [0, 2, 4], evals
    want = {
        "Train/Samples/train_loss": [(8 * e["step"], e["loss"]) for e in steps],
        "Train/Samples/lr": [(8 * e["step"], e["lr"]) for e in steps],
        "Train/Samples/eval_loss": [(8 * e["step"], e["loss"]) for e in evals],
    }
    assert len({lr for _, lr in want["Train/Samples/lr"]}) > 1, "the warm-up changes the lr"

    tb_dir = os.path.join(ckpt, "ds_logs", "tiny")
    files = glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))
    assert len(files) == 1, f"one event file (rank 0's): {files}"
    acc = EventAccumulator(tb_dir)
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == sorted(want), acc.Tags()
    for tag, points in want.items():
        got = [(s.step, s.value) for s in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in points], (tag, got, points)
        for (_, v), (_, w) in zip(got, points):
            assert v == float(np.float32(w)), (tag, v, w)

    csv_dir = os.path.join(ckpt, "csv", "DeepSpeedJobName")
    for tag, points in want.items():
        name = tag.replace("/", "_") + ".csv"
        with open(os.path.join(csv_dir, name), newline="") as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["step", tag.rsplit("/", 1)[1]], rows[0]
        assert [(int(s), float(v)) for s, v in rows[1:]] == points, (name, rows, points)

    bad = trainer_gang.write_spec(spec("/tmp/elsewhere"), os.path.join(tmp, "bad.json"))
    rcs, bad_events = trainer_gang.run_gang(a.trainer, bad, 1, ckpt=os.path.join(tmp, "c2"),
                                            deadline_s=120, check=False)
    assert rcs == [78], rcs
    errors = [e["message"] for e in bad_events if e["event"] == "error"]
    assert errors and "deepspeed_config.tensorboard.output_path: '/tmp/elsewhere' leaves the " \
        "job's directory" in errors[0], errors
    print("monitor_test: ok")


if __name__ == "__main__":
    main()

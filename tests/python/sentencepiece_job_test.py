#!/opt/loom/venv/bin/python3
"""A short run of examples/fortunes-sentencepiece through loom-trainer (issue 17).

Usage: /opt/loom/venv/bin/python3 sentencepiece_job_test.py --trainer PATH --consolidate PATH
           --check_export PATH --example_dir DIR

Builds the trainer's JSON spec from the example's job.yaml, config.json and ds_config.json (as
loomctl does), shortened to 4 steps of 32 tokens with a checkpoint every 2 steps, and asserts:
  * the job trains its own SentencePiece tokenizer (job.yaml's vocab_size) and records it as
    <checkpoint_dir>/tokenizer.model + tokenizer_config.json;
  * loom-consolidate's export holds tokenizer.model (byte-identical) and tokenizer_config.json
    beside config.json, and config.json's bos/eos/pad ids are those of the pieces <s>, </s>,
    <pad> in the model's vocabulary as `spm_export_vocab` (the sentencepiece package's own tool,
    independent of Loom) lists it;
  * check_export.py accepts the export against the trainer's final logits;
  * sampling is deterministic and resumable: a run resumed from the step-2 checkpoint (which
    reuses the recorded tokenizer, unchanged) trains on exactly the token ids of steps 3-4 of
    the uninterrupted run (the trainer's --trajectory_dir dump of every window, every rank).
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer_gang  # noqa: E402

STEPS, SEQ, INTERVAL, WORLD = 4, 32, 2, 2



def spec_from_example(example_dir):
    job, config, ds = trainer_gang.load_example(example_dir)
    ds["train_micro_batch_size_per_gpu"] = 2
    training = dict(job["training"], steps=STEPS, sequence_length=SEQ, eval_batches=1,
                    eval_every_steps=0)
    return {"name": job["name"], "model": {"config": config}, "dataset": job["dataset"],
            "deepspeed_config": ds, "training": training,
            "checkpoint": {"interval_steps": INTERVAL}}


def run_trainer(trainer, spec_path, ckpt, extra, deadline_s=600):
    return trainer_gang.run_gang(trainer, spec_path, WORLD, ckpt=ckpt, extra=extra,
                                 deadline_s=deadline_s)[1]


def vocab_ids(model_path):
    """{piece: id} from spm_export_vocab (one 'piece<TAB>score' line per id, in id order)."""
    out = subprocess.run(["spm_export_vocab", f"--model={model_path}"], capture_output=True,
                         check=True, timeout=60).stdout.decode("utf-8")
    return {line.split("\t")[0]: i for i, line in enumerate(out.splitlines())}


def windows(traj_dir, rank):
    with open(os.path.join(traj_dir, f"tokens_rank_{rank}.json")) as f:
        meta = json.load(f)
    data = np.fromfile(os.path.join(traj_dir, f"tokens_rank_{rank}.bin"), dtype="<i8")
    return meta["start_step"], data.reshape(meta["shape"])


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    ap = argparse.ArgumentParser()
    for a in ("--trainer", "--consolidate", "--check_export", "--example_dir"):
        ap.add_argument(a, required=True)
    args = ap.parse_args()
    spec = spec_from_example(args.example_dir)
    vocab_size = spec["dataset"]["vocab_size"]
    assert spec["dataset"]["tokenizer"] == "sentencepiece" and 2000 <= vocab_size <= 8000

    tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    spec_path = trainer_gang.write_spec(spec, os.path.join(tmp, "job.json"))
    ckpt = os.path.join(tmp, "ckpt")

    # 1. The uninterrupted run.
    traj_a = os.path.join(tmp, "traj_a")
    events = run_trainer(args.trainer, spec_path, ckpt, lambda r: [f"--trajectory_dir={traj_a}"])
    done = [e for e in events if e.get("event") == "done"]
    assert done and done[0]["step"] == STEPS, events[-3:]
    model = os.path.join(ckpt, "tokenizer.model")
    ids = vocab_ids(model)
    assert len(ids) == vocab_size, len(ids)
    with open(os.path.join(ckpt, "tokenizer_config.json")) as f:
        tok_cfg = json.load(f)
    assert tok_cfg["eos_token"] == "</s>" and tok_cfg["eos_token_id"] == ids["</s>"], tok_cfg
    print(f"tokenizer: {len(ids)} pieces; unk/bos/eos/pad = {ids['<unk>']}/{ids['<s>']}/"
          f"{ids['</s>']}/{ids['<pad>']}")

    # 2. The export: tokenizer files beside config.json, ids agreeing with the tokenizer.
    out = os.path.join(tmp, "export")
    r = subprocess.run([args.consolidate, f"--checkpoint_dir={ckpt}", f"--output_dir={out}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert sha(os.path.join(out, "tokenizer.model")) == sha(model)
    assert os.path.exists(os.path.join(out, "tokenizer_config.json"))
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    assert config["bos_token_id"] == ids["<s>"], config
    assert config["eos_token_id"] == ids["</s>"], config
    assert config["pad_token_id"] == ids["<pad>"], config
    assert config["vocab_size"] >= len(ids), config
    r = subprocess.run(["/opt/loom/venv/bin/python3", args.check_export, "--model_dir", out, "--logits",
                        os.path.join(ckpt, "final_logits.json")],
                       capture_output=True, text=True, timeout=300)
    print(r.stdout.strip())
    assert r.returncode == 0, r.stdout + r.stderr

    # 3. Resume from step 2, as a restart does (the job's checkpoint directory with its recorded
    # tokenizer; here a copy, so that the first run's files stay as they were): the tokenizer
    # is loaded, not trained or rewritten, and the windows of steps 3-4 equal the uninterrupted
    # run's, token for token.
    ckpt_b = os.path.join(tmp, "ckpt_b")
    os.makedirs(ckpt_b)
    for name in ("tokenizer.model", "tokenizer_config.json"):
        shutil.copy2(os.path.join(ckpt, name), os.path.join(ckpt_b, name))
    model_b = os.path.join(ckpt_b, "tokenizer.model")
    before = (sha(model_b), os.stat(model_b).st_mtime_ns, os.stat(model_b).st_ino)
    traj_b = os.path.join(tmp, "traj_b")
    step2 = os.path.join(ckpt, "step_%08d" % INTERVAL)
    assert os.path.isdir(step2), os.listdir(ckpt)
    run_trainer(args.trainer, spec_path, ckpt_b,
                lambda r: [f"--trajectory_dir={traj_b}", f"--resume_from={step2}"])
    after = (sha(model_b), os.stat(model_b).st_mtime_ns, os.stat(model_b).st_ino)
    assert after == before, (before, after)
    for rank in range(WORLD):
        start_a, a = windows(traj_a, rank)
        start_b, b = windows(traj_b, rank)
        assert (start_a, start_b) == (0, INTERVAL), (start_a, start_b)
        assert b.shape[0] == STEPS - INTERVAL, b.shape
        assert np.array_equal(a[INTERVAL:], b), f"rank {rank}: resumed windows differ"
        assert a.max() < vocab_size and a.min() >= 0
        print(f"rank {rank}: {b.size} resumed token ids equal the uninterrupted run's")
    print("sentencepiece_job_test: OK")


if __name__ == "__main__":
    sys.exit(main())

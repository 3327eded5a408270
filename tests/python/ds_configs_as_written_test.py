#!/opt/loom/venv/bin/python3
"""DeepSpeed configs as popular projects ship them (testdata/ds_configs, SOURCES.md says from
where), read by Loom (`loomctl resolve --json`) and by the real libraries as a Hugging Face
Trainer job would read them: transformers' HfTrainerDeepSpeedConfig fills the "auto" values,
accelerate's rule fills a missing micro-batch size, then DeepSpeed 0.19.8's own DeepSpeedConfig
parses the result.

For every file:
  * if DeepSpeed accepts it, Loom accepts it too, or refuses naming a DeepSpeed feature it does
    not implement ("is not implemented in Loom" / "is not supported yet"), never "unknown key";
  * if Loom accepts it, what it resolved equals what DeepSpeed resolved: batch sizes, clipping,
    ZeRO stage, bucket sizes, offload devices, bf16/fp16, optimizer parameters.
Usage: ds_configs_as_written_test.py LOOMCTL TESTDATA_DIR."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch.distributed as dist
from transformers import TrainingArguments
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

LOOMCTL = None
DATA = None
HIDDEN = 64
STEPS = 10
# The job's Trainer arguments (and the same TrainingArguments for transformers).
TRAINING = {"learning_rate": 1e-4, "per_device_train_batch_size": 2,
            "gradient_accumulation_steps": 2, "bf16": True}
MODEL = {"vocab_size": 256, "hidden_size": HIDDEN, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64}


def loom(ds):
    with tempfile.TemporaryDirectory() as d:
        spec = {"name": "as-written", "model": {"config": MODEL}, "dataset": {"name": "fortunes"},
                "deepspeed_config": ds, "resources": {"num_ranks": 1},
                "training": dict(TRAINING, steps=STEPS, sequence_length=32)}
        path = os.path.join(d, "job.yaml")
        with open(path, "w") as f:
            json.dump(spec, f)
        out = subprocess.run([LOOMCTL, "resolve", "--json", path], capture_output=True,
                             text=True)
        if out.returncode == 0:
            return json.loads(out.stdout), None
        return None, out.stderr.strip()


def deepspeed(ds):
    """(DeepSpeedConfig, None) or (None, error) for `ds` as the Trainer hands it to DeepSpeed."""
    from deepspeed.runtime.config import DeepSpeedConfig
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to=[],
                             max_steps=STEPS, **TRAINING)
    config = HfTrainerDeepSpeedConfig(json.loads(json.dumps(ds)))
    try:
        config.trainer_config_process(args)

        class Model:
            class config:
                hidden_size = HIDDEN
        config.trainer_config_finalize(args, Model, STEPS)
        resolved = config.config
        # accelerate (_prepare_deepspeed): a missing micro-batch size is the Trainer's.
        if "train_micro_batch_size_per_gpu" not in resolved and "train_batch_size" not in resolved:
            resolved["train_micro_batch_size_per_gpu"] = args.per_device_train_batch_size
        return DeepSpeedConfig(resolved), None
    except Exception as e:  # DeepSpeed's and transformers' refusals
        return None, "%s: %s" % (type(e).__name__, str(e).splitlines()[0])


class AsWrittenTest(unittest.TestCase):
    def test_every_file(self):
        files = sorted(f for f in os.listdir(DATA) if f.endswith(".json"))
        self.assertGreaterEqual(len(files), 9)
        accepted = 0
        for name in files:
            with open(os.path.join(DATA, name)) as f:
                ds = json.load(f)
            with self.subTest(config=name):
                mine, my_error = loom(ds)
                theirs, their_error = deepspeed(ds)
                print("%-45s loom: %-8s deepspeed: %s" % (
                    name, "accepts" if mine else "refuses",
                    "accepts" if theirs else "refuses (%s)" % their_error[:80]))
                if my_error:
                    print("    loom: " + my_error[:300])
                if theirs is not None and mine is None:
                    self.assertRegex(my_error, "is not implemented in Loom|is not supported yet")
                    self.assertNotIn("unknown key", my_error)
                if mine is None:
                    continue
                accepted += 1
                if theirs is None:
                    continue  # Loom is the more lenient reader here (said above)
                got = mine["deepspeed_config"]
                zero = got.get("zero_optimization", {})
                self.assertEqual(got["train_micro_batch_size_per_gpu"],
                                 theirs.train_micro_batch_size_per_gpu)
                self.assertEqual(got.get("gradient_accumulation_steps", 1),
                                 theirs.gradient_accumulation_steps)
                if "train_batch_size" in got:
                    self.assertEqual(got["train_batch_size"], theirs.train_batch_size)
                self.assertEqual(got.get("gradient_clipping", 0.0), theirs.gradient_clipping)
                self.assertEqual(zero.get("stage", 0), theirs.zero_optimization_stage)
                zc = theirs.zero_config
                for key, value in [("reduce_bucket_size", zc.reduce_bucket_size),
                                   ("stage3_prefetch_bucket_size", zc.prefetch_bucket_size),
                                   ("stage3_param_persistence_threshold",
                                    zc.param_persistence_threshold)]:
                    if key in zero:
                        self.assertEqual(zero[key], value, key)
                for block in ("offload_optimizer", "offload_param"):
                    theirs_block = getattr(zc, block)
                    device = getattr(theirs_block, "device", "none") if theirs_block else "none"
                    self.assertEqual(zero.get(block, {}).get("device", "none"),
                                     str(getattr(device, "value", device)), block)
                self.assertEqual(got.get("bf16", {}).get("enabled", False),
                                 theirs.bfloat16_config.enabled)
                self.assertEqual(got.get("fp16", {}).get("enabled", False), theirs.float16_config.enabled)
                if theirs.optimizer_params:
                    for key in ("lr", "eps", "weight_decay"):
                        if key in theirs.optimizer_params:
                            self.assertAlmostEqual(got["optimizer"]["params"][key],
                                                   theirs.optimizer_params[key], places=15)
                    if "betas" in theirs.optimizer_params:
                        self.assertEqual(list(got["optimizer"]["params"]["betas"]),
                                         list(theirs.optimizer_params["betas"]))
        print("Loom accepts %d of %d configs as written" % (accepted, len(files)))


if __name__ == "__main__":
    LOOMCTL = sys.argv.pop(1)
    DATA = sys.argv.pop(1)
    # DeepSpeedConfig asks torch.distributed for the world size: one process, a file store (no
    # port to collide with).
    store = tempfile.NamedTemporaryFile(delete=False)
    dist.init_process_group("gloo", init_method="file://" + store.name, rank=0, world_size=1)
    try:
        unittest.main()
    finally:
        dist.destroy_process_group()

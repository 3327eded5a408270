#!/opt/loom/venv/bin/python3
"""The real libraries judge how Loom reads DeepSpeed configs written for Hugging Face's Trainer
(spec/hf_trainer_config.h) and DeepSpeed's learning-rate schedules (spec/ds_config.h):

  * "auto" values: transformers' HfTrainerDeepSpeedConfig (trainer_config_process and
    trainer_config_finalize, as Trainer runs them) with the same TrainingArguments, against
    `loomctl resolve --json` on a job whose training section carries those arguments;
  * a config without an optimizer: Trainer.get_optimizer_cls_and_kwargs (the Trainer's AdamW);
  * without a scheduler: transformers.get_scheduler's learning rate at every step;
  * DeepSpeed's own schedulers (deepspeed.runtime.lr_schedules): WarmupLR, WarmupDecayLR and
    WarmupCosineLR stepped as DeepSpeed's engine steps them, learning rate at every step.

Usage: hf_trainer_config_test.py LOOMCTL. Run with /opt/loom/venv/bin/python3 (transformers
5.25, accelerate 1.16, deepspeed 0.19.8, torch 2.11)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch
from transformers import Trainer, TrainingArguments, get_scheduler
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

LOOMCTL = None
HIDDEN = 64
MODEL = {"vocab_size": 256, "hidden_size": HIDDEN, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64}

# Hugging Face's ZeRO-3 example (transformers docs, "deepspeed"), every value "auto".
ZERO3_AUTO = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                              "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {
        "warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto",
        "total_num_steps": "auto"}},
    "zero_optimization": {
        "stage": 3, "overlap_comm": True, "contiguous_gradients": True, "sub_group_size": 1e9,
        "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False}

# Hugging Face's ZeRO-2 example with WarmupLR.
ZERO2_AUTO = {
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                              "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto",
                                                 "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 2e8,
                          "overlap_comm": True, "reduce_scatter": True,
                          "reduce_bucket_size": "auto", "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}


def loom_resolve(ds, training, steps):
    """loomctl resolve --json on a one-rank job with `ds` and training section `training`."""
    with tempfile.TemporaryDirectory() as d:
        spec = {"name": "judge", "model": {"config": MODEL}, "dataset": {"name": "fortunes"},
                "deepspeed_config": ds, "resources": {"num_ranks": 1},
                "training": dict(training, steps=steps, sequence_length=32)}
        path = os.path.join(d, "job.yaml")
        with open(path, "w") as f:
            json.dump(spec, f)  # JSON is YAML
        out = subprocess.run([LOOMCTL, "resolve", "--json", path], capture_output=True,
                             text=True)
        if out.returncode != 0:
            raise AssertionError("loomctl resolve exited %d: %s" % (out.returncode, out.stderr))
        return json.loads(out.stdout)


def hf_resolve(ds, args, steps):
    """What Trainer does with `ds` for TrainingArguments `args` and `steps` steps."""
    config = HfTrainerDeepSpeedConfig(json.loads(json.dumps(ds)))
    config.trainer_config_process(args)

    class Model:  # trainer_config_finalize reads model.config.hidden_size only
        class config:
            hidden_size = HIDDEN
    config.trainer_config_finalize(args, Model, steps)
    return config.config


def training_args(**kw):
    return TrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to=[], **kw)


def leaves(d, prefix=""):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from leaves(v, prefix + "." + k if prefix else k)
    else:
        yield prefix, d


def ds_learning_rates(ds, steps):
    """DeepSpeed's scheduler of `ds`, stepped as its engine does: built with
    last_batch_iteration -1, stepped after every optimizer step; the lr each step runs with."""
    from deepspeed.runtime import lr_schedules
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=ds["optimizer"]["params"]["lr"])
    cls = getattr(lr_schedules, ds["scheduler"]["type"])
    sched = cls(opt, **ds["scheduler"]["params"])
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        sched.step()
    return lrs


class HfTrainerAutoTest(unittest.TestCase):
    def check_auto(self, ds, steps, **kw):
        hf = hf_resolve(ds, training_args(max_steps=steps, **kw), steps)
        loom = loom_resolve(ds, kw, steps)
        for key, value in leaves(hf):
            node = loom["deepspeed_config"]
            for part in key.split("."):
                node = node[part]
            if isinstance(value, float) or isinstance(node, float):
                self.assertAlmostEqual(node, value, places=15, msg=key)
            else:
                self.assertEqual(node, value, key)
        return hf, loom

    def test_zero3_template_with_arguments(self):
        hf, loom = self.check_auto(ZERO3_AUTO, 20, learning_rate=3e-4,
                                   per_device_train_batch_size=2, gradient_accumulation_steps=3,
                                   warmup_steps=0.1, bf16=True, weight_decay=0.01,
                                   adam_beta2=0.95, max_grad_norm=0.5)
        self.assertEqual(hf["zero_optimization"]["stage3_prefetch_bucket_size"], 3686)
        # The schedule the resolved WarmupDecayLR gives, step by step, is DeepSpeed's.
        self.assertEqual(len(loom["learning_rates"]), 20)
        for s, (mine, theirs) in enumerate(zip(loom["learning_rates"],
                                               ds_learning_rates(hf, 20))):
            self.assertAlmostEqual(mine, theirs, places=15, msg="step %d" % s)

    def test_zero3_template_with_the_trainers_defaults(self):
        self.check_auto(ZERO3_AUTO, 50)

    def test_zero2_template_warmup_lr(self):
        hf, loom = self.check_auto(ZERO2_AUTO, 30, learning_rate=1e-3, warmup_steps=7)
        for s, (mine, theirs) in enumerate(zip(loom["learning_rates"],
                                               ds_learning_rates(hf, 30))):
            self.assertAlmostEqual(mine, theirs, places=15, msg="step %d" % s)


class HfTrainerDefaultsTest(unittest.TestCase):
    """A config without optimizer or scheduler: what the Trainer builds itself."""

    def check(self, steps, scheduler, **kw):
        ds = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
        training = dict(kw)
        if scheduler is not None:
            training["lr_scheduler_type"] = scheduler
        loom = loom_resolve(ds, training, steps)
        args = training_args(max_steps=steps, per_device_train_batch_size=4,
                             lr_scheduler_type=scheduler or "linear", **kw)
        cls, opt_kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
        self.assertIn("AdamW", cls.__name__)
        params = loom["deepspeed_config"]["optimizer"]["params"]
        self.assertEqual(loom["deepspeed_config"]["optimizer"]["type"], "AdamW")
        self.assertAlmostEqual(params["lr"], opt_kwargs["lr"], places=15)
        self.assertEqual(tuple(params["betas"]), tuple(opt_kwargs["betas"]))
        self.assertAlmostEqual(params["eps"], opt_kwargs["eps"], places=20)
        # The Trainer's schedule (LambdaLR stepped after each optimizer step).
        param = torch.nn.Parameter(torch.zeros(1))
        opt = cls([param], **opt_kwargs)
        sched = get_scheduler(args.lr_scheduler_type, opt,
                              num_warmup_steps=args.get_warmup_steps(steps),
                              num_training_steps=steps)
        for s in range(steps):
            self.assertAlmostEqual(loom["learning_rates"][s], opt.param_groups[0]["lr"],
                                   places=15, msg="step %d" % s)
            opt.step()
            sched.step()

    def test_linear_default(self):
        self.check(25, None)

    def test_linear_with_warmup_and_arguments(self):
        self.check(40, "linear", learning_rate=2e-4, warmup_steps=6, adam_beta1=0.8,
                   adam_epsilon=1e-6)

    def test_cosine_with_warmup_fraction(self):
        self.check(33, "cosine", learning_rate=1e-3, warmup_steps=0.2)

    def test_constant_schedules(self):
        self.check(10, "constant", learning_rate=1e-3)
        self.check(10, "constant_with_warmup", learning_rate=1e-3, warmup_steps=4)


class DeepSpeedSchedulesTest(unittest.TestCase):
    """Loom's DeepSpeed schedules (explicit values, no Trainer) against deepspeed.runtime."""

    def check(self, scheduler, steps):
        ds = {"train_micro_batch_size_per_gpu": 2,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "scheduler": scheduler}
        loom = loom_resolve(ds, {}, steps)
        self.assertEqual(loom["resolved"], [])
        for s, (mine, theirs) in enumerate(zip(loom["learning_rates"],
                                               ds_learning_rates(ds, steps))):
            self.assertAlmostEqual(mine, theirs, places=15, msg="step %d" % s)

    def test_warmup_lr_log_and_linear(self):
        self.check({"type": "WarmupLR", "params": {"warmup_min_lr": 1e-5, "warmup_max_lr": 1e-3,
                                                   "warmup_num_steps": 10}}, 20)
        self.check({"type": "WarmupLR", "params": {"warmup_max_lr": 1e-3, "warmup_num_steps": 5,
                                                   "warmup_type": "linear"}}, 12)

    def test_warmup_decay_lr(self):
        self.check({"type": "WarmupDecayLR", "params": {
            "warmup_max_lr": 1e-3, "warmup_num_steps": 4, "total_num_steps": 30,
            "warmup_type": "linear"}}, 35)

    def test_warmup_cosine_lr(self):
        self.check({"type": "WarmupCosineLR", "params": {
            "total_num_steps": 40, "warmup_num_steps": 6, "warmup_min_ratio": 0.1,
            "cos_min_ratio": 0.01}}, 40)


if __name__ == "__main__":
    LOOMCTL = sys.argv.pop(1)
    unittest.main()

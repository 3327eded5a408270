#!/opt/loom/venv/bin/python3
"""Tests of tests/python/deepspeed_ckpt.py: the files and partitions it writes follow DeepSpeed's
layout rules as stated in docs/design/TECHNIQUES.md §1.3 / §5.1 (checked here from those rules,
element by element, not by reading back through the module), and read_fp32_state_dict (zero_to_fp32's
reconstruction) returns the original tensors bit for bit. Run with /opt/loom/venv/bin/python3."""
import collections
import math
import os
import sys
import tempfile
import unittest

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepspeed_ckpt  # noqa: E402


def model():
    g = torch.Generator().manual_seed(0)
    # numels 21, 5, 1, 16: none divisible by 3, one by 2.
    return collections.OrderedDict([
        ("model.embed_tokens.weight", torch.randn(7, 3, generator=g)),
        ("model.norm.weight", torch.randn(5, generator=g)),
        ("scale", torch.randn(1, generator=g)),
        ("lm_head.weight", torch.randn(4, 4, generator=g))])


class DeepSpeedLayoutTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_stage3_files_and_per_parameter_partitions(self):
        t = model()
        for n in (1, 2, 3):
            save = os.path.join(self.dir, "s3_%d" % n)
            tag_dir = deepspeed_ckpt.write(save, t, n, 3, tag="global_step7")
            with open(os.path.join(save, "latest")) as f:
                self.assertEqual(f.read(), "global_step7")
            expected = sorted(["zero_pp_rank_%d_mp_rank_00_%s_states.pt" % (r, k)
                               for r in range(n) for k in ("model", "optim")])
            self.assertEqual(sorted(os.listdir(tag_dir)), expected)
            for r in range(n):
                ms = torch.load(os.path.join(tag_dir, "zero_pp_rank_%d_mp_rank_00_model_states.pt" % r), weights_only=False)
                self.assertEqual(list(ms["param_shapes"][0].items()),
                                 [(k, v.shape) for k, v in t.items()])
                self.assertTrue(all(v.numel() == 0 for v in ms["module"].values()))
                self.assertEqual(ms["dp_world_size"], n)
                osd = torch.load(os.path.join(
                    tag_dir, "zero_pp_rank_%d_mp_rank_00_optim_states.pt" % r), weights_only=False)["optimizer_state_dict"]
                self.assertEqual((osd["zero_stage"], osd["partition_count"]), (3, n))
                flat = torch.cat(osd["fp32_flat_groups"])
                # Rank r's partition of each param: elements [r p, min((r+1) p, numel)), zero-padded
                # to p = ceil(numel / N); params back to back, no alignment.
                want = []
                for v in t.values():
                    e = v.reshape(-1).tolist()
                    p = math.ceil(len(e) / n)
                    chunk = e[r * p:(r + 1) * p]
                    want += chunk + [0.0] * (p - len(chunk))
                self.assertEqual(flat.tolist(), want)

    def test_stage3_sub_groups_cut_at_parameter_boundaries(self):
        t = model()
        tag_dir = deepspeed_ckpt.write(self.dir, t, 3, 3, sub_group_size=8)
        osd = torch.load(os.path.join(tag_dir, "zero_pp_rank_0_mp_rank_00_optim_states.pt"), weights_only=False)
        # partitions 7, 2, 1, 6: a sub-group closes once it holds >= 8 elements.
        self.assertEqual([g.numel() for g in osd["optimizer_state_dict"]["fp32_flat_groups"]], [9, 7])

    def test_stage1_and_2_flat_group_padded_to_2n_and_split_evenly(self):
        t = model()
        total = sum(v.numel() for v in t.values())  # 43
        for stage in (1, 2):
            for n in (2, 3):
                save = os.path.join(self.dir, "s%d_%d" % (stage, n))
                tag_dir = deepspeed_ckpt.write(save, t, n, stage, bf16=True)
                expected = ["mp_rank_00_model_states.pt"] + [
                    "bf16_zero_pp_rank_%d_mp_rank_00_optim_states.pt" % r for r in range(n)]
                self.assertEqual(sorted(os.listdir(tag_dir)), sorted(expected))
                ms = torch.load(os.path.join(tag_dir, "mp_rank_00_model_states.pt"), weights_only=False)
                self.assertEqual(ms["module"]["lm_head.weight"].dtype, torch.bfloat16)
                padded = math.ceil(total / (2 * n)) * 2 * n
                flat = torch.cat([v.reshape(-1) for v in t.values()] +
                                 [torch.zeros(padded - total)])
                for r in range(n):
                    osd = torch.load(os.path.join(
                        tag_dir, "bf16_zero_pp_rank_%d_mp_rank_00_optim_states.pt" % r), weights_only=False)
                    part = osd["optimizer_state_dict"]["single_partition_of_fp32_groups"]
                    self.assertEqual(len(part), 1)
                    size = padded // n
                    self.assertTrue(torch.equal(part[0], flat[r * size:(r + 1) * size]))

    def test_zero_to_fp32_reconstruction_is_bit_exact(self):
        t = model()
        g = torch.Generator().manual_seed(1)
        moments = {k: (torch.randn(v.shape, generator=g), torch.randn(v.shape, generator=g))
                   for k, v in t.items()}
        for stage in (0, 1, 2, 3):
            for n in (1, 2, 3):
                save = os.path.join(self.dir, "r%d_%d" % (stage, n))
                deepspeed_ckpt.write(save, t, n, stage, moments=moments, sub_group_size=8)
                s = deepspeed_ckpt.read_fp32_state_dict(save)
                self.assertEqual(list(s), list(t))
                for k in t:
                    self.assertTrue(torch.equal(s[k], t[k]), (stage, n, k))

    def test_bad_arguments_name_the_field(self):
        t = model()
        with self.assertRaisesRegex(ValueError, "stage"):
            deepspeed_ckpt.write(self.dir, t, 2, 4)
        with self.assertRaisesRegex(ValueError, "world_size"):
            deepspeed_ckpt.write(self.dir, t, 0, 3)
        with self.assertRaisesRegex(ValueError, r"tensors\['scale'\]"):
            deepspeed_ckpt.write(self.dir, dict(t, scale=torch.ones(1, dtype=torch.float64)), 2, 3)
        with self.assertRaisesRegex(ValueError, r"moments\['model.norm.weight'\]"):
            deepspeed_ckpt.write(self.dir, t, 2, 3, moments={k: (v, v) for k, v in t.items()
                                                             if k != "model.norm.weight"})


if __name__ == "__main__":
    unittest.main()

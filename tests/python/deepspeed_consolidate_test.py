#!/opt/loom/venv/bin/python3
"""`loomctl consolidate --from-deepspeed DIR` against DeepSpeed-layout ZeRO checkpoints written by
deepspeed_ckpt.py (PyTorch 2.11 (the project venv), torch.save of DeepSpeed's dictionaries and partitions), the
export compared tensor for tensor with deepspeed_ckpt.read_fp32_state_dict, a zero_to_fp32
equivalent that shares no code with Loom's reader; the bad-input cases check the exit status
and that the message names the file. Run with /opt/loom/venv/bin/python3.

Environment: LOOMCTL (path of loomctl; default the Bazel runfile), DS_CONSOLIDATE_LARGE_MB (size
of the stage-3 checkpoint of the peak-RSS case; default 256), DS_CONSOLIDATE_ONLY_LARGE=1 (run
only that case: the >= 2 GB acceptance run, //tests/python:deepspeed_consolidate_2gb_test).
"""
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_export  # noqa: E402
import deepspeed_ckpt  # noqa: E402

LOOMCTL = os.environ.get("LOOMCTL", os.path.join("services", "cli", "loomctl"))
RSS_LIMIT = 64 << 20


def run_loomctl(args):
    """(exit status, stdout, stderr) of `loomctl consolidate ARGS`."""
    p = subprocess.run([LOOMCTL, "consolidate"] + args, capture_output=True, text=True,
                       timeout=1800)
    return p.returncode, p.stdout, p.stderr


def run_loomctl_rss(args):
    """(exit status, stderr, peak RSS in bytes of the loomctl process).

    The peak is GNU time's %M (wait4's ru_maxrss of its child). It is measured through
    /usr/bin/time, a small process, because Linux carries the high-water mark of the memory a
    process had before exec into ru_maxrss: a child forked straight from this Python process,
    which holds the fixture's tensors, would report this process's size instead of loomctl's."""
    with tempfile.NamedTemporaryFile("r") as rss:
        p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name, LOOMCTL, "consolidate"]
                           + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           timeout=3600)
        return p.returncode, p.stderr, int(rss.read().split()[-1]) * 1024


def small_model(seed=0):
    """Llama-style names; numels 21, 35, 5, 12, 9, 1: none divisible by 2 or 3 except 12."""
    g = torch.Generator().manual_seed(seed)
    shapes = [("model.embed_tokens.weight", (7, 3)),
              ("model.layers.0.self_attn.q_proj.weight", (5, 7)),
              ("model.layers.0.input_layernorm.weight", (5,)),
              ("model.layers.0.mlp.up_proj.weight", (4, 3)),
              ("model.layers.0.mlp.down_proj.weight", (3, 3)),
              ("model.norm.weight", (1,))]
    return collections.OrderedDict((n, torch.randn(*s, generator=g)) for n, s in shapes)


class DeepSpeedConsolidateTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR"))
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def consolidate(self, save_dir, *extra):
        out = os.path.join(self.dir, "out_%d" % len(os.listdir(self.dir)))
        rc, stdout, stderr = run_loomctl(["--from-deepspeed", save_dir, "--output_dir", out]
                                            + list(extra))
        self.assertEqual(rc, 0, stderr)
        return out, stdout

    def assert_equal_to_reference(self, save_dir, out, tied_alias=None):
        ref = deepspeed_ckpt.read_fp32_state_dict(save_dir)
        got = check_export.read_model_tensors(out)
        expected = sorted(n for n in ref if n != tied_alias)
        self.assertEqual(sorted(got), expected)
        for n in expected:
            self.assertEqual(got[n].dtype, torch.float32, n)
            self.assertEqual(tuple(got[n].shape), tuple(ref[n].shape), n)
            # Frozen bf16/fp16 parameters: zero_to_fp32 keeps their dtype, Loom widens to fp32.
            self.assertTrue(torch.equal(got[n], ref[n].float()), n)
        if tied_alias is not None:
            self.assertTrue(torch.equal(ref[tied_alias], got["model.embed_tokens.weight"]))

    def test_stage2_and_3_with_2_and_3_ranks_equal_zero_to_fp32(self):
        t = small_model()
        groups = [list(t)[:3], list(t)[3:]]  # two optimizer param groups
        for stage in (1, 2, 3):
            for n in (2, 3):
                with self.subTest(stage=stage, world_size=n):
                    save = os.path.join(self.dir, "s%d_n%d" % (stage, n))
                    deepspeed_ckpt.write(save, t, n, stage, groups=groups, sub_group_size=8,
                                         shared_params={"lm_head.weight":
                                                        "model.embed_tokens.weight"},
                                         deepspeed_objects=True,
                                         moments={k: (v + 1, v * v) for k, v in t.items()})
                    out, stdout = self.consolidate(save)
                    self.assert_equal_to_reference(save, out, tied_alias="lm_head.weight")
                    self.assertIn("lm_head.weight", stdout)  # reported as stored once
                    self.assertIn("ZeRO-%d" % stage, stdout)

    def test_tag_dir_bf16_files_wrapper_prefix_and_sharding(self):
        t = collections.OrderedDict(("module." + k, v) for k, v in small_model(1).items())
        save = os.path.join(self.dir, "bf16")
        tag_dir = deepspeed_ckpt.write(save, t, 3, 3, bf16=True, tag="step7")
        out, _ = self.consolidate(tag_dir, "--max_shard_size=100")  # the tag directory itself
        ref = deepspeed_ckpt.read_fp32_state_dict(save)
        got = check_export.read_model_tensors(out)  # checks the index against the shards
        self.assertTrue(os.path.exists(os.path.join(out, "model.safetensors.index.json")))
        self.assertEqual(sorted(got), sorted(k[len("module."):] for k in ref))
        for k, v in ref.items():
            self.assertTrue(torch.equal(got[k[len("module."):]], v), k)

    def frozen_model(self, dtype, seed=5):
        """Frozen (requires_grad=False) parameters beside small_model's trainable ones: numels
        21, 35 and 5 (not all divisible by 2 or 3), in `dtype`; the fp16 case holds a subnormal,
        -0.0 and the largest half value."""
        g = torch.Generator().manual_seed(seed)
        shapes = [("model.embed_tokens.weight", (7, 3)),
                  ("model.layers.0.self_attn.k_proj.weight", (5, 7)),
                  ("model.layers.0.post_attention_layernorm.weight", (5,))]
        frozen = collections.OrderedDict(
            (n, torch.randn(*s, generator=g).to(dtype)) for n, s in shapes)
        if dtype == torch.float16:
            frozen["model.layers.0.post_attention_layernorm.weight"] = torch.tensor(
                [6e-8, -0.0, 65504.0, 1e-5, -3.5], dtype=torch.float16)
        trainable = collections.OrderedDict(
            (k, v) for k, v in small_model().items() if k != "model.embed_tokens.weight")
        return trainable, frozen

    def test_frozen_params_stage2_and_3_equal_zero_to_fp32(self):
        for stage in (2, 3):
            for n in (2, 3):
                for dtype in (torch.float32, torch.bfloat16, torch.float16):
                    with self.subTest(stage=stage, world_size=n, dtype=dtype):
                        t, frozen = self.frozen_model(dtype)
                        save = os.path.join(self.dir, "frozen_s%d_n%d_%s" % (stage, n, dtype))
                        # lm_head tied to the frozen embedding, as a frozen-embedding fine-tune has it.
                        deepspeed_ckpt.write(save, t, n, stage, frozen=frozen, sub_group_size=8,
                                             shared_params={"lm_head.weight":
                                                            "model.embed_tokens.weight"})
                        out, _ = self.consolidate(save)
                        ref = deepspeed_ckpt.read_fp32_state_dict(save)
                        for name, v in frozen.items():  # the reference keeps the stored dtype
                            self.assertEqual(ref[name].dtype, dtype, name)
                            self.assertTrue(torch.equal(ref[name], v), name)
                        self.assert_equal_to_reference(save, out, tied_alias="lm_head.weight")

    def frozen_fixture(self, stage, n=3):
        save = os.path.join(self.dir, "bad_frozen_s%d_n%d" % (stage, n))
        t, frozen = self.frozen_model(torch.bfloat16)
        tag = deepspeed_ckpt.write(save, t, n, stage, frozen=frozen)
        model = os.path.join(tag, "mp_rank_00_model_states.pt" if stage < 3 else
                             "zero_pp_rank_1_mp_rank_00_model_states.pt")
        return save, tag, model

    def test_frozen_fragment_missing_or_wrong_size(self):
        name = "model.layers.0.self_attn.k_proj.weight"  # 35 elements: 12 per rank at N = 3
        for stage in (2, 3):
            with self.subTest(stage=stage, case="missing"):
                save, tag, model = self.frozen_fixture(stage)
                states = torch.load(model, weights_only=False)
                del states["frozen_param_fragments"][name]
                torch.save(states, model)
                self.expect_error(save, 3, model, "frozen_param_fragments has no '%s'" % name)
            with self.subTest(stage=stage, case="wrong size"):
                save, tag, model = self.frozen_fixture(stage)
                states = torch.load(model, weights_only=False)
                frag = states["frozen_param_fragments"][name]
                states["frozen_param_fragments"][name] = frag.reshape(-1)[:-1].clone()
                torch.save(states, model)
                want = 35 if stage < 3 else 12
                self.expect_error(save, 3, model, name, "has %d elements, expected %d"
                                  % (want - 1, want))
            with self.subTest(stage=stage, case="no fragments dict"):
                save, tag, model = self.frozen_fixture(stage)
                states = torch.load(model, weights_only=False)
                states["frozen_param_fragments"] = None
                torch.save(states, model)
                self.expect_error(save, 3, model, "no 'frozen_param_fragments'")
        with self.subTest(case="stage 3 rank model-states file missing"):
            save, tag, model = self.frozen_fixture(3)
            os.remove(model)
            self.expect_error(save, 9, model, "missing")

    # ---- bad input: exit status and the file named --------------------------------------

    def fixture(self, stage=3, n=3):
        save = os.path.join(self.dir, "bad_s%d_n%d" % (stage, n))
        tag = deepspeed_ckpt.write(save, small_model(), n, stage)
        return save, tag

    def expect_error(self, save_dir, code, *needles):
        never = tempfile.mkdtemp(prefix="never_", dir=self.dir)  # one per call: subtests apart
        rc, _, stderr = run_loomctl(["--from-deepspeed", save_dir, "--output_dir", never])
        self.assertEqual(rc, code, stderr)
        for needle in needles:
            self.assertIn(needle, stderr)
        self.assertFalse(os.path.exists(os.path.join(never, "model.safetensors")))
        return stderr

    def test_missing_rank_file(self):
        for stage in (2, 3):
            save, tag = self.fixture(stage)
            missing = os.path.join(tag, "zero_pp_rank_1_mp_rank_00_optim_states.pt")
            os.remove(missing)
            self.expect_error(save, 9, missing, "missing")  # FAILED_PRECONDITION

    def test_truncated_archive(self):
        save, tag = self.fixture()
        path = os.path.join(tag, "zero_pp_rank_2_mp_rank_00_optim_states.pt")
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
        self.expect_error(save, 15, path, "truncated")  # DATA_LOSS

    def test_storage_record_shorter_than_its_tensor(self):
        # A zip whose fp32 partition record holds fewer bytes than the pickle says.
        save, tag = self.fixture()
        path = os.path.join(tag, "zero_pp_rank_0_mp_rank_00_optim_states.pt")
        with zipfile.ZipFile(path) as z:
            records = {i.filename: z.read(i.filename) for i in z.infolist()}
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
            for name, data in records.items():
                z.writestr(name, data[:8] if name.endswith("/data/0") else data)
        self.expect_error(save, 15, path, "data/0")  # DATA_LOSS

    def test_shape_numel_mismatch(self):
        for stage in (2, 3):
            save, tag = self.fixture(stage)
            model = os.path.join(tag, "mp_rank_00_model_states.pt" if stage < 3 else
                                 "zero_pp_rank_0_mp_rank_00_model_states.pt")
            states = torch.load(model, weights_only=False)
            states["param_shapes"][0]["model.layers.0.mlp.up_proj.weight"] = torch.Size([40, 3])
            torch.save(states, model)
            self.expect_error(save, 3, model, "numel mismatch")  # INVALID_ARGUMENT

    def test_world_size_mismatch(self):
        save, tag = self.fixture(2, 2)
        extra = os.path.join(tag, "zero_pp_rank_2_mp_rank_00_optim_states.pt")
        shutil.copy(os.path.join(tag, "zero_pp_rank_1_mp_rank_00_optim_states.pt"), extra)
        self.expect_error(save, 9, extra, "world size mismatch")
        os.remove(extra)
        model = os.path.join(tag, "mp_rank_00_model_states.pt")
        states = torch.load(model, weights_only=False)
        states["dp_world_size"] = 4
        torch.save(states, model)
        self.expect_error(save, 9, model, "dp_world_size 4")

    def test_pickled_code_is_refused_never_run(self):
        marker = os.path.join(self.dir, "pwned")

        class Exploit:
            def __reduce__(self):
                return (os.system, ("touch " + marker,))

        save, tag = self.fixture()
        model = os.path.join(tag, "zero_pp_rank_0_mp_rank_00_model_states.pt")
        states = torch.load(model, weights_only=False)
        states["lr_scheduler"] = Exploit()
        torch.save(states, model)
        self.assertFalse(os.path.exists(marker))
        stderr = self.expect_error(save, 3, model, "GLOBAL", "system")
        self.assertIn("data.pkl", stderr)
        self.assertFalse(os.path.exists(marker))

    def test_missing_directory_and_key(self):
        self.expect_error(os.path.join(self.dir, "nope"), 5, os.path.join(self.dir, "nope"))
        save, tag = self.fixture()
        path = os.path.join(tag, "zero_pp_rank_1_mp_rank_00_optim_states.pt")
        states = torch.load(path, weights_only=False)
        del states["optimizer_state_dict"]["fp32_flat_groups"]
        torch.save(states, path)
        self.expect_error(save, 3, path, "fp32_flat_groups")

    # ---- bounded memory ------------------------------------------------------------------

    def test_large_stage3_checkpoint_peak_rss_under_64_mib(self):
        size_mb = int(os.environ.get("DS_CONSOLIDATE_LARGE_MB", "256"))
        hidden = 1024
        rows = max(1, (size_mb << 20) // 4 // 8 // hidden)  # 8 parameters of rows x hidden (+3)
        g = torch.Generator().manual_seed(3)
        t = collections.OrderedDict()
        for i in range(8):
            t["model.layers.%d.mlp.up_proj.weight" % i] = torch.randn(rows, hidden + 3, generator=g)
        t["model.norm.weight"] = torch.randn(hidden + 3, generator=g)
        save = os.path.join(self.dir, "large")
        deepspeed_ckpt.write(save, t, 3, 3, sub_group_size=rows * hidden)
        del t
        ckpt_bytes = sum(os.path.getsize(os.path.join(save, "global_step1", f))
                         for f in os.listdir(os.path.join(save, "global_step1")))
        out = os.path.join(self.dir, "large_out")
        rc, stderr, peak = run_loomctl_rss(["--from-deepspeed", save, "--output_dir", out])
        self.assertEqual(rc, 0, stderr)
        print("deepspeed consolidate: checkpoint_bytes=%d peak_rss_bytes=%d" % (ckpt_bytes, peak))
        self.assertLess(peak, RSS_LIMIT)
        self.assert_equal_to_reference(save, out)


if __name__ == "__main__":
    if os.environ.get("DS_CONSOLIDATE_ONLY_LARGE") == "1":
        sys.argv[1:] = ["DeepSpeedConsolidateTest.test_large_stage3_checkpoint_peak_rss_under_64_mib"]
    unittest.main(verbosity=2)

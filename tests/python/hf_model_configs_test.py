#!/opt/loom/venv/bin/python3
"""transformers judges how Loom reads model config.json files (spec/model_config.h, spec/rope.h).

  * RoPE: for every scaling type transformers implements for Llama (default, linear, dynamic,
    yarn, longrope, llama3) with realistic parameters (Llama 3.1/3.2, Qwen2.5's YaRN, Phi-3's
    LongRoPE, ...), in the transformers 4 layout (rope_theta + rope_scaling) and the
    transformers 5 layout (rope_parameters), Loom's inv_freq and attention_scaling
    (//spec:rope_dump)
    equal transformers' LlamaRotaryEmbedding after its forward on SEQ positions (inv_freq as
    ROPE_INIT_FUNCTIONS / compute_default_rope_parameters computed it, updated by
    dynamic_rope_update for dynamic and longrope). transformers computes in float32, Loom in
    float64, so the tolerance is float32's: relative 2e-6 on inv_freq, 1e-12 on attention_scaling
    (a Python float on both sides).
  * Loom's export of each config, loaded by transformers (LlamaConfig.from_dict), gives the same
    rotary embedding as the original config (bit for bit: the same float32 computation).
  * Keys: LlamaConfig, Qwen2Config, Qwen3Config and MistralConfig with their defaults and with
    each scaling variant, `.to_dict()` as save_pretrained writes it: Loom neither refuses nor
    warns on any key (every key transformers writes is known to Loom); a key it does not know is
    refused.

Usage: hf_model_configs_test.py ROPE_DUMP. Run with /opt/loom/venv/bin/python3 (transformers
5.25, torch 2.11).
"""
import json
import math
import subprocess
import sys
import unittest

import torch
from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

ROPE_DUMP = None
INV_FREQ_RTOL = 2e-6  # float32 (transformers) against float64 (Loom)

LLAMA_8B = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "num_hidden_layers": 32, "vocab_size": 128256}
# head_dim 96 as Phi-3-mini (3072 / 32): LongRoPE factor lists have 48 entries.
PHI3_MINI = {"hidden_size": 3072, "num_attention_heads": 32, "intermediate_size": 8192,
             "num_hidden_layers": 32, "vocab_size": 32064}
SHORT_FACTOR = [1.0 + 0.01 * i for i in range(48)]
LONG_FACTOR = [1.0 + 0.5 * i for i in range(48)]

# name -> (dims, max_position_embeddings, rope_theta, scaling block or None, seq lengths)
VARIANTS = {
    "default": (LLAMA_8B, 2048, 10000.0, None, [2048]),
    "default_smollm2_base": (LLAMA_8B, 8192, 100000.0, None, [4096]),
    "linear": (LLAMA_8B, 8192, 10000.0, {"rope_type": "linear", "factor": 4.0}, [8192]),
    # Within max_position_embeddings dynamic equals default; past it the base grows.
    "dynamic": (LLAMA_8B, 2048, 10000.0, {"rope_type": "dynamic", "factor": 2.0},
                [1024, 2048, 3000]),
    "yarn_qwen25": (LLAMA_8B, 131072, 1000000.0,
                    {"rope_type": "yarn", "factor": 4.0,
                     "original_max_position_embeddings": 32768}, [4096]),
    "yarn_tuned": (LLAMA_8B, 65536, 10000.0,
                   {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096,
                    "beta_fast": 16, "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 1.0,
                    "truncate": False}, [4096]),
    "yarn_attention_factor": (LLAMA_8B, 32768, 500000.0,
                              {"rope_type": "yarn", "factor": 8.0, "attention_factor": 1.25,
                               "original_max_position_embeddings": 4096}, [4096]),
    # Short factors up to original_max_position_embeddings, long ones past it.
    "longrope_phi3": (PHI3_MINI, 131072, 10000.0,
                      {"rope_type": "longrope", "short_factor": SHORT_FACTOR,
                       "long_factor": LONG_FACTOR, "original_max_position_embeddings": 4096},
                      [4096, 4097]),
    "longrope_factor": (PHI3_MINI, 131072, 10000.0,
                        {"rope_type": "longrope", "short_factor": SHORT_FACTOR,
                         "long_factor": LONG_FACTOR, "factor": 32.0,
                         "original_max_position_embeddings": 4096}, [2048, 8192]),
    "llama31": (LLAMA_8B, 131072, 500000.0,
                {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, [8192]),
    "llama32": (LLAMA_8B, 131072, 500000.0,
                {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, [8192]),
}


def t4_layout(name):
    """config.json as transformers 4 wrote it: top-level rope_theta, rope_scaling."""
    dims, mpe, theta, block, _ = VARIANTS[name]
    return dict(dims, model_type="llama", max_position_embeddings=mpe, rope_theta=theta,
                rope_scaling=block)


def t5_layout(name):
    """config.json as transformers 5 writes it (LlamaConfig(...).to_dict())."""
    return LlamaConfig.from_dict(t4_layout(name)).to_dict()


def loom(config, seq_len):
    out = subprocess.run([ROPE_DUMP, str(seq_len)], input=json.dumps(config),
                         capture_output=True, text=True, timeout=60)
    result = json.loads(out.stdout)
    if out.returncode != 0:
        raise AssertionError(f"Loom refused the config: {result.get('error')}")
    return result


def hf_rotary(config_dict, seq_len):
    """transformers' inv_freq (float32) and attention_scaling for a forward on seq_len positions."""
    cfg = LlamaConfig.from_dict(config_dict)
    rotary = LlamaRotaryEmbedding(cfg)
    rope_type = cfg.rope_parameters.get("rope_type", "default")
    if rope_type == "default":
        init, scale = LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    else:
        init, scale = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu")
    assert torch.equal(rotary.inv_freq, init) and rotary.attention_scaling == scale
    x = torch.zeros(1, seq_len, 8)
    rotary(x, torch.arange(seq_len)[None])  # dynamic_rope_update picks the seq_len's frequencies
    return rotary.inv_freq.clone(), float(rotary.attention_scaling)


class RopeTest(unittest.TestCase):
    def check(self, name, layout):
        config = layout(name)
        for seq_len in VARIANTS[name][4]:
            with self.subTest(variant=name, layout=layout.__name__, seq_len=seq_len):
                want_inv, want_scale = hf_rotary(config, seq_len)
                got = loom(config, seq_len)
                self.assertEqual(got["warnings"], [])
                got_inv = torch.tensor(got["inv_freq"], dtype=torch.float64)
                self.assertEqual(got_inv.shape, want_inv.shape)
                rel = ((got_inv - want_inv.double()).abs() / want_inv.double().abs()).max().item()
                print(f"{name} {layout.__name__} seq {seq_len}: max rel inv_freq diff {rel:.2e}, "
                      f"attention_scaling {got['attention_scaling']:.12f} "
                      f"(transformers {want_scale:.12f})")
                self.assertLessEqual(rel, INV_FREQ_RTOL)
                self.assertLessEqual(abs(got["attention_scaling"] - want_scale),
                                     1e-12 * abs(want_scale))
                # Loom's export, loaded by transformers, is the same rotary embedding.
                back_inv, back_scale = hf_rotary(got["export"], seq_len)
                self.assertTrue(torch.equal(back_inv, want_inv), f"{name}: export differs")
                self.assertEqual(back_scale, want_scale)

    def test_every_scaling_type_in_both_layouts(self):
        for name in VARIANTS:
            self.check(name, t4_layout)
            self.check(name, t5_layout)

    def test_the_variants_differ(self):
        # The comparison above can fail: the scaling types give different frequencies.
        plain = loom(t4_layout("llama31"), 8192)
        base = loom(dict(t4_layout("llama31"), rope_scaling=None), 8192)
        self.assertGreater(max(abs(a - b) for a, b in zip(plain["inv_freq"], base["inv_freq"])),
                           1e-4)
        short = loom(t4_layout("longrope_phi3"), 4096)
        long = loom(t4_layout("longrope_phi3"), 4097)
        self.assertNotEqual(short["inv_freq"], long["inv_freq"])

    def test_transformers5_rope_base_is_read(self):
        # SmolLM2 saved by transformers 5: rope_parameters only. Loom once trained it with 10000.
        config = t5_layout("default_smollm2_base")
        self.assertNotIn("rope_theta", config)
        got = loom(config, 16)
        self.assertAlmostEqual(got["inv_freq"][1], 100000.0 ** (-2 / 128), delta=1e-15)
        self.assertEqual(got["export"]["rope_theta"], 100000.0)


class KeysTest(unittest.TestCase):
    def test_every_key_transformers_writes_is_known(self):
        configs = {"LlamaConfig": LlamaConfig().to_dict(), "Qwen2Config": Qwen2Config().to_dict(),
                   "Qwen3Config": Qwen3Config().to_dict(),
                   "MistralConfig": MistralConfig().to_dict(),
                   "MistralConfig(sliding_window=None)":
                       MistralConfig(sliding_window=None).to_dict()}
        for name in VARIANTS:
            configs[f"LlamaConfig({name})"] = t5_layout(name)
            dims = VARIANTS[name][0]
            configs[f"Qwen3Config({name})"] = Qwen3Config.from_dict(
                dict(t4_layout(name), model_type="qwen3",
                     head_dim=dims["hidden_size"] // dims["num_attention_heads"])).to_dict()
        for name, config in configs.items():
            with self.subTest(config=name):
                got = loom(config, 16)
                self.assertEqual(got["warnings"], [], name)
                print(f"{name}: {len(config)} keys, accepted without warnings")

    def test_an_unknown_key_is_refused(self):
        # The check above can fail: a key that neither Loom reads nor transformers writes is
        # refused (transformers would keep it as an attribute and train with the default).
        config = dict(LlamaConfig().to_dict(), rms_norm_epsilon=1e-5)
        out = subprocess.run([ROPE_DUMP, "16"], input=json.dumps(config), capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(out.returncode, 1)
        self.assertEqual(json.loads(out.stdout)["error"],
                         "model.config.rms_norm_epsilon: unknown key (did you mean rms_norm_eps?)")


if __name__ == "__main__":
    ROPE_DUMP = sys.argv.pop(1)
    unittest.main(verbosity=2)

// File: scheduler/test_job_spec.h
//
// The reference JobSpec that must validate (a 2-layer Llama, fortunes, ZeRO-3 AdamW, 2 ranks),
// shared by the scheduler's unit tests and the service's integration test. Testonly.
#ifndef LOOM_SCHEDULER_TEST_JOB_SPEC_H_
#define LOOM_SCHEDULER_TEST_JOB_SPEC_H_

#include "proto/common.pb.h"

namespace loom {

// model.config {vocab_size 256, hidden_size 64, intermediate_size 176, num_hidden_layers 2,
// num_attention_heads 4, num_key_value_heads 2, max_position_embeddings 128, rms_norm_eps 1e-5,
// rope_theta 10000, tie_word_embeddings true}, dataset {name "fortunes"}, deepspeed_config
// {train_micro_batch_size_per_gpu 4, gradient_accumulation_steps 1, gradient_clipping 1.0,
// optimizer {AdamW, lr 1e-3, betas [0.9, 0.95], eps 1e-8, weight_decay 0.01},
// zero_optimization {stage 3}}, resources {num_ranks 2}, training {steps 20, sequence_length
// 64, seed 1}, checkpoint {interval_steps 10}.
loom::v1::JobSpec ValidTestJobSpec();

// ValidTestJobSpec() with resources.num_ranks = `num_ranks`.
loom::v1::JobSpec TestJobSpecWithRanks(int num_ranks);

}  // namespace loom

#endif  // LOOM_SCHEDULER_TEST_JOB_SPEC_H_

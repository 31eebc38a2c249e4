#!/usr/bin/env bash
# GRPO + the length coefficient on one GPU with verl 0.9.1: Qwen2.5-0.5B-Instruct on GSM8K (docs/verl.md).
#
# Correct rollouts longer than the shortest correct one of their group are scaled by
# 1 / (1 + c * (L - L_ref) / L_ref) (docs/reference/length-coefficient.md §3.1; c = length_penalty_coeff,
# L the response_mask token count, L_ref >= length_penalty_min_tokens). `algorithm.adv_estimator=length_grpo`
# (registered by verl_adapter) mean-centres all-correct groups without std scaling and keeps GRPO's
# normalization for mixed groups (§3.3). DAPO dynamic sampling (`algorithm.filter_groups`) judges the shaped
# rewards, so all-correct groups whose lengths differ stay in the batch. Metrics: `length_penalty/coeff*`.
#
# Data, once (verl's docs; from a verl checkout):
#   python3 examples/data_preprocess/gsm8k.py --local_save_dir ~/data/gsm8k
# Run:   bash recipes/verl/grpo_length_coeff_qwen2.5-0.5b.sh [extra Hydra overrides]
# First, on a laptop's CPU (2 steps through verl's own trainer on the embedded model, about two minutes;
# docs/verl.md, "Try your config on a laptop"):   trl-length verl-smoke recipes/verl/grpo_length_coeff_qwen2.5-0.5b.sh [extra overrides]
set -euo pipefail

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}

# The overrides checked first, in seconds and without Ray (docs/verl.md, "Check a verl config on a laptop").
python3 -m verl_adapter.tools.check "${BASH_SOURCE[0]}" "$@"

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=length_grpo \
    algorithm.use_kl_in_reward=False \
    +length_penalty_coeff=0.5 \
    +length_penalty_min_tokens=64 \
    algorithm.filter_groups.enable=True \
    algorithm.filter_groups.metric=reward \
    algorithm.filter_groups.max_inflight_gen_batches=2 \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=32 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
    trainer.critic_warmup=0 \
    trainer.logger='["console"]' \
    trainer.project_name=trl_length_plugin \
    trainer.experiment_name=grpo_length_coeff_qwen2.5-0.5b_gsm8k \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=10 \
    trainer.total_epochs=1 \
    "$@"

#!/usr/bin/env bash
# Run large-zero1: model large (24 layers, hidden 1024, 16 heads, seq 1024, 354,871,296
# parameters), fp16, micro-batch 1, global batch 16, gradient accumulation 8.
# Vocabulary: 50,304 embedding rows (50,257 tokens padded for tp 1); the data's tokenizer could
# not be read.
# Strategy zero1: tp 1 x pp 1 x dp 2, ZeRO-1; world size 2 on node1(1), node2(1); device cuda.
# Launch: `bash launch.sh` on the first host; the deepspeed launcher starts the ranks through
# pdsh. Every host needs the same paths (upstream, data, this run directory).
# Expect 50 iterations: an iteration line every 10 (5 lines, from the last rank), Megatron timers
# (--timing-log-level 2), DeepSpeed's wall-clock breakdown (rank 0).
# Adjusted micro_batch_size: 2 -> 1 (upstream's non-flash attention fails with a micro-batch > 1
# ('view size is not compatible with input tensor's size and stride' in CoreAttention, seen on CPU
# and on an H200); the global batch is reached by gradient accumulation).
# Output goes to stdout/stderr: the executor captures it.
set -euo pipefail

cd -- /opt/Megatron-DeepSpeed
# The venv's interpreter first: upstream's Makefile builds its C++ dataset helpers with
# the python3 it finds on PATH.
export PATH=/venv/bin:"${PATH}"
if [ -z "${DS_ENV_FILE:-}" ]; then
  export DS_ENV_FILE=/RUNS/large-zero1/20261122T021500Z/deepspeed_env
fi
exec /venv/bin/deepspeed \
  --hostfile /RUNS/large-zero1/20261122T021500Z/hostfile \
  --launcher pdsh \
  --master_addr node1 \
  --master_port 29500 \
  /opt/Megatron-DeepSpeed/pretrain_gpt.py \
  --tensor-model-parallel-size 1 \
  --pipeline-model-parallel-size 1 \
  --no-pipeline-parallel \
  --num-layers 24 \
  --hidden-size 1024 \
  --num-attention-heads 16 \
  --seq-length 1024 \
  --max-position-embeddings 1024 \
  --micro-batch-size 1 \
  --global-batch-size 16 \
  --train-iters 50 \
  --lr 0.001 \
  --min-lr 0.0001 \
  --lr-decay-style cosine \
  --lr-warmup-iters 2 \
  --weight-decay 0.01 \
  --clip-grad 1.0 \
  --data-path /data/tiny/tiny_text_document \
  --vocab-file /data/tiny/vocab.json \
  --merge-file /data/tiny/merges.txt \
  --tokenizer-type GPT2BPETokenizer \
  --make-vocab-size-divisible-by 50304 \
  --split 98,1,1 \
  --eval-iters 0 \
  --eval-interval 51 \
  --num-workers 0 \
  --log-interval 10 \
  --timing-log-level 2 \
  --timing-log-option minmax \
  --deepspeed \
  --deepspeed_config /RUNS/large-zero1/20261122T021500Z/ds_config.json \
  --zero-stage 1 \
  --seed 1234 \
  --fp16 \
  --checkpoint-activations \
  --deepspeed-activation-checkpointing \
  --tensorboard-dir /RUNS/large-zero1/20261122T021500Z/tensorboard \
  --log-timers-to-tensorboard \
  --log-batch-size-to-tensorboard \
  --log-world-size-to-tensorboard \
  --log-validation-ppl-to-tensorboard \
  --log-memory-to-tensorboard

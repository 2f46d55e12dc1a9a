#!/usr/bin/env bash
# Run tiny-pipeline: model tiny (4 layers, hidden 128, 4 heads, seq 128, 874,112 parameters),
# fp32, micro-batch 1, global batch 8, gradient accumulation 8.
# Vocabulary: 512 embedding rows (488 tokens padded for tp 1); the data's tokenizer could not be
# read.
# Strategy pipeline: tp 1 x pp 2 x dp 1, ZeRO-0; world size 2 on localhost(2); device cpu.
# Launch: `bash launch.sh` on this machine (deepspeed launcher, no ssh).
# Expect 30 iterations: an iteration line every 5 (6 lines, from the last rank), Megatron timers
# (--timing-log-level 2), no DeepSpeed breakdown with PP (PipelineEngine) but its 'steps:' lines.
# Output goes to stdout/stderr: the executor captures it.
set -euo pipefail

cd -- /opt/Megatron-DeepSpeed
# The venv's interpreter first: upstream's Makefile builds its C++ dataset helpers with
# the python3 it finds on PATH.
export PATH=/venv/bin:"${PATH}"
export DS_ACCELERATOR=cpu
export OMP_NUM_THREADS=1
exec /venv/bin/deepspeed \
  --num_gpus 2 \
  --master_port 29500 \
  /opt/Megatron-DeepSpeed/pretrain_gpt.py \
  --tensor-model-parallel-size 1 \
  --pipeline-model-parallel-size 2 \
  --num-layers 4 \
  --hidden-size 128 \
  --num-attention-heads 4 \
  --seq-length 128 \
  --max-position-embeddings 128 \
  --micro-batch-size 1 \
  --global-batch-size 8 \
  --train-iters 30 \
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
  --make-vocab-size-divisible-by 512 \
  --split 98,1,1 \
  --eval-iters 0 \
  --eval-interval 31 \
  --num-workers 0 \
  --log-interval 5 \
  --timing-log-level 2 \
  --timing-log-option minmax \
  --deepspeed \
  --deepspeed_config /RUNS/tiny-pipeline/20261122T021500Z/ds_config.json \
  --zero-stage 0 \
  --seed 1234 \
  --no-gradient-accumulation-fusion \
  --normalization rmsnorm \
  --tensorboard-dir /RUNS/tiny-pipeline/20261122T021500Z/tensorboard \
  --log-timers-to-tensorboard \
  --log-batch-size-to-tensorboard \
  --log-world-size-to-tensorboard \
  --log-validation-ppl-to-tensorboard

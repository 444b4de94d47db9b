#!/usr/bin/env bash
# LoRA (Hu et al. 2022): adapt a trained run to new data by training low-rank updates of its
# attention projections, the base weights frozen; with the public commands (see README.md
# beside this file).
#
#   examples/lora/run.sh BASE_RUN TRAIN DEV TEST [key=value ...]
#
# BASE_RUN: a run directory (seq2seq-train's, or seq2seq-import's); TRAIN, DEV, TEST: parallel
# prefixes in its languages (PREFIX.SRC, PREFIX.TGT, or .gz). key=value overrides go to the
# training (they win). Environment: OUT (default runs/lora_example), STEPS (400), RANK (8),
# ALPHA (16), TARGETS (attention), LR (2e-3), PYTHON.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '6,11p' "$0" >&2; exit 2; }
S2S=("${PYTHON:-python3}" -m seq2seq)
OUT="${OUT:-runs/lora_example}" STEPS="${STEPS:-400}"
base=$1 train=$2 dev=$3 test=$4
shift 4
langs=$("${S2S[0]}" -c 'import sys, yaml; d = yaml.safe_load(open(sys.argv[1]))["data"]
print(d["src_lang"], d["tgt_lang"])' "$base/config.yaml")
read -r src_lang tgt_lang <<< "$langs"
src="$test.$src_lang" ref="$test.$tgt_lang"
[ -f "$src" ] || src="$src.gz"
[ -f "$ref" ] || ref="$ref.gz"
mkdir -p "$OUT"

# 1. the base run on the new test set
"${S2S[@]}" evaluate --workdir "$base" --src "$src" --ref "$ref" --json "$OUT/before.json"
# 2. LoRA: the base's config, weights and tokenizer (train.init_from), the new data, rank-r
#    adapters on the attention projections; train.lora_rank=0 here is full fine-tuning
"${S2S[@]}" train --config "$base/config.yaml" "workdir=$OUT/adapted" "train.init_from=$base" \
    data.train.format=text "data.train.path=$train" data.dev.format=text "data.dev.path=$dev" \
    data.test.format=text "data.test.path=$test" train.time_budget=0 "train.steps=$STEPS" \
    "train.warmup_steps=$(( STEPS / 10 > 0 ? STEPS / 10 : 1 ))" train.test_checkpoint=last \
    "train.checkpoint_every=$STEPS" "train.eval_every=$STEPS" "train.learning_rate=${LR:-2e-3}" \
    "train.lora_rank=${RANK:-8}" "train.lora_alpha=${ALPHA:-16}" \
    "train.lora_targets=[${TARGETS:-attention}]" "$@"
# 3. the adapted run on the same test set (its test.json counts the trained parameters)
"${S2S[@]}" evaluate --workdir "$OUT/adapted" --src "$src" --ref "$ref" --json "$OUT/after.json"

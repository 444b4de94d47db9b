#!/usr/bin/env bash
# Sequence-level knowledge distillation (Kim & Rush 2016), end to end with the public commands
# and configs/back_translation.yaml (see README.md beside this file).
#
#   examples/distillation/run.sh TRAIN DEV TEST [key=value ...]
#
# TRAIN, DEV, TEST: parallel prefixes (PREFIX.en and PREFIX.es, or .gz). key=value overrides
# go to both trainings. Environment: OUT (default runs/distill_example), SRC/TGT (en/es),
# CONFIG, PYTHON, TEACHER (the teacher's overrides; default the preset's width) and
# TEACHER_SEARCH (its seq2seq-translate options; default its own beam search).
set -euo pipefail
[ $# -ge 3 ] || { sed -n '5,10p' "$0" >&2; exit 2; }
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
S2S=("${PYTHON:-python3}" -m seq2seq)
CONFIG="${CONFIG:-$ROOT/configs/back_translation.yaml}"
OUT="${OUT:-runs/distill_example}" SRC="${SRC:-en}" TGT="${TGT:-es}"
read -r -a teacher <<< "${TEACHER:-model.d_model=256 model.d_ff=1024}"
read -r -a teacher_search <<< "${TEACHER_SEARCH:-}"
train=$1 dev=$2 test=$3
shift 3
common=(--config "$CONFIG" "data.src_lang=$SRC" "data.tgt_lang=$TGT" "data.dev.path=$dev"
    "data.test.path=$test")
mkdir -p "$OUT"

# 1. the teacher: a wider model on the real pairs (it trains the SentencePiece model)
"${S2S[@]}" train "${common[@]}" "workdir=$OUT/teacher" "data.train=[{path: \"$train\"}]" \
    "$@" "${teacher[@]}"
# 2. the teacher translates the training sources (resumable): the student's targets
src="$train.$SRC"
[ -f "$src" ] || src="$src.gz"
"${S2S[@]}" translate --workdir "$OUT/teacher" --input "$src" --output-dir "$OUT/bulk" \
    --output "$OUT/distilled.$TGT" "${teacher_search[@]}"
case "$src" in
    *.gz) gzip -dc "$src" > "$OUT/distilled.$SRC" ;;
    *) cp "$src" "$OUT/distilled.$SRC" ;;
esac
# 3. the student: the config's smaller model on the teacher's targets, the teacher's tokenizer
"${S2S[@]}" train "${common[@]}" "workdir=$OUT/student" "data.train=[{path: \"$OUT/distilled\"}]" \
    "tokenizer.model_file=$OUT/teacher/spm.model" "$@"
# 4. teacher and student on the test sources: scores, paired tests and decoding speed
ref="$test.$TGT" tsrc="$test.$SRC"
[ -f "$ref" ] || ref="$ref.gz"
[ -f "$tsrc" ] || tsrc="$tsrc.gz"
"${S2S[@]}" evaluate --workdir "$OUT/teacher" --workdir "$OUT/student" --compare \
    --src "$tsrc" --ref "$ref" --hyp-dir "$OUT/test" --json "$OUT/compare.json"

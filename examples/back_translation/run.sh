#!/usr/bin/env bash
# Back-translation (Sennrich et al. 2016), tagged (Caswell et al. 2019), end to end with the
# public commands and configs/back_translation.yaml (see README.md beside this file).
#
#   examples/back_translation/run.sh PAIRS MONO DEV TEST [key=value ...]
#
# PAIRS, DEV, TEST: parallel prefixes (PREFIX.en and PREFIX.es, or .gz); MONO: a monolingual
# target-side (Spanish) file. key=value overrides go to every training (e.g. train.steps=200).
# Environment: OUT (default runs/bt_example), SRC/TGT (en/es), CONFIG, PYTHON, and SEARCH, the
# reverse model's seq2seq-translate options (default: sampling among the 10 most probable).
set -euo pipefail
[ $# -ge 4 ] || { sed -n '5,10p' "$0" >&2; exit 2; }
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
S2S=("${PYTHON:-python3}" -m seq2seq)
CONFIG="${CONFIG:-$ROOT/configs/back_translation.yaml}"
OUT="${OUT:-runs/bt_example}" SRC="${SRC:-en}" TGT="${TGT:-es}"
read -r -a search <<< "${SEARCH:---search sampling --top-k 10 --seed 1}"
pairs=$1 mono=$2 dev=$3 test=$4
shift 4
only_pairs="data.train=[{path: \"$pairs\"}]"
common=(--config "$CONFIG" "data.dev.path=$dev" "data.test.path=$test")
mkdir -p "$OUT"

# 1. the baseline SRC→TGT on the real pairs; it trains the SentencePiece model (<BT> a symbol)
"${S2S[@]}" train "${common[@]}" "workdir=$OUT/baseline" "data.src_lang=$SRC" \
    "data.tgt_lang=$TGT" "$only_pairs" "$@"
spm="tokenizer.model_file=$OUT/baseline/spm.model"
# 2. the reverse model TGT→SRC on the same pairs and tokenizer
"${S2S[@]}" train "${common[@]}" "workdir=$OUT/reverse" "data.src_lang=$TGT" \
    "data.tgt_lang=$SRC" "$only_pairs" "$spm" "$@"
# 3. synthetic sources: the reverse model translates the monolingual text (resumable)
"${S2S[@]}" translate --workdir "$OUT/reverse" --input "$mono" --output-dir "$OUT/bulk" \
    --output "$OUT/synthetic.$SRC" "${search[@]}"
case "$mono" in
    *.gz) gzip -dc "$mono" > "$OUT/synthetic.$TGT" ;;
    *) cp "$mono" "$OUT/synthetic.$TGT" ;;
esac
# 4. the forward model on the real pairs plus the tagged synthetic ones (1:1 batches), for
#    twice the baseline's steps: as many updates on real pairs as the baseline made
steps=$("${S2S[0]}" -c 'import json, sys; print(json.load(open(sys.argv[1]))["step"])' \
    "$OUT/baseline/test.json")
"${S2S[@]}" train "${common[@]}" "workdir=$OUT/forward" "data.src_lang=$SRC" \
    "data.tgt_lang=$TGT" "data.train.0.path=$pairs" "data.train.1.path=$OUT/synthetic" \
    "$spm" "$@" "train.steps=$((2 * steps))" train.patience=0
# 5. baseline against back-translation on the test split: paired significance tests
ref="$test.$TGT"
[ -f "$ref" ] || ref="$ref.gz"
"${S2S[@]}" evaluate --ref "$ref" --hyp "$OUT/baseline/test.hyp" --hyp "$OUT/forward/test.hyp" \
    --json "$OUT/compare.json"

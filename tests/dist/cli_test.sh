#!/bin/bash
# `mixprec train` and `mixprec eval` under mpirun with 2 ranks, as a user runs them: rank 0 alone
# prints and writes the metrics (one summary, "world_size": 2) and the checkpoint; the sharded
# evaluation gives what one process gives on the same checkpoint. On the first 4096 training and
# 2000 test images of Fashion-MNIST (idx files cut here), so it takes seconds. Run by ctest (dist.cli).
# usage: cli_test.sh MIXPREC DATA_DIR MPIEXEC [MPIEXEC FLAGS...]; exit 77: skipped (no data)
set -u
mixprec=$(readlink -f "$1") data=$(readlink -f "$2") mpiexec=$3
shift 3
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  [ -f "$data/$f.gz" ] || { echo "skipped: no $data/$f.gz (Debian: apt-get install dataset-fashion-mnist)" && exit 77; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() {
  echo "FAIL: $*"
  fail=1
}

be32() {  # N as 4 big-endian bytes
  local n=$1 s
  for s in 24 16 8 0; do
    # shellcheck disable=SC2059 # the format is the byte's octal escape
    printf "\\$(printf '%03o' $(((n >> s) & 255)))"
  done
}
# idx files of the first N items: the header's count rewritten, the items after it kept.
cut_idx() {  # in.gz out N header_bytes item_bytes
  local in=$1 out=$2 n=$3 header=$4 item=$5
  {
    zcat "$in" | head -c 4              # magic
    be32 "$n"                           # count
    zcat "$in" | head -c "$header" | tail -c +9  # the other dimensions
    zcat "$in" | tail -c +$((header + 1)) | head -c $((n * item))
  } >"$out"
}
mkdir -p "$tmp/data"
cut_idx "$data/train-images-idx3-ubyte.gz" "$tmp/data/train-images-idx3-ubyte" 4096 16 784
cut_idx "$data/train-labels-idx1-ubyte.gz" "$tmp/data/train-labels-idx1-ubyte" 4096 8 1
cut_idx "$data/t10k-images-idx3-ubyte.gz" "$tmp/data/t10k-images-idx3-ubyte" 2000 16 784
cut_idx "$data/t10k-labels-idx1-ubyte.gz" "$tmp/data/t10k-labels-idx1-ubyte" 2000 8 1

cd "$tmp" || exit 1
if ! "$mpiexec" -np 2 "$@" "$mixprec" train --model mlp --precision fp32 --epochs 2 --data data --metrics m.jsonl \
  --save ck.safetensors >out.txt 2>err.txt; then
  bad "mpirun -np 2 mixprec train failed:"
  tail -20 err.txt
  exit 1
fi
# Rank 0 prints the run once.
for line in '^mixprec train: ' '^epoch 1: ' '^epoch 2: ' '^done: '; do
  n=$(grep -c "$line" out.txt)
  [ "$n" -eq 1 ] || bad "'$line' printed $n times (expected once, by rank 0):" "$(cat out.txt)"
done
# One metrics file, whole lines from one writer, one summary carrying the job's size.
n=$(grep -c '"event":"summary"' m.jsonl)
[ "$n" -eq 1 ] || bad "$n summary events in the metrics (expected 1)"
grep '"event":"summary"' m.jsonl | grep -q '"world_size":2' || bad "the summary has no \"world_size\":2: $(tail -1 m.jsonl)"
n=$(grep -c '"event":"epoch"' m.jsonl)
[ "$n" -eq 2 ] || bad "$n epoch events in the metrics (expected 2)"
[ -s ck.safetensors ] || bad "no checkpoint written"

# The sharded evaluation against one process's, on the checkpoint: the same count of correct
# images, and the loss up to the order of summation (f64 sums of f32 batch losses).
one=$("$mixprec" eval --checkpoint ck.safetensors --data data --json) || bad "mixprec eval failed"
two=$("$mpiexec" -np 2 "$@" "$mixprec" eval --checkpoint ck.safetensors --data data --json) ||
  bad "mpirun -np 2 mixprec eval failed"
[ "$(grep -c . <<<"$two")" -eq 1 ] || bad "mpirun -np 2 mixprec eval printed more than one line: $two"
field() { grep -o "\"$1\":[^,}]*" <<<"$2" | cut -d: -f2; }
within_1e6() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 1e-6 * a) }'; }
[ "$(field test_accuracy "$one")" = "$(field test_accuracy "$two")" ] ||
  bad "test accuracy: one process $(field test_accuracy "$one"), 2 ranks $(field test_accuracy "$two")"
within_1e6 "$(field test_loss "$one")" "$(field test_loss "$two")" ||
  bad "test loss: one process $(field test_loss "$one"), 2 ranks $(field test_loss "$two")"
# The training run's last epoch evaluated the same weights on 2 ranks.
acc=$(grep '"event":"epoch"' m.jsonl | tail -1 | grep -o '"test_accuracy":[^,}]*' | cut -d: -f2)
[ "$acc" = "$(field test_accuracy "$one")" ] || bad "the run's last test accuracy $acc, eval's $(field test_accuracy "$one")"

# The gpt's validation loss likewise (its batches shared out), on a tiny model and this script's text.
text=$(readlink -f "$0")
"$mpiexec" -np 2 "$@" "$mixprec" train --model gpt --text "$text" --layers 1 --heads 2 --d-model 32 --block-size 32 \
  --batch-size 8 --steps 4 --lr-warmup 1 --eval-every 4 --eval-batches 5 --precision fp32 --save g.safetensors \
  >gpt.txt 2>&1 || bad "mpirun -np 2 mixprec train --model gpt failed: $(tail -5 gpt.txt)"
one=$("$mixprec" eval --checkpoint g.safetensors --text "$text" --json) || bad "mixprec eval (gpt) failed"
two=$("$mpiexec" -np 2 "$@" "$mixprec" eval --checkpoint g.safetensors --text "$text" --json) ||
  bad "mpirun -np 2 mixprec eval (gpt) failed"
within_1e6 "$(field val_loss "$one")" "$(field val_loss "$two")" ||
  bad "gpt validation loss: one process $(field val_loss "$one"), 2 ranks $(field val_loss "$two")"

[ $fail -eq 0 ] && echo "ok: rank 0 alone printed and wrote; sharded eval = one process's"
exit $fail

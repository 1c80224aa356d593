#!/usr/bin/env bash
# Pruning's cost in quality on W1, and what fine-tuning wins back
# (docs/pruning.md, "W1"). From a trained W1 checkpoint:
#   dense, magnitude 0.5 (each matrix, and one line over all of them:
#   --scope global) and 2:4, each evaluated as is and after
#   FT_STEPS steps of fine-tuning (the pruned ones with train.keep_mask;
#   dense gets the same fine-tuning as the control).
# Perplexity = exp(validation loss) from `brisk eval` on the KJV validation
# split, the same batches for every row. Prints a table and writes JSON.
#
#   bash bench/prune_w1.sh CHECKPOINT [WORKDIR]     (FT_STEPS=100, FT_LR=1e-4,
#                                                    METHODS="dense magnitude magnitude-global 2:4";
#                                                    dense first: the others are compared with it)
set -euo pipefail
CKPT=${1:?usage: bench/prune_w1.sh CHECKPOINT [WORKDIR]}
WORK=${2:-runs/prune-w1}
FT_STEPS=${FT_STEPS:-100}
FT_LR=${FT_LR:-1e-4}
EVAL_BATCHES=${EVAL_BATCHES:-40}
B=${BRISK:-build/release/brisk}
DATA=data/kjv-gpt2
mkdir -p "$WORK"

val_loss() {  # prints the validation loss of checkpoint $1
  "$B" eval --checkpoint "$1" --data "$DATA" --batches "$EVAL_BATCHES" | sed -n 's/.*val loss \([0-9.]*\).*/\1/p' | tail -1
}

finetune() {  # $1 = starting checkpoint, $2 = run dir, $3 = keep_mask
  rm -rf "$2"
  "$B" train --config configs/w1.toml --set train.steps="$FT_STEPS" --set train.lr="$FT_LR" \
    --set train.warmup=10 --set train.init_from="$1" --set train.keep_mask="$3" \
    --set checkpoint.dir="$2" --set checkpoint.every="$FT_STEPS" > "$2.log" 2>&1
}

rows=()
METHODS=${METHODS:-dense magnitude magnitude-global 2:4}
[[ ${METHODS%% *} == dense ]] || { echo "prune_w1.sh: METHODS must start with dense" >&2; exit 2; }
for method in $METHODS; do
  name=${method/:/-}
  if [[ $method == dense ]]; then
    start=$CKPT keep=false
  else
    start=$WORK/$name
    rm -rf "$start"
    scope=layer
    [[ $method == magnitude-global ]] && scope=global
    "$B" prune --checkpoint "$CKPT" --method "${method%-global}" --scope "$scope" --sparsity 0.5 --out "$start" \
      > "$WORK/$name.prune.txt"
    keep=true
  fi
  before=$(val_loss "$start")
  finetune "$start" "$WORK/$name-ft" "$keep"
  after=$(val_loss "$WORK/$name-ft")
  rows+=("$method $before $after")
done

python3 - "$WORK/prune_w1.json" "$FT_STEPS" "$FT_LR" "$CKPT" "${rows[@]}" <<'EOF'
import json, math, sys
out, steps, lr, ckpt, *rows = sys.argv[1:]
res = []
for r in rows:
    m, before, after = r.split()
    res.append({"model": m, "val_loss": float(before), "ppl": math.exp(float(before)),
                "val_loss_ft": float(after), "ppl_ft": math.exp(float(after))})
base, base_ft = res[0]["ppl"], res[0]["ppl_ft"]
print(f"{'model':<16} {'ppl':>9} {'vs dense':>9} {'ppl after ' + steps + ' ft steps':>24} {'vs dense ft':>12}")
for r in res:
    print(f"{r['model']:<16} {r['ppl']:9.3f} {100 * (r['ppl'] / base - 1):+8.2f}% {r['ppl_ft']:24.3f} "
          f"{100 * (r['ppl_ft'] / base_ft - 1):+11.2f}%")
json.dump({"checkpoint": ckpt, "finetune_steps": int(steps), "finetune_lr": float(lr), "rows": res},
          open(out, "w"), indent=2)
print("wrote", out)
EOF

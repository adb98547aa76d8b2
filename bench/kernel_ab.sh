#!/usr/bin/env bash
# Alternate bench/kernel_bench.py between an older commit and the working tree, on the same
# host: prints, per round, the three throughput figures (produce+consume with item waits,
# with consumer waits, lock hand-offs) of each. Read medians; the host's other load moves
# single runs.   usage: bench/kernel_ab.sh BASE_COMMIT [ROUNDS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: bench/kernel_ab.sh BASE_COMMIT [ROUNDS] [SECONDS]}
rounds=${2:-6}
seconds=${3:-0.5}
py=.venv/bin/python
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
git archive "$base" | tar -x -C "$dir"
figures() { grep -E '^\| (produce|lock)' | awk -F'|' '{gsub(/[ ,]/, "", $3); printf "%s ", $3}'; }
for i in $(seq "$rounds"); do
  echo "base $(PYTHONPATH=$dir/server:$dir/client:$dir/objects:$dir/protocol:$dir/protos \
               $py "$dir/bench/kernel_bench.py" --seconds "$seconds" 2>&1 | figures)"
  echo "this $($py bench/kernel_bench.py --seconds "$seconds" 2>&1 | figures)"
done

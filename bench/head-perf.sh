#!/bin/bash
# Where the head's time outside its windows goes: a 3-device loopback ring of the benchmark model
# (--layer-windows 8,8,6, uncapped, 600 tokens), the head under `perf record` for 5 s of its decode.
# Prints the run's per-device rows, the head's main thread's samples, and the share of them (perf's
# children figures, relative to that thread) inside its windows (prima_window_forward) and under
# RingNode.send and its parts, each as ms of CPU a token (share * samples / 4999 Hz / tokens in 5 s).
#   npm run build && bench/head-perf.sh        (root: perf; the figures in bench/history/2026-11-24-capped-s8.md)
set -euo pipefail
cd "$(dirname "$0")/.."
M=.cache/bench-llama-Q4_K_M.gguf
[ -f "$M" ] || { echo "no $M: npm run bench -- --only ring generates it" >&2; exit 2; }
D=$(mktemp -d /tmp/prima-head-perf.XXXXXX)
# profiles, plans and chunk hashes in the run's own folder, never the user's ~/.cache
export XDG_CACHE_HOME="$D/cache" XDG_CONFIG_HOME="$D/config"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$D"; }
trap cleanup EXIT
wait_for() { for _ in $(seq 240); do grep -q "$1" "$2" && return 0; sleep 0.5; done; echo "timed out waiting for '$1' in $2" >&2; exit 1; }

node --perf-basic-prof dist/coordinator/cli.js run "$M" -p "Once upon a time" -n 600 --temp 0 --ctx 1024 --port 0 \
  --min-workers 2 --layer-windows 8,8,6 > "$D/head.out" 2> "$D/head.err" &
HEAD=$!; PIDS+=("$HEAD")
wait_for "listening for workers on port" "$D/head.err"
PORT=$(grep -o "listening for workers on port [0-9]*" "$D/head.err" | grep -o "[0-9]*$")
TOKEN=$(grep -o -- "--token-file [^ ]*" "$D/head.err" | head -1 | cut -d' ' -f2)
for name in dev-a dev-b; do
  node dist/worker/cli.js --join "127.0.0.1:$PORT" --model "$M" --name "$name" --once --token-file "$TOKEN" > "$D/$name.log" 2>&1 &
  PIDS+=("$!")
  wait_for "\"$name\" .*joined" "$D/head.err"
done
wait_for "ring order" "$D/head.err"
sleep 3 # into the decode
perf record -F 4999 -g -p "$HEAD" -o "$D/perf.data" -- sleep 5 2> /dev/null
wait "$HEAD" || true
grep -E "^prompt|^device|^w1|^w2|^head" "$D/head.err"
N=$(perf report -i "$D/perf.data" --sort pid -n --stdio -g none 2> /dev/null | grep -v "^#" | grep "$HEAD:" | head -1 | awk '{print $3}')
TOKS=$(grep -o 'decode [0-9]* tokens [0-9.]* tok/s' "$D/head.err" | awk '{print $4}')
echo "the head's main thread: $N samples in 5 s at 4999 Hz, at $TOKS tok/s; under each (perf's children share of them), ms of CPU a token:"
perf report -i "$D/perf.data" --children --percentage relative --sort sym -q -g none --tid "$HEAD" 2> /dev/null |
  grep -E " prima_window_forward$|JS:.send file.*ring/node\.js|JS:.writeFragment|JS:.seal file|JS:.encodeFrame" |
  awk -v n="$N" -v t="$TOKS" '{ s = $1; sub("%", "", s); printf "  %6.2f%%  %.3f ms  %s\n", s, s / 100 * n / 4999 / (5 * t) * 1000, $4 " " $5 }'

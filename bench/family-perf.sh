#!/bin/bash
# Where a families row's time goes, per kernel: prima's engine pass (the families part's loop: one
# batch of 128 random tokens, or 64 decode steps) and llama-bench on the same file, each under
# `perf record`; prints each one's top symbols and its samples. Compare CPU samples per pass (perf
# counts the CPU either engine burns, so a loaded machine slows both clocks but not these counts; the
# llama-bench figure includes its warm-up pass and its OpenMP threads' spinning).
#   npm run build && bench/family-perf.sh .cache/bench-gemma3-1b-12l-Q4_K_M.gguf pp    (or tg; REPS=3,
#   LLAMA_BENCH=path when llama-bench is not in .cache/llama-build)
set -euo pipefail
cd "$(dirname "$0")/.."
M=${1:?model file}; MODE=${2:-pp}; REPS=${REPS:-3}; LLAMA_BENCH=${LLAMA_BENCH:-.cache/llama-build/bin/llama-bench}
D=$(mktemp -d /tmp/prima-family-perf.XXXXXX)
# profiles, plans and chunk hashes in the run's own folder, never the user's ~/.cache
export XDG_CACHE_HOME="$D/cache" XDG_CONFIG_HOME="$D/config"
trap 'rm -rf "$D"' EXIT
top() { perf report -i "$1" --sort dso,symbol --stdio 2>/dev/null > "$1.txt" || true; grep -E "Samples|%" "$1.txt" | head -14 | cut -c1-120 || true; }

perf record -q -F 1999 -o "$D/prima.data" -- node --input-type=module -e "
  import { LocalModel, LocalPipeline, Rng, Sampler } from './dist/engine/index.js';
  const m = LocalModel.open('$M', { threads: 2 }), pipe = new LocalPipeline(m, 200, 512), rng = new Rng(42);
  const tokens = (k) => Int32Array.from({ length: k }, () => Math.floor(rng.next() * m.nVocab));
  const sampler = new Sampler({ temperature: 0 });
  for (let r = 0; r < $REPS; r++) {
    pipe.truncate(0);
    if ('$MODE' === 'pp') await pipe.forward(m.embed(tokens(128)), 0, 128);
    else { const row = new Float32Array(m.nEmbd), tok = tokens(1); for (let i = 0; i < 64; i++) tok[0] = sampler.sample(await pipe.forward(m.embed(tok, row), i, 1)); }
  }
  pipe.close(); m.close();"
echo "## prima, $REPS passes ($MODE)"; top "$D/prima.data"

if [ "$MODE" = pp ]; then ARGS="-p 128 -n 0"; else ARGS="-p 0 -n 64"; fi
perf record -q -F 1999 -o "$D/llama.data" -- "$LLAMA_BENCH" -m "$M" $ARGS -t 2 -r "$REPS" > /dev/null
echo "## llama-bench, $REPS passes and a warm-up ($MODE)"; top "$D/llama.data"

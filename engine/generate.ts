// The token loop, independent of where the layers run: a Pipeline runs every layer (one local window,
// or a ring of devices) and returns the last row's logits; this file embeds, samples and streams.
import { discardFor, type ContextShift, type KvJournal } from "./context-shift.js";
import { h2oEvict } from "./h2o.js";
import { Sampler } from "./sampler.js";

export interface Pipeline {
  /** KV capacity in tokens. */
  readonly nCtx: number;
  /** Runs every layer over nTokens rows of acts (updated in place) at positions pos..pos+nTokens-1
   * and returns the logits of the last row (the buffer may be reused by the next call). */
  forward(acts: Float32Array, pos: number, nTokens: number): Promise<Float32Array>;
  /** Forgets positions >= pos. */
  truncate(pos: number): void;
  /** The largest position <= pos a forward can continue from (sliding-window layers keep only their
   * last positions: a prefix reused from further back restarts at 0). Absent: pos. */
  resumable?(pos: number): number;
  /** Context shift on every device: drops positions [p0, p0 + nDiscard) and moves [p0 + nDiscard,
   * nPast) down by nDiscard, their keys re-rotated (native kvShift). Absent: the pipeline cannot. */
  shift?(p0: number, nDiscard: number, nPast: number): Promise<void>;
  /** H2O's statistics (native h2oScores) of the positions the cache holds, summed over every layer
   * (a ring's gathered round it); absent or null: not gathered. */
  h2oScores?(): Float32Array | null | Promise<Float32Array | null>;
  /** forward() returns once the rows are on their way to other devices (a ring), so the loop starts a
   * token's pass before handing the token to its caller: streaming it overlaps their compute. Absent:
   * forward computes here, and the caller sees each token first. */
  readonly computesElsewhere?: boolean;
}

/** Turns token ids into activation rows (the head's embedding). */
export interface Embedder {
  readonly nEmbd: number;
  embed(tokens: Int32Array, out?: Float32Array): Float32Array;
}

export interface GenerateOptions {
  readonly maxTokens: number;
  readonly sampler: Sampler;
  /** End of generation (EOS/EOT): sampled, not emitted. */
  readonly isEnd?: (id: number) => boolean;
  /** Called with each generated token; return false to stop. */
  readonly onToken?: (id: number) => boolean | void;
  /** Continue a conversation from this position (the KV cache up to it is kept). Default 0. */
  readonly startPos?: number;
  /** Let the event loop run at least this often (ms). A quick decode step runs inline and resolves at
   * once, so without this a whole generation is one chain of microtasks: a server would neither send
   * its stream nor notice a client leaving until the end. Default: never. */
  readonly yieldEveryMs?: number;
  /** The prompt's rows after every layer (before the output norm; from startPos), once its pass is
   * done: what an embedding pools (engine/embedding.ts). */
  readonly onPrompt?: (rows: Float32Array) => void;
  /** When the context is full, shift it and go on (engine/context-shift.ts); undefined: stop there
   * (stopReason "context"). */
  readonly contextShift?: ContextShift;
  /** Records every forward and shift (the prompt cache, failover replay). */
  readonly journal?: KvJournal;
  /** Called after each context shift with what it kept and dropped, and the positions left. */
  readonly onShift?: (keep: number, discarded: number, pos: number) => void;
}

export type StopReason = "length" | "end" | "context" | "caller";

export interface GenerationResult {
  readonly ids: number[];
  readonly stopReason: StopReason;
  readonly promptTokens: number;
  readonly promptMs: number;
  /** Forward passes of one token after the prompt, and their time (sampling included). */
  readonly decodeSteps: number;
  readonly decodeMs: number;
  /** Position after the last token that went through the layers. */
  readonly endPos: number;
  /** Context shifts made, and the tokens they dropped from the cache. */
  readonly shifts: number;
  readonly discarded: number;
}

export async function generate(embedder: Embedder, pipeline: Pipeline, prompt: Int32Array, o: GenerateOptions): Promise<GenerationResult> {
  const startPos = o.startPos ?? 0;
  if (prompt.length === 0) throw new Error("the prompt has no tokens");
  const shift = o.contextShift && pipeline.shift ? o.contextShift : undefined;
  let pos = startPos;
  let shifts = 0, discarded = 0;
  /** One context shift, as llama.cpp makes it, or H2O's eviction (several shifts); false: nothing can be dropped. */
  const shiftContext = async (): Promise<boolean> => {
    let d: number;
    if (shift!.h2o !== undefined) {
      d = await h2oEvict(pipeline, pos, shift!.keep, shift!.h2o, o.journal);
    } else {
      d = discardFor(pos, shift!);
      if (d > 0) {
        await pipeline.shift!(shift!.keep, d, pos);
        o.journal?.shift(shift!.keep, d);
      }
    }
    if (d <= 0) return false;
    pos -= d;
    shifts++;
    discarded += d;
    o.onShift?.(shift!.keep, d, pos);
    return true;
  };
  pipeline.truncate(startPos);
  const t0 = performance.now();
  // A prompt that continues a cache (a conversation's next turn) makes room first, as llama.cpp's
  // completion does before a batch (n_past + n >= n_ctx); a prompt alone must fit.
  if (shift && startPos > 0) while (pos + prompt.length >= pipeline.nCtx && (await shiftContext()));
  if (pos + prompt.length > pipeline.nCtx) {
    throw new Error(`prompt of ${prompt.length} tokens at position ${pos} does not fit the context of ${pipeline.nCtx} tokens`);
  }
  const rows = embedder.embed(prompt);
  let logits = await pipeline.forward(rows, pos, prompt.length);
  o.journal?.forwarded(prompt);
  o.onPrompt?.(rows);
  pos += prompt.length;
  const t1 = performance.now();

  const history: number[] = Array.from(prompt);
  const ids: number[] = [];
  const row = new Float32Array(embedder.nEmbd);
  const tok = new Int32Array(1);
  let steps = 0;
  let stopReason: StopReason = "length";
  /** The pass of token `id` at the next position, started (a context shift first where one is due,
   * as llama.cpp makes it when the token would take the last position, n_past + 1 >= n_ctx);
   * undefined when the context is full. (Wrapped, so that awaiting the start does not await the pass.) */
  const startPass = async (id: number): Promise<{ readonly logits: Promise<Float32Array> } | undefined> => {
    if (shift && pos + 1 >= pipeline.nCtx) await shiftContext();
    if (pos >= pipeline.nCtx) return undefined;
    tok[0] = id;
    return { logits: pipeline.forward(embedder.embed(tok, row), pos, 1) };
  };
  const passDone = (out: Float32Array) => {
    logits = out;
    o.journal?.forwarded(tok);
    pos++;
    steps++;
  };
  // A yield costs a decode step ~5% (measured on the benchmark model): only when the loop has not
  // turned by itself since the last one (a forward on a thread resolves from a real I/O completion).
  let yieldedAt = performance.now();
  let turned = false;
  const watchTurn = () => setImmediate(() => (turned = true));
  if (o.yieldEveryMs !== undefined) watchTurn();
  while (ids.length < o.maxTokens) {
    if (o.yieldEveryMs !== undefined && performance.now() - yieldedAt >= o.yieldEveryMs) {
      if (!turned) await new Promise((resolve) => setImmediate(resolve));
      yieldedAt = performance.now();
      turned = false;
      watchTurn();
    }
    const id = o.sampler.constraint ? await o.sampler.next(logits, history) : o.sampler.sample(logits, history);
    history.push(id);
    if (o.isEnd?.(id)) {
      stopReason = "end";
      break;
    }
    ids.push(id);
    const more = ids.length < o.maxTokens;
    let pass: { readonly logits: Promise<Float32Array> } | undefined;
    if (more && pipeline.computesElsewhere) pass = await startPass(id);
    if (o.onToken?.(id) === false) {
      stopReason = "caller";
      // The pass already started ends first (a ring carries one request at a time), and is not counted:
      // the cache ends at pos as if it had not run, and the next forward from pos overwrites its rows.
      // One that fails is the next request's to meet: this one is complete.
      if (pass) await pass.logits.catch(() => {});
      break;
    }
    if (!more) break;
    if (!pipeline.computesElsewhere) pass = await startPass(id);
    if (!pass) {
      stopReason = "context";
      break;
    }
    passDone(await pass.logits);
  }
  return { ids, stopReason, promptTokens: prompt.length, promptMs: t1 - t0, decodeSteps: steps, decodeMs: performance.now() - t1, endPos: pos, shifts, discarded };
}

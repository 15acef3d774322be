// llama-server's own API beside the OpenAI one (tools/server in llama.cpp): POST /completion (a prompt
// as text, token ids or both mixed; streamed as `data: {...}` events without [DONE]), /tokenize,
// /detokenize, GET /props and a read-only /slots. Field names and shapes follow llama.cpp's
// server-task.cpp; sampling, limits and structured output go through the OpenAI path's checks.
import type { ServerResponse } from "node:http";
import { Sampler } from "../engine/index.js";
import { printable, type Tokenizer } from "../model/index.js";
import { sendJson, type Dialect, type Finished, type GenerationAsk, type ReplyWriter, type Served } from "./http-reply.js";
import { ApiError, asObject, bad, optBool, parseCompletionRequest, renameParam, type ParsedRequest } from "./openai.js";
import type { TokenLogprobs } from "./openai-reply.js";

type Json = Record<string, unknown>;

/** /completion's fields: read, or accepted because they cannot change the answer. Any other is refused
 * by name (grammar and post_sampling_probs true by the OpenAI path's own words). */
const COMPLETION_FIELDS = new Set([
  "prompt", "n_predict", "max_tokens", "stream", "stop", "temperature", "top_k", "top_p", "min_p", "seed", "repeat_penalty", "repeat_last_n",
  "presence_penalty", "frequency_penalty", "json_schema", "return_tokens", "model", "n_probs", "logprobs", "post_sampling_probs", "logit_bias", "grammar",
  // Every request reuses its client's prompt cache, and there is one slot (id 0).
  "cache_prompt", "id_slot",
  // Past the context: what a shift keeps and drops.
  "n_keep", "n_discard",
]);

/** The OpenAI path's parameter names as /completion's, for its error messages. */
const LLAMA_NAMES: Readonly<Record<string, string>> = {
  max_tokens: "n_predict", response_format: "json_schema", "response_format.json_schema.schema": "json_schema", repetition_penalty: "repeat_penalty",
};

/** At most this many logit_bias entries (as the OpenAI path's). */
const MAX_LOGIT_BIAS = 1024;

/** A bias as llama-server reads one: a number, or false (the token is banned). */
function biasValue(v: unknown, where: string): number {
  if (v === false) return -Infinity;
  if (typeof v !== "number" || !Number.isFinite(v)) throw bad("logit_bias", `${where}: the bias must be a number, or false to ban the token (got ${v === null ? "null" : typeof v})`);
  return v;
}

/** llama-server's logit_bias: [[token, bias], ...] or {"token": bias}, a token an id or a text (its
 * tokens, without special ones, each get the bias); a bias a number or false (banned). Biases given
 * twice for a token add up, as llama.cpp's sampler applies each. Where llama-server skips an entry
 * it cannot read, this server refuses it by name. */
export function parseLlamaLogitBias(tok: Tokenizer, raw: unknown): Map<number, number> | undefined {
  if (raw === undefined || raw === null) return undefined;
  const pairs: [unknown, unknown, string][] = [];
  if (Array.isArray(raw)) {
    raw.forEach((el, i) => {
      if (!Array.isArray(el) || el.length !== 2) throw bad("logit_bias", `[${i}] must be a [token, bias] pair`);
      pairs.push([el[0], el[1], `[${i}]`]);
    });
  } else if (typeof raw === "object") {
    // A key that is a whole number (as strtol reads all of it) is an id; any other, a text.
    for (const [k, v] of Object.entries(raw as Json)) pairs.push([/^[+-]?[0-9]{1,10}$/.test(k) ? Number(k) : k, v, `key ${JSON.stringify(printable(k, 40))}`]);
  } else throw bad("logit_bias", "must be an array of [token, bias] pairs or an object of token to bias");
  if (pairs.length > MAX_LOGIT_BIAS) throw bad("logit_bias", `at most ${MAX_LOGIT_BIAS} entries (got ${pairs.length})`);
  const out = new Map<number, number>();
  const add = (id: number, bias: number) => out.set(id, (out.get(id) ?? 0) + bias);
  for (const [t, v, where] of pairs) {
    const bias = biasValue(v, where);
    if (typeof t === "string") {
      for (const id of tok.encode(t, { addSpecial: false, parseSpecial: false })) add(id, bias);
    } else if (typeof t === "number" && Number.isInteger(t) && t >= 0 && t < tok.nVocab) add(t, bias);
    else throw bad("logit_bias", `${where}: the token must be an id from 0 to ${tok.nVocab - 1}, or a text (got ${JSON.stringify(t)?.slice(0, 40)})`);
  }
  return out;
}

/** A piece as llama-server's completion_probabilities give it: `bytes` as they are, `token` as text
 * without a UTF-8 character cut off at its end (llama.cpp's validate_utf8), other bytes that are not
 * UTF-8 replaced. Special tokens as llama-server renders them by default (without --special): empty. */
function probPiece(tok: Tokenizer, id: number): { id: number; token: string; bytes: number[] } {
  const bytes = tok.tokenPiece(id, { special: false });
  let keep = bytes.length;
  for (let i = 1; i <= 4 && i <= bytes.length; i++) {
    const c = bytes[bytes.length - i];
    if (((c & 0xe0) === 0xc0 && i < 2) || ((c & 0xf0) === 0xe0 && i < 3) || ((c & 0xf8) === 0xf0 && i < 4)) {
      keep = bytes.length - i;
      break;
    }
  }
  return { id, token: new TextDecoder().decode(bytes.subarray(0, keep)), bytes: Array.from(bytes) };
}

/** completion_probabilities as llama-server gives them with post_sampling_probs false: per token its
 * id, text, bytes and log probability, and its n_probs most likely alternatives alike. */
export function completionProbabilities(tok: Tokenizer, entries: readonly TokenLogprobs[]): unknown[] {
  return entries.map((e) => ({
    ...probPiece(tok, e.id), logprob: e.logprob,
    top_logprobs: e.top.map((t) => ({ ...probPiece(tok, t.id), logprob: t.logprob })),
  }));
}

/** llama-server's error object: {error: {code, message, type}}. */
function errorBody(e: ApiError): unknown {
  return { error: { code: e.status, message: e.message, type: e.status >= 500 ? "server_error" : "invalid_request_error" } };
}

/** A token id the vocabulary has, else a 400 naming where it came from. */
function tokenId(tok: Tokenizer, v: unknown, param: string): number {
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v >= tok.nVocab) throw bad(param, `must be token ids from 0 to ${tok.nVocab - 1} (got ${JSON.stringify(v)?.slice(0, 40)})`);
  return v;
}

/** llama.cpp's tokenize_mixed: a string, or an array of strings and token ids (only the first string
 * gets the BOS when add_special). */
export function tokenizeMixed(tok: Tokenizer, content: unknown, addSpecial: boolean, parseSpecial: boolean, param: string): Int32Array {
  if (typeof content === "string") return tok.encode(content, { addSpecial, parseSpecial });
  if (!Array.isArray(content)) throw bad(param, "must be a string, or an array of strings and token ids");
  const out: number[] = [];
  content.forEach((p, i) => {
    if (typeof p === "string") out.push(...tok.encode(p, { addSpecial: i === 0 && addSpecial, parseSpecial }));
    else out.push(tokenId(tok, p, `${param}[${i}]`));
  });
  return Int32Array.from(out);
}

/** The one prompt of a /completion request: text (through the prompt cache as /v1/completions), or ids. */
function completionPrompt(tok: Tokenizer, raw: unknown): { text: string } | { ids: Int32Array } {
  if (typeof raw === "string") return { text: raw };
  if (!Array.isArray(raw)) throw bad("prompt", "must be a string, token ids, or an array of strings and token ids");
  // An array of prompts (strings or arrays) is several requests: one is served, more are refused.
  const several = raw.length > 0 && raw.every((p) => typeof p === "string" || Array.isArray(p));
  if (several) {
    if (raw.length !== 1) throw new ApiError(400, "prompt: one prompt per request is supported", "invalid_request_error", "unsupported_value", "prompt");
    return completionPrompt(tok, raw[0]);
  }
  return { ids: tokenizeMixed(tok, raw, true, true, "prompt") };
}

export function llamaCompletionDialect(s: Served): Dialect {
  return {
    errorBody,
    params: LLAMA_NAMES,
    parse: (body) => {
      const b = asObject(body);
      for (const k of Object.keys(b)) {
        if (!COMPLETION_FIELDS.has(k)) throw new ApiError(400, `${printable(k, 60)}: not supported by this server's /completion`, "invalid_request_error", "unsupported_parameter", printable(k, 60));
      }
      if (b.id_slot !== undefined && b.id_slot !== null && b.id_slot !== -1 && b.id_slot !== 0) throw bad("id_slot", "this server has one slot, 0 (or -1: any)");
      optBool(b, "cache_prompt");
      const returnTokens = optBool(b, "return_tokens") ?? false;
      const prompt = completionPrompt(s.tok, b.prompt);
      const n = b.n_predict;
      // n_predict -1 (and -2) mean "until the context is full", as llama-server's default.
      const maxTokens = n === -1 || n === -2 ? undefined : n;
      const schema = b.json_schema;
      const logitBias = parseLlamaLogitBias(s.tok, b.logit_bias);
      // false, or true refused by the OpenAI path's check.
      optBool(b, "post_sampling_probs");
      // logprobs: llama-server's other name of n_probs (when n_probs is not given).
      const probsName = b.n_probs === undefined && b.logprobs !== undefined ? "logprobs" : "n_probs";
      let request: ParsedRequest;
      try {
        request = parseCompletionRequest({
          ...b, prompt: "text" in prompt ? prompt.text : "", max_tokens: maxTokens ?? b.max_tokens, n_predict: undefined, json_schema: undefined,
          response_format: schema === undefined || schema === null ? undefined : { type: "json_schema", json_schema: { name: "json_schema", schema } },
          n_probs: b[probsName], logprobs: undefined, logit_bias: undefined,
        });
      } catch (e) {
        renameParam(e, { ...LLAMA_NAMES, ...(b.n_predict !== undefined ? {} : { max_tokens: "max_tokens" }), n_probs: probsName });
      }
      if (logitBias) request = { ...request, sampler: { ...request.sampler, logitBias } };
      return { request, promptIds: "ids" in prompt ? prompt.ids : undefined, returnTokens } as GenerationAsk;
    },
    writer: (res, ask, prompt, id) => new CompletionWriter(res, ask, prompt.length, s, `completion-${id}`),
  };
}

/** A request's sampling as llama-server's generation_settings shows it (the sampler's defaults filled in). */
function generationSettings(p: ParsedRequest, nPredict: number): Json {
  // llama.cpp shows a ban (-INFINITY) as JSON's null.
  const logitBias = [...(p.sampler.logitBias ?? [])].map(([token, bias]) => ({ bias: Number.isFinite(bias) ? bias : null, token }));
  const r = new Sampler(p.sampler);
  return {
    // 4294967295, llama.cpp's LLAMA_DEFAULT_SEED: a random seed for each request.
    seed: p.sampler.seed ?? 0xffffffff, temperature: r.temperature, top_k: r.topK, top_p: r.topP, min_p: r.minP, repeat_last_n: r.repeatLastN, repeat_penalty: r.repeatPenalty,
    presence_penalty: r.presencePenalty, frequency_penalty: r.frequencyPenalty, n_predict: nPredict, max_tokens: nPredict, stream: p.stream, stop: p.stop,
    n_probs: p.logprobs ?? 0, logit_bias: logitBias, post_sampling_probs: false, ignore_eos: false,
  };
}

class CompletionWriter implements ReplyWriter {
  private readonly p: ParsedRequest;
  private generated = 0;
  /** Probability entries a stream has sent. */
  private sent = 0;

  constructor(private readonly res: ServerResponse, private readonly ask: GenerationAsk & { returnTokens?: boolean }, private readonly evaluated: number,
    private readonly s: Served, readonly id: string) {
    this.p = ask.request;
  }

  start(): void {
    if (this.p.stream) this.res.writeHead(200, { "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-store", Connection: "keep-alive" });
  }

  events(events: readonly { kind: string; text?: string }[], ids: readonly number[], logprobs?: readonly TokenLogprobs[]): void {
    this.generated += ids.length;
    if (!this.p.stream) return;
    const content = events.map((e) => e.text ?? "").join("");
    this.partial(content, ids, logprobs);
  }

  /** A stream's event: text, the tokens since the last one and (with n_probs) their probabilities. */
  private partial(content: string, ids: readonly number[], logprobs: readonly TokenLogprobs[] | undefined): void {
    this.sent += logprobs?.length ?? 0;
    this.res.write(`data: ${JSON.stringify({
      index: 0, content, tokens: ids, stop: false, id_slot: 0, tokens_predicted: this.generated, tokens_evaluated: this.evaluated,
      ...(logprobs && logprobs.length > 0 ? { completion_probabilities: completionProbabilities(this.s.tok, logprobs) } : {}),
    })}\n\n`);
  }

  finish(f: Finished): void {
    // The request's limit under serve's --n-predict; -1, as llama-server shows it: none.
    const nPredict = Math.min(this.p.maxTokens ?? Infinity, this.s.nPredict ?? Infinity);
    const promptN = f.prompt.length - f.usage.prompt_tokens_details.cached_tokens;
    const text = f.content ?? "";
    const body = {
      index: 0,
      // A stream has sent the text already: its last event carries none, as llama-server's.
      content: this.p.stream ? "" : text,
      tokens: this.ask.returnTokens && !this.p.stream ? f.generated : [],
      id_slot: 0, stop: true, model: this.s.modelId, tokens_predicted: f.generated.length, tokens_evaluated: f.prompt.length,
      generation_settings: generationSettings(this.p, Number.isFinite(nPredict) ? nPredict : -1),
      prompt: this.s.tok.decode(f.prompt, { special: true }),
      has_new_line: text.includes("\n"), truncated: false,
      stop_type: f.stopType, stopping_word: f.stoppingWord,
      // The older fields, for clients written against them.
      stopped_eos: f.stopType === "eos", stopped_word: f.stopType === "word", stopped_limit: f.stopType === "limit",
      tokens_cached: f.prompt.length + f.generated.length,
      timings: {
        cache_n: f.usage.prompt_tokens_details.cached_tokens,
        prompt_n: promptN, prompt_ms: f.ms.prompt, prompt_per_token_ms: promptN > 0 ? f.ms.prompt / promptN : 0,
        prompt_per_second: f.ms.prompt > 0 ? (1000 * promptN) / f.ms.prompt : 0,
        predicted_n: f.generated.length, predicted_ms: f.ms.eval, predicted_per_token_ms: f.generated.length > 0 ? f.ms.eval / f.generated.length : 0,
        predicted_per_second: f.ms.eval > 0 ? (1000 * f.generated.length) / f.ms.eval : 0,
      },
    };
    if (this.p.stream) {
      // Tokens whose text never went out in an event (a character still incomplete): their
      // probabilities in an event of no text before the last, which carries none, as llama-server's.
      const rest = f.logprobs?.slice(this.sent);
      if (rest && rest.length > 0) this.partial("", [], rest);
      this.res.end(`data: ${JSON.stringify(body)}\n\n`);
    } else sendJson(this.res, 200, f.logprobs && f.logprobs.length > 0 ? { ...body, completion_probabilities: completionProbabilities(this.s.tok, f.logprobs) } : body);
  }

  fail(e: ApiError, headers: Record<string, string> = {}): void {
    if (this.res.headersSent) this.res.end(`data: ${JSON.stringify(errorBody(e))}\n\n`);
    else sendJson(this.res, e.status, errorBody(e), headers);
  }
}

/** POST /tokenize: {content, add_special (false), parse_special (true), with_pieces (false)}. */
export function tokenize(tok: Tokenizer, body: unknown): unknown {
  const b = asObject(body);
  if (b.content === undefined) return { tokens: [] };
  const ids = tokenizeMixed(tok, b.content, optBool(b, "add_special") ?? false, optBool(b, "parse_special") ?? true, "content");
  if (!(optBool(b, "with_pieces") ?? false)) return { tokens: [...ids] };
  const utf8 = new TextDecoder("utf-8", { fatal: true });
  return {
    tokens: [...ids].map((id) => {
      const bytes = tok.tokenPiece(id, { special: true });
      // A piece that is not whole UTF-8 (a byte token) is given as its bytes, as llama-server does.
      let piece: string | number[];
      try {
        piece = utf8.decode(bytes);
      } catch {
        piece = [...bytes];
      }
      return { id, piece };
    }),
  };
}

/** POST /detokenize: {tokens} as llama-server's tokens_to_str (special tokens as text). */
export function detokenize(tok: Tokenizer, body: unknown): unknown {
  const b = asObject(body);
  if (b.tokens === undefined) return { content: "" };
  if (!Array.isArray(b.tokens)) throw bad("tokens", "must be an array of token ids");
  const ids = b.tokens.map((t, i) => tokenId(tok, t, `tokens[${i}]`));
  return { content: tok.decode(ids, { special: true }) };
}

export { errorBody as llamaErrorBody };

/** GET /props: what llama-server's web UI and clients read of the server. */
export function props(s: Served, chatTemplate: string | undefined, version: string): unknown {
  const ctx = s.cluster.o.ctx;
  const m = s.cluster.state().model;
  const piece = (id: number | null) => (id === null ? "" : s.tok.decode([id], { special: true }));
  return {
    default_generation_settings: { params: generationSettings({ sampler: {}, stop: [], stream: false } as unknown as ParsedRequest, s.nPredict ?? -1), n_ctx: ctx },
    total_slots: s.cluster.parallel, model_alias: s.modelId, model_path: m.path, modalities: { vision: false, audio: false },
    endpoint_slots: true, endpoint_props: false, endpoint_metrics: true,
    chat_template: chatTemplate ?? "", bos_token: piece(s.tok.bos), eos_token: piece(s.tok.eos), build_info: `prima ${version}`, is_sleeping: false,
  };
}

/** GET /slots: the one slot, or serve --parallel's N sequence slots, read-only (no save, restore or
 * erase); n_cached (prima's) is what a slot's KV cache holds. */
export function slots(s: Served): unknown {
  const seqs = s.cluster.slotStates();
  if (seqs) {
    return seqs.map((x) => ({
      id: x.id, n_ctx: x.nCtx, is_processing: x.request !== null, id_task: -1, n_cached: x.cachedTokens,
      next_token: { has_next_token: x.request !== null, n_decoded: x.request?.generatedTokens ?? 0 },
    }));
  }
  const st = s.cluster.state();
  const active = st.requests.active;
  return [{
    id: 0, n_ctx: s.cluster.o.ctx, is_processing: active !== null, id_task: -1,
    next_token: { has_next_token: active !== null, n_decoded: active?.generatedTokens ?? 0 },
  }];
}

// The OpenAI API's replies: responses and stream chunks built in one place (ResponseShaper), usage and
// log probabilities in OpenAI's shapes, stop strings found across token boundaries (StopMatcher), and
// the OpenAI dialect (http-reply.ts's Dialect) that reads a request with openai.ts and writes its reply.
import type { ServerResponse } from "node:http";
import type { StepLogprobs } from "../engine/index.js";
import type { ReplyEvent, ToolCall } from "../tools/index.js";
import { sendJson, type Dialect, type Finished, type GenerationAsk, type ReplyWriter, type Served } from "./http-reply.js";
import { parseChatRequest, parseCompletionRequest, type ApiError, type ParsedRequest, type RequestLimits } from "./openai.js";

export type FinishReason = "stop" | "length" | "tool_calls";

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
}

export function usage(promptTokens: number, completionTokens: number, cachedTokens: number): Usage {
  return { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens, prompt_tokens_details: { cached_tokens: cachedTokens } };
}

/** A generated token's log probabilities, and where its text starts in the reply (UTF-16 units). */
export interface TokenLogprobs extends StepLogprobs {
  readonly offset: number;
}

/** A token's piece: its bytes as the tokenizer renders it (a piece may be part of a UTF-8 character). */
export type PieceOf = (id: number) => Uint8Array;

/** A piece as text: bytes that are not whole UTF-8 become U+FFFD, as in the streamed text. */
const pieceText = (bytes: Uint8Array): string => new TextDecoder().decode(bytes);

/** Log probabilities as OpenAI reports them: chat's {content: [{token, logprob, bytes, top_logprobs}]},
 * or the completions' legacy {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}
 * (offsets from the start of the completion's text). Null when none were asked for. */
export function formatLogprobs(kind: "chat" | "completion", entries: readonly TokenLogprobs[] | undefined, piece: PieceOf) {
  if (!entries) return null;
  if (kind === "chat") {
    const one = (id: number, logprob: number) => {
      const bytes = piece(id);
      return { token: pieceText(bytes), logprob, bytes: Array.from(bytes) };
    };
    return { content: entries.map((e) => ({ ...one(e.id, e.logprob), top_logprobs: e.top.map((t) => one(t.id, t.logprob)) })), refusal: null };
  }
  return {
    tokens: entries.map((e) => pieceText(piece(e.id))),
    token_logprobs: entries.map((e) => e.logprob),
    top_logprobs: entries.map((e) => {
      // Two tokens with the same text (partial UTF-8) share a key: the more likely one stays. No
      // prototype, so a token "__proto__" is a key like any other.
      const top = Object.create(null) as Record<string, number>;
      for (const t of e.top) {
        const key = pieceText(piece(t.id));
        if (!(key in top)) top[key] = t.logprob;
      }
      return top;
    }),
    text_offset: entries.map((e) => e.offset),
  };
}

type Logprobs = ReturnType<typeof formatLogprobs>;

/** Builds the response objects of one request (ids and timestamps shared by its chunks). */
export class ResponseShaper {
  readonly id: string;
  readonly created = Math.floor(Date.now() / 1000);

  constructor(readonly kind: "chat" | "completion", readonly model: string, id: string) {
    this.id = `${kind === "chat" ? "chatcmpl" : "cmpl"}-${id}`;
  }

  private base(object: string) {
    return { id: this.id, object, created: this.created, model: this.model, system_fingerprint: "prima" };
  }

  full(text: string | null, finish: FinishReason, u: Usage, toolCalls: readonly ToolCall[] = [], logprobs: Logprobs = null, reasoning: string | null = null) {
    const calls = toolCalls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } }));
    // The reasoning as llama-server gives it (reasoning_content), only when there is some.
    const message = { role: "assistant", content: text, ...(reasoning ? { reasoning_content: reasoning } : {}), ...(calls.length ? { tool_calls: calls } : {}) };
    return this.kind === "chat"
      ? { ...this.base("chat.completion"), choices: [{ index: 0, message, logprobs, finish_reason: finish }], usage: u }
      : { ...this.base("text_completion"), choices: [{ index: 0, text, logprobs, finish_reason: finish }], usage: u };
  }

  /** A stream chunk: text (the first chat chunk also carries the role), or the finish reason; with the
   * log probabilities of the tokens it carries. */
  chunk(text: string | null, finish: FinishReason | null, first = false, logprobs: Logprobs = null, field: "content" | "reasoning_content" = "content") {
    if (this.kind === "chat") {
      const delta = text === null ? {} : first ? { role: "assistant", [field]: text } : { [field]: text };
      return { ...this.base("chat.completion.chunk"), choices: [{ index: 0, delta, logprobs, finish_reason: finish }] };
    }
    return { ...this.base("text_completion"), choices: [{ index: 0, text: text ?? "", logprobs, finish_reason: finish }] };
  }

  /** A chat stream chunk with a tool call's start (id and name) or a piece of its arguments. */
  toolChunk(index: number, call: { id: string; name: string } | { arguments: string }, first = false, logprobs: Logprobs = null) {
    const fn = "id" in call ? { index, id: call.id, type: "function", function: { name: call.name, arguments: "" } } : { index, function: { arguments: call.arguments } };
    const delta = first ? { role: "assistant", content: null, tool_calls: [fn] } : { tool_calls: [fn] };
    return { ...this.base("chat.completion.chunk"), choices: [{ index: 0, delta, logprobs, finish_reason: null }] };
  }

  usageChunk(u: Usage) {
    return { ...this.base(this.kind === "chat" ? "chat.completion.chunk" : "text_completion"), choices: [], usage: u };
  }
}

/**
 * Finds stop strings in generated text that arrives piece by piece: text that could still be the
 * start of a stop string is held back until the next piece decides.
 */
export class StopMatcher {
  private held = "";
  stopped = false;
  /** The stop string that ended the text ("" while none has). */
  word = "";

  constructor(private readonly stops: readonly string[]) {}

  /** Adds a piece; returns the text that is now safe to send. */
  push(piece: string): string {
    if (this.stopped) return "";
    const buf = this.held + piece;
    let at = -1;
    for (const s of this.stops) {
      const i = buf.indexOf(s);
      if (i >= 0 && (at < 0 || i < at)) {
        at = i;
        this.word = s;
      }
    }
    if (at >= 0) {
      this.stopped = true;
      this.held = "";
      return buf.slice(0, at);
    }
    let hold = 0;
    for (const s of this.stops) {
      for (let n = Math.min(s.length - 1, buf.length); n > hold; n--) {
        if (buf.endsWith(s.slice(0, n))) {
          hold = n;
          break;
        }
      }
    }
    this.held = buf.slice(buf.length - hold);
    return buf.slice(0, buf.length - hold);
  }

  /** The end of generation: whatever was held back is text after all. */
  flush(): string {
    const t = this.stopped ? "" : this.held;
    this.held = "";
    return t;
  }
}

/** The OpenAI dialect: /v1/chat/completions and /v1/completions, streamed as server-sent events. */
export function openAiDialect(kind: "chat" | "completion", s: Served): Dialect {
  const limits: RequestLimits = { nVocab: s.tok.nVocab };
  const piece: PieceOf = (id) => s.tok.tokenPiece(id, { special: true });
  return {
    errorBody: (e) => e.body(),
    parse: (body) => ({ request: kind === "chat" ? parseChatRequest(body, limits) : parseCompletionRequest(body, limits) }),
    writer: (res, ask, _prompt, id) => new OpenAiWriter(res, ask, new ResponseShaper(kind, s.modelId, id), piece),
  };
}

class OpenAiWriter implements ReplyWriter {
  private first = true;
  private readonly p: ParsedRequest;
  readonly id: string;
  /** Log-probability entries a stream has sent. */
  private sent = 0;

  constructor(private readonly res: ServerResponse, ask: GenerationAsk, private readonly shaper: ResponseShaper, private readonly piece: PieceOf) {
    this.p = ask.request;
    this.id = shaper.id;
  }

  /** Entries as this request's kind reports them; null when there are none to send. */
  private format(entries: readonly TokenLogprobs[] | undefined) {
    if (!entries || entries.length === 0) return null;
    this.sent += entries.length;
    return formatLogprobs(this.p.kind, entries, this.piece);
  }

  private write(chunk: unknown): void {
    this.res.write(`data: ${JSON.stringify(chunk)}\n\n`);
    this.first = false;
  }

  start(): void {
    if (!this.p.stream) return;
    this.res.writeHead(200, { "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-store", Connection: "keep-alive" });
    // As OpenAI streams a chat: the role alone first, then the content (or the calls) in pieces.
    if (this.p.kind === "chat") this.write(this.shaper.chunk("", null, true));
  }

  /** Each piece as a chunk; the tokens' log probabilities ride with the first. */
  events(events: readonly ReplyEvent[], _ids: readonly number[], logprobs?: readonly TokenLogprobs[]): void {
    if (!this.p.stream) return;
    let lp = this.format(logprobs);
    for (const e of events) {
      if (e.kind === "content" || e.kind === "reasoning") this.write(this.shaper.chunk(e.text, null, this.first, lp, e.kind === "content" ? "content" : "reasoning_content"));
      else this.write(this.shaper.toolChunk(e.index, e.kind === "call" ? e : { arguments: e.text }, this.first, lp));
      lp = null;
    }
  }

  finish(f: Finished): void {
    if (!this.p.stream) {
      sendJson(this.res, 200, this.shaper.full(f.content, f.finish, f.usage, f.calls, f.logprobs ? formatLogprobs(this.p.kind, f.logprobs, this.piece) : null, f.reasoning));
      return;
    }
    if (this.first && this.p.kind === "chat") this.write(this.shaper.chunk("", null, true));
    // Tokens whose text is not out yet (empty pieces, a character still incomplete): their entries
    // in a chunk of no text before the finish.
    const rest = this.format(f.logprobs?.slice(this.sent));
    if (rest) this.write(this.shaper.chunk("", null, false, rest));
    this.write(this.shaper.chunk(null, f.finish));
    if (this.p.includeUsage) this.write(this.shaper.usageChunk(f.usage));
    this.res.end("data: [DONE]\n\n");
  }

  fail(e: ApiError, headers: Record<string, string> = {}): void {
    if (this.res.headersSent) this.res.end(`data: ${JSON.stringify(e.body())}\n\n`);
    else sendJson(this.res, e.status, e.body(), headers);
  }
}

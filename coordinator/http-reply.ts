// What an API dialect (OpenAI's, Ollama's, llama-server's) plugs into serve's one generation path
// (generation.ts): how it reads a request into a ParsedRequest, how it writes the reply as it is
// generated, and how its errors look. Everything between (the guard, the queue, the prompt cache,
// structured output, stop strings, limits, metrics) is shared, so the dialects differ only in shape.
import type { ServerResponse } from "node:http";
import type { Tokenizer } from "../model/index.js";
import type { ReplyEvent, ToolCall } from "../tools/index.js";
import type { Cluster } from "./cluster.js";
import type { ApiError, ParsedRequest } from "./openai.js";
import type { FinishReason, TokenLogprobs, Usage } from "./openai-reply.js";

export function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  const text = JSON.stringify(body);
  res.writeHead(status, { "Content-Type": "application/json; charset=utf-8", "Content-Length": Buffer.byteLength(text), ...headers });
  res.end(text);
}

/** The served model, as the dialects' informational endpoints describe it. */
export interface Served {
  readonly cluster: Cluster;
  readonly tok: Tokenizer;
  readonly modelId: string;
  /** serve --n-predict: undefined, until the context is full. */
  readonly nPredict?: number;
}

/** A generation request in any dialect, checked and ready for the queue. */
export interface GenerationAsk {
  readonly request: ParsedRequest;
  /** A prompt the client gave as token ids (llama-server's): no template, no tokenizing. */
  readonly promptIds?: Int32Array;
}

/** How one generation ended, for a dialect's last response. */
export interface Finished {
  /** The reply's text (tool calls taken out; null when only calls came). */
  readonly content: string | null;
  /** The model's reasoning apart from the content (chat, with the split on), null when there is none. */
  readonly reasoning: string | null;
  readonly calls: readonly ToolCall[];
  readonly finish: FinishReason;
  /** As llama-server says it: the end token, a stop string, or the token limit. */
  readonly stopType: "eos" | "word" | "limit";
  readonly stoppingWord: string;
  readonly prompt: Int32Array;
  readonly generated: readonly number[];
  readonly usage: Usage;
  /** Log probabilities (when the request asked for them): one entry per token of the reply, those a
   * stop string cut off left out. A stream has handed on the first ones with events(). */
  readonly logprobs?: readonly TokenLogprobs[];
  /** Milliseconds: waiting in the queue, reading the prompt (to the first token), generating after it, all. */
  readonly ms: { readonly queue: number; readonly prompt: number; readonly eval: number; readonly total: number };
}

/** One request's response in a dialect: streamed pieces (only a streamed request writes them) and the end. */
export interface ReplyWriter {
  /** The response's id, as the server's log names the request. */
  readonly id: string;
  /** The request left the queue: a stream's headers go out now. */
  start(): void;
  /** Text and tool-call pieces as they become final, with the tokens generated since the last ones and
   * (when asked for) the log probabilities of the tokens whose text these pieces reach. Some tokens'
   * entries may come later than the tokens (a character split across tokens), or only in finish(). */
  events(events: readonly ReplyEvent[], ids: readonly number[], logprobs?: readonly TokenLogprobs[]): void;
  finish(f: Finished): void;
  /** A failure, before or after a stream's headers; a client that went away gets no answer. */
  fail(e: ApiError, headers?: Record<string, string>): void;
}

export interface Dialect {
  /** An error's body in this dialect (its status is the error's). */
  errorBody(e: ApiError): unknown;
  /** The dialect's names of the OpenAI path's fields, for errors found after parse (a schema the
   * grammar engine refuses names response_format, which Ollama calls format). */
  readonly params?: Readonly<Record<string, string>>;
  /** A parsed JSON body as a generation; throws ApiError. `answer`: a reply needing no generation. */
  parse(body: unknown): GenerationAsk | { readonly answer: unknown };
  /** The writer of a request's reply, once its prompt is tokens; `id`: a fresh random id. */
  writer(res: ServerResponse, ask: GenerationAsk, prompt: Int32Array, id: string): ReplyWriter;
}

/** Nanoseconds from milliseconds, as whole numbers (Ollama's durations). */
export function ns(ms: number): number {
  return Math.max(0, Math.round(ms * 1e6));
}

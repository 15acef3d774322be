// One generation request in any dialect (http-reply.ts's Dialect): checked (JSON, the cluster ready, the
// prompt rendered and within the context, a structured output's grammar), queued on the cluster, its
// reply streamed through the dialect's writer (reply-stream.ts), and counted in the server's outcomes.
import { randomUUID } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import { Sampler } from "../engine/index.js";
import { closingStart, type GrammarConstraint } from "../grammar/index.js";
import { printable } from "../model/index.js";
import { contextShiftFor } from "./args.js";
import { bodyTypeRefusal } from "./http-guard.js";
import { sendJson, type Dialect, type GenerationAsk, type ReplyWriter } from "./http-reply.js";
import type { ApiServerOptions } from "./http-server.js";
import type { RequestOutcomes } from "./metrics.js";
import { ApiError, renamedParam } from "./openai.js";
import { usage, type FinishReason } from "./openai-reply.js";
import type { ConversationTokens } from "./prompt.js";
import { CancelledError, QueueFullError } from "./queue.js";
import { ReplyStream } from "./reply-stream.js";
import { planStructured, type Constraints, type StructuredPlan } from "./structured.js";

/** What a generation needs of the server. */
export interface GenerationContext {
  readonly o: ApiServerOptions;
  readonly outcomes: RequestOutcomes;
  /** Each client's last exchange as tokens, so its next turn keeps the reply as generated. */
  readonly conversations: ConversationTokens;
  readonly constraints: Constraints;
  healthy(): { ok: boolean; status: string };
  /** The chat template's source, or undefined when the model has none (a fallback is used). */
  templateSource(): string | undefined;
  jsonBody(req: IncomingMessage): Promise<unknown>;
}

export class Generations {
  /** Generation requests that reached the queue, numbering them in their order there (FIFO). */
  private received = 0;

  constructor(private readonly c: GenerationContext) {}

  /** A generation request in dialect `d`: checked, queued, generated, answered in its shape. */
  async generation(req: IncomingMessage, res: ServerResponse, d: Dialect, scope: string): Promise<void> {
    const fail = (e: ApiError, headers: Record<string, string> = {}) => sendJson(res, e.status, d.errorBody(renamedParam(e, d.params ?? {})), headers);
    // A web page's text/plain form or no-cors fetch runs nothing (http-guard.ts).
    const refusal = bodyTypeRefusal(req);
    if (refusal) {
      req.resume();
      this.c.outcomes.invalid++;
      fail(new ApiError(415, refusal, "invalid_request_error", "unsupported_media_type"));
      return;
    }
    const health = this.c.healthy();
    if (!health.ok) {
      req.resume();
      this.c.outcomes.rejected++;
      fail(new ApiError(503, `the cluster cannot serve yet: ${health.status}`, "server_error", "not_ready"), { "Retry-After": "5" });
      return;
    }
    let ask: GenerationAsk;
    let ids: Int32Array;
    let promptText: string | undefined;
    let plan: StructuredPlan;
    let constraint: GrammarConstraint | undefined;
    try {
      const body = await this.c.jsonBody(req);
      const parsed = d.parse(body);
      if ("answer" in parsed) {
        sendJson(res, 200, parsed.answer);
        return;
      }
      ask = parsed;
      const p = ask.request;
      const chat = p.kind === "chat";
      const template = chat ? this.c.templateSource() : undefined;
      plan = planStructured(p, template, template === undefined, p.reasoningFormat ?? this.c.o.reasoningFormat);
      if (ask.promptIds) ids = ask.promptIds;
      else {
        try {
          promptText = chat ? this.c.o.prompts.chatText(plan.messages, plan.templateTools, p.templateVars) : p.prompt!;
          ids = this.c.conversations.ids(scope, promptText).ids;
        } catch (e) {
          throw new ApiError(400, `the prompt could not be rendered: ${(e as Error).message}`, "invalid_request_error", "invalid_prompt");
        }
      }
      const ctx = this.c.o.cluster.o.ctx;
      if (ids.length === 0) throw new ApiError(400, "the prompt is empty", "invalid_request_error", "invalid_prompt", chat ? "messages" : "prompt");
      if (ids.length >= ctx) {
        throw new ApiError(400, `the prompt has ${ids.length} tokens; the context holds ${ctx}, and at least one must be left to generate`, "invalid_request_error", "context_length_exceeded", chat ? "messages" : "prompt");
      }
      if (plan.spec) constraint = await this.c.constraints.start(plan.spec, plan.param);
    } catch (e) {
      this.c.outcomes.invalid++;
      if (e instanceof ApiError) {
        fail(e);
        return;
      }
      throw e;
    }
    try {
      await this.reply(res, ask, d.writer(res, ask, ids, randomUUID().replace(/-/g, "").slice(0, 24)), promptText, ids, scope, plan, constraint);
    } finally {
      if (constraint) this.c.constraints.done(constraint);
    }
  }

  /** Runs the request on the cluster and streams its reply through the dialect's writer. */
  private async reply(res: ServerResponse, ask: GenerationAsk, w: ReplyWriter, promptText: string | undefined, ids: Int32Array, cacheScope: string,
    plan: StructuredPlan, constraint?: GrammarConstraint): Promise<void> {
    const { cluster, tok } = this.c.o;
    const p = ask.request;
    const abort = new AbortController();
    let done = false;
    res.on("close", () => {
      if (!done) abort.abort();
    });
    // A request that names no max_tokens fills the context (or takes --n-predict); shifting the context,
    // one may name more, up to --n-predict.
    const room = cluster.o.ctx - ids.length;
    const shift = contextShiftFor({ contextShift: this.c.o.contextShift ?? false, nKeep: this.c.o.nKeep ?? 0, h2oBudget: this.c.o.h2oBudget }, ids.length, tok.addBos, cluster.o.ctx, p.nKeep, p.nDiscard);
    const maxTokens = shift ? Math.min(p.maxTokens ?? this.c.o.nPredict ?? room, this.c.o.nPredict ?? Infinity)
      : Math.min(p.maxTokens ?? room, this.c.o.nPredict ?? room, room);
    const sampler = new Sampler({ ...p.sampler, constraint, closeAfter: closingStart(maxTokens), logprobs: p.logprobs });
    const reply = new ReplyStream(tok, p.stop, p.logprobs !== undefined, plan.parser(promptText), w, sampler);
    // Numbered as it is queued (cluster.generate queues synchronously), so the log shows the order.
    const tag = `request ${++this.received} (${w.id})`;
    const startedAt = performance.now();
    try {
      const out = await cluster.generate({
        kind: p.kind, prompt: ids, maxTokens, sampler, isEnd: (id) => tok.isEog(id),
        signal: abort.signal, cacheScope, contextShift: shift,
        onStart: () => w.start(),
        onToken: (id) => reply.push(id),
      });
      reply.end();
      done = true;
      const r = out.result;
      if (abort.signal.aborted) {
        this.c.outcomes.cancelled++;
        this.c.o.log(`${tag} cancelled by the client after ${r.ids.length} tokens`);
        res.end();
        return;
      }
      const { stops, text, entries, parser } = reply;
      const parsed = parser?.finish();
      if (parsed) reply.send(parsed.events);
      const calls = parser?.calls ?? [];
      const ended = r.stopReason === "end" || stops.stopped;
      const finish: FinishReason = ended ? (calls.length > 0 ? "tool_calls" : "stop") : "length";
      // The client's next turn continues this one's text: keep its tokens as generated (a reply cut by
      // a stop string, or one that called tools, no longer stands for its tokens as text).
      if (promptText !== undefined && !stops.stopped && calls.length === 0) this.c.conversations.remember(cacheScope, promptText, ids, text, r.ids);
      const u = usage(ids.length, r.ids.length, out.cachedTokens);
      this.c.outcomes.ok++;
      const total = performance.now() - startedAt;
      const promptMs = out.firstTokenMs ?? total - out.queueMs;
      const speed = (out.meanDecodeMs > 0 ? `, ${(1000 / out.meanDecodeMs).toFixed(1)} tok/s` : "") +
        (constraint && constraint.steps > 0 ? `, the constraint ${(constraint.ms / constraint.steps).toFixed(2)} ms/token` : "");
      this.c.o.log(`${tag}: ${ids.length} prompt tokens (${out.cachedTokens} cached) + ${r.ids.length} generated (${finish}) in ${Math.round(total)} ms, ${Math.round(out.queueMs)} of them queued${speed}`);
      w.finish({
        content: parsed ? parsed.content : text, reasoning: parsed?.reasoning ?? null, calls, finish,
        stopType: stops.stopped ? "word" : r.stopReason === "end" ? "eos" : "limit", stoppingWord: stops.word,
        prompt: ids, generated: r.ids, usage: u, logprobs: entries,
        ms: { queue: out.queueMs, prompt: promptMs, eval: Math.max(0, total - out.queueMs - promptMs), total },
      });
    } catch (e) {
      done = true;
      if (e instanceof QueueFullError) {
        this.c.outcomes.rejected++;
        w.fail(new ApiError(503, e.message, "server_error", "queue_full"), { "Retry-After": "2" });
        return;
      }
      if (e instanceof CancelledError) {
        this.c.outcomes.cancelled++;
        res.end();
        return;
      }
      this.c.outcomes.error++;
      this.c.o.log(`${tag} failed: ${(e as Error).message}`);
      w.fail(new ApiError(503, `generation failed: ${(e as Error).message}`, "server_error", "generation_failed"), { "Retry-After": "2" });
    }
  }
}

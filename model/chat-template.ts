// Chat prompts from a model's tokenizer.chat_template (Jinja, rendered with @huggingface/jinja) as
// llama.cpp's common_chat_templates_apply does: messages, add_generation_prompt, bos_token and
// eos_token (the texts of the model's BOS/EOS tokens), enable_thinking and today's date; a system
// message is folded into the next message when the template ignores or refuses the system role;
// then the BOS text is cut from the front when the tokenizer adds BOS itself (EOS likewise).
//
// A template comes from the model file, so it may be hostile: a loop over range(1e9), a string
// doubled until V8 aborts the process. Rendering therefore happens in a worker thread with a heap of
// its own (resourceLimits), a step count, a deadline and an output bound; the caller waits for it
// synchronously (Atomics.wait), so render() stays a plain function call. A worker that runs out of
// memory or time is terminated and the next render starts a fresh one; the process stays up.

import { Template } from "@huggingface/jinja";
import { createRequire } from "node:module";
import { MessageChannel, receiveMessageOnPort, Worker, type MessagePort } from "node:worker_threads";
import { printable } from "../base/index.js";
import type { GgufFile } from "./gguf.js";
import { Tokenizer } from "./tokenizer.js";

export class ChatTemplateError extends Error {
  override name = "ChatTemplateError";
}

export interface ChatMessage {
  readonly role: string;
  readonly content: string;
  readonly [field: string]: unknown;
}

export type ChatFallback = "chatml" | "llama2";

export interface ChatTemplateOptions {
  /** Template to use instead of the model's own. */
  readonly template?: string;
  /** Used only when the model has no template; without it such a model is an error. */
  readonly fallback?: ChatFallback;
}

export interface RenderOptions {
  /** End with the opening of the assistant's turn. Default true. */
  readonly addGenerationPrompt?: boolean;
  /** Tool definitions, for templates that take them. */
  readonly tools?: readonly unknown[];
  /** More template variables (e.g. enable_thinking). */
  readonly extra?: Readonly<Record<string, unknown>>;
  /** Cut the BOS/EOS text the tokenizer will add itself, as llama.cpp does. Default true. */
  readonly stripAddedSpecial?: boolean;
  /** The date templates see (datetime, date_string). Default now. */
  readonly now?: Date;
}

const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
const SYSTEM_PROBE = "\u0001system-probe\u0001";

/** llama.cpp's own default template (common/chat.cpp CHATML_TEMPLATE_SRC). */
export const CHATML_TEMPLATE =
  "{%- for message in messages -%}\n" +
  "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n" +
  "{%- endfor -%}\n" +
  "{%- if add_generation_prompt -%}\n" +
  "  {{- '<|im_start|>assistant\n' -}}\n" +
  "{%- endif -%}";

/** Llama 2 chat, as llama.cpp's built-in "llama2-sys-bos" format (BOS text before each later turn). */
export const LLAMA2_TEMPLATE =
  "{%- set ns = namespace(inside=true) -%}\n" +
  "{{- '[INST] ' -}}\n" +
  "{%- for message in messages -%}\n" +
  "  {%- if not ns.inside -%}{%- set ns.inside = true -%}{{- bos_token + '[INST] ' -}}{%- endif -%}\n" +
  "  {%- if message.role == 'system' -%}{{- '<<SYS>>\n' + message.content + '\n<</SYS>>\n\n' -}}\n" +
  "  {%- elif message.role == 'user' -%}{{- message.content + ' [/INST]' -}}\n" +
  "  {%- else -%}{{- message.content + eos_token -}}{%- set ns.inside = false -%}\n" +
  "  {%- endif -%}\n" +
  "{%- endfor -%}";

const FALLBACKS: Readonly<Record<ChatFallback, string>> = { chatml: CHATML_TEMPLATE, llama2: LLAMA2_TEMPLATE };

/** What one render may use. Real templates take well under 1% of each (a few thousand steps, ~1 ms). */
export interface TemplateLimits {
  /** Wall time of one render. */
  readonly timeMs: number;
  /** Interpreter steps (one per AST node evaluated): bounds loops of any shape. */
  readonly steps: number;
  /** Longest string (the output, so the prompt, included: 1M characters is ~250k tokens) and longest
   * list the template may make. Keep a string's bytes well under 16 MB (see WORKER_SOURCE). */
  readonly outputChars: number;
  readonly listItems: number;
  /** The worker's heap: anything a single builtin allocates at once ends here, not in the process. */
  readonly heapMb: number;
}

export const DEFAULT_TEMPLATE_LIMITS: TemplateLimits = {
  timeMs: 2000, steps: 5_000_000, outputChars: 1 << 20, listItems: 1 << 20, heapMb: 256,
};

// The worker (CommonJS, eval'd: it needs no file of its own next to the compiled one or the test's
// source). It counts steps by wrapping Interpreter.evaluate: the worker's own copy of the library, so
// the wrap touches nothing in the main thread.
const WORKER_SOURCE = `
const { workerData } = require("node:worker_threads");
const { Template, Interpreter, Environment } = require(workerData.jinja);
const { port, signal } = workerData;
const flag = new Int32Array(signal);
class LimitError extends Error {}
let limits, steps = 0, deadline = 0;
const evaluate = Interpreter.prototype.evaluate;
Interpreter.prototype.evaluate = function (node, env) {
  if (++steps > limits.steps) throw new LimitError("it took more than " + limits.steps + " steps (a loop that does not end?)");
  if ((steps & 1023) === 0 && Date.now() > deadline) throw new LimitError("it ran longer than " + limits.timeMs + " ms");
  const v = evaluate.call(this, node, env);
  const x = v && v.value;
  if (typeof x === "string" && x.length > limits.outputChars) throw new LimitError("it made a string of more than " + limits.outputChars + " characters");
  if (Array.isArray(x) && x.length > limits.listItems) throw new LimitError("it made a list of more than " + limits.listItems + " items");
  return v;
};
function range(start, stop, step = 1) {
  if (stop === undefined) { stop = start; start = 0; }
  const n = step === 0 ? 0 : Math.ceil((stop - start) / step);
  if (!(n <= limits.listItems)) throw new LimitError("range() of " + n + " items is more than " + limits.listItems);
  if (step === 0) throw new Error("range() step must not be zero");
  const out = [];
  for (let i = 0; i < n; i++) out.push(start + i * step);
  return out;
}
// A worker that reaches its heap limit is stopped cleanly only when the failing allocation is small:
// V8 gives it ~16 MB of leeway, and one larger allocation past the limit aborts the whole process.
// So no single step may build a big value: every value is checked after each step (outputChars),
// and the builtins that make a long string from short inputs in one call check their result first.
const guard = (proto, name, length) => {
  const f = proto[name];
  proto[name] = function (...a) {
    const n = length(this, a);
    if (n > limits.outputChars) throw new LimitError(name + "() would make " + n + " characters, more than " + limits.outputChars);
    return f.apply(this, a);
  };
};
guard(String.prototype, "repeat", (s, [n]) => s.length * Number(n));
guard(String.prototype, "padStart", (s, [n]) => Number(n));
guard(String.prototype, "padEnd", (s, [n]) => Number(n));
const grows = (s, [from, to]) => {
  if (typeof from !== "string" || typeof to !== "string" || to.length <= from.length || s.length * (to.length + 1) <= limits.outputChars) return s.length;
  let k = 0;
  for (let i = s.indexOf(from); i >= 0 && from.length > 0; i = s.indexOf(from, i + from.length)) k++;
  return s.length + k * (to.length - from.length) + (from.length === 0 ? (s.length + 1) * to.length : 0);
};
guard(String.prototype, "replace", grows);
guard(String.prototype, "replaceAll", grows);
guard(Array.prototype, "join", (xs, [sep]) => {
  let n = (xs.length - 1) * (sep === undefined ? 1 : String(sep).length);
  for (const x of xs) n += x === null || x === undefined ? 0 : String(x).length;
  return n;
});
// The library's own range() builds its list in one step; the global is swapped for the bounded one.
const set = Environment.prototype.set;
Environment.prototype.set = function (name, value) {
  return set.call(this, name, name === "range" && typeof value === "function" ? range : value);
};
const cache = new Map();
port.on("message", (m) => {
  let reply;
  try {
    limits = m.limits;
    steps = 0;
    deadline = Date.now() + limits.timeMs;
    let t = cache.get(m.source);
    if (!t) {
      if (cache.size >= 8) cache.clear();
      t = new Template(m.source);
      cache.set(m.source, t);
    }
    const text = t.render(m.vars);
    if (typeof text === "string" && text.length > limits.outputChars) throw new LimitError("its output is more than " + limits.outputChars + " characters");
    reply = { ok: true, text };
  } catch (e) {
    reply = { ok: false, limit: e instanceof LimitError, error: String(e && e.message !== undefined ? e.message : e) };
  }
  port.postMessage(reply);
  Atomics.store(flag, 0, 1);
  Atomics.notify(flag, 0);
});
`;

const jinjaPath = createRequire(import.meta.url).resolve("@huggingface/jinja");
/** Past the template's own deadline, how long the caller waits before it gives the worker up. */
const WORKER_GRACE_MS = 1000;
const NAP = new Int32Array(new SharedArrayBuffer(4));

/** One render worker per process, started when the first template is made, replaced when it fails. */
class TemplateWorker {
  private static current: TemplateWorker | null = null;
  private readonly worker: Worker;
  private readonly port: MessagePort;
  private readonly flag = new Int32Array(new SharedArrayBuffer(4));
  private dead: string | null = null;

  private constructor(private readonly heapMb: number) {
    const { port1, port2 } = new MessageChannel();
    this.port = port1;
    this.worker = new Worker(WORKER_SOURCE, {
      eval: true,
      workerData: { jinja: jinjaPath, port: port2, signal: this.flag.buffer },
      transferList: [port2],
      resourceLimits: { maxOldGenerationSizeMb: heapMb, maxYoungGenerationSizeMb: 16, stackSizeMb: 4 },
      stdout: true, stderr: true,
    });
    // An 'error' event without a listener would throw in the main thread; an out-of-memory worker is
    // just a failed render.
    this.worker.on("error", (e) => { this.dead = e.message; });
    this.worker.on("exit", () => { this.dead ??= "the worker exited"; });
    this.worker.unref();
    this.port.unref();
  }

  static get(heapMb: number): TemplateWorker {
    const w = TemplateWorker.current;
    if (w && w.dead === null && w.heapMb === heapMb) return w;
    w?.stop();
    return (TemplateWorker.current = new TemplateWorker(heapMb));
  }

  private stop(): void {
    if (TemplateWorker.current === this) TemplateWorker.current = null;
    void this.worker.terminate();
    this.port.close();
  }

  render(source: string, vars: Record<string, unknown>, limits: TemplateLimits): string {
    Atomics.store(this.flag, 0, 0);
    try {
      this.port.postMessage({ source, vars, limits });
    } catch (e) {
      throw new ChatTemplateError(`the chat template's variables cannot be passed to it: ${(e as Error).message}`);
    }
    // A worker that dies of its heap limit never signals: the wait then ends at the deadline.
    const waited = Atomics.wait(this.flag, 0, 0, limits.timeMs + WORKER_GRACE_MS);
    let reply = receiveMessageOnPort(this.port)?.message as { ok: boolean; text?: string; limit?: boolean; error?: string } | undefined;
    // The message is queued before the signal; should it lag anyway, give it a few ms.
    for (let i = 0; !reply && waited !== "timed-out" && i < 20; i++) {
      Atomics.wait(NAP, 0, 0, 5);
      reply = receiveMessageOnPort(this.port)?.message as typeof reply;
    }
    if (!reply) {
      this.stop();
      throw new ChatTemplateError(
        `the chat template was stopped: it did not finish within ${limits.timeMs} ms or used more than ${limits.heapMb} MB`);
    }
    if (!reply.ok) {
      // The message may be the template's own (raise_exception): text from the model file.
      const why = printable(reply.error ?? "", 500);
      throw new ChatTemplateError(reply.limit ? `the chat template was stopped: ${why}` : `the chat template failed: ${why}`);
    }
    return reply.text ?? "";
  }
}

export class ChatTemplate {
  private systemRole: boolean | undefined;
  /** Bounds of each render (the template comes from a file: see the top of this file). */
  limits: TemplateLimits = DEFAULT_TEMPLATE_LIMITS;

  /**
   * @param source the Jinja template
   * @param bosToken, eosToken the texts the template sees as bos_token / eos_token
   * @param addBos, addEos whether the tokenizer adds BOS / EOS itself
   */
  constructor(
    readonly source: string,
    readonly bosToken: string,
    readonly eosToken: string,
    readonly addBos: boolean,
    readonly addEos: boolean,
    /** True when the model had no template and a fallback was asked for. */
    readonly isFallback = false,
  ) {
    try {
      new Template(source); // parse errors now, with the model, rather than at the first request
    } catch (e) {
      throw new ChatTemplateError(`the chat template does not parse: ${printable((e as Error).message, 500)}`);
    }
    TemplateWorker.get(this.limits.heapMb); // starts the worker while the caller does other things
  }

  /** The chat template of a model, with its BOS/EOS texts. */
  static forTokenizer(tokenizer: Tokenizer, options: ChatTemplateOptions = {}): ChatTemplate {
    let source = options.template ?? tokenizer.chatTemplate;
    let isFallback = false;
    if (source === undefined || source === "") {
      if (!options.fallback) {
        throw new ChatTemplateError(
          "the model has no chat template (tokenizer.chat_template); give one, or ask for a fallback format (\"chatml\" or \"llama2\")");
      }
      source = FALLBACKS[options.fallback];
      isFallback = true;
    }
    // common_token_to_piece(vocab, token, special = true); no token means an empty string.
    const text = (id: number | null) => (id === null ? "" : new TextDecoder().decode(tokenizer.tokenPiece(id, { special: true })));
    return new ChatTemplate(source, text(tokenizer.bos), text(tokenizer.eos), tokenizer.addBos, tokenizer.addEos, isFallback);
  }

  static fromGguf(file: GgufFile | string, options: ChatTemplateOptions = {}): ChatTemplate {
    return ChatTemplate.forTokenizer(Tokenizer.fromGguf(file), options);
  }

  /**
   * Whether the template renders a system message. llama.cpp probes the same way (does the
   * system content get used?) and, if not, folds the system message into the next one.
   */
  get supportsSystemRole(): boolean {
    if (this.systemRole === undefined) {
      try {
        const probe = [{ role: "system", content: SYSTEM_PROBE }, { role: "user", content: "user" }];
        this.systemRole = this.run({ ...this.baseVariables(), messages: probe, add_generation_prompt: false }).includes(SYSTEM_PROBE);
      } catch (e) {
        // A template that refuses the system role is normal; one stopped for its limits is not.
        if (e instanceof ChatTemplateError && e.message.includes("was stopped")) throw e;
        this.systemRole = false;
      }
    }
    return this.systemRole;
  }

  private baseVariables(now = new Date()): Record<string, unknown> {
    const two = (n: number) => String(n).padStart(2, "0");
    const month = MONTHS[now.getMonth()];
    return {
      bos_token: this.bosToken,
      eos_token: this.eosToken,
      enable_thinking: true,
      datetime: `${month} ${two(now.getDate())} ${now.getFullYear()}`,
      date_string: `${two(now.getDate())} ${month} ${now.getFullYear()}`,
    };
  }

  private run(vars: Record<string, unknown>): string {
    return TemplateWorker.get(this.limits.heapMb).render(this.source, vars, this.limits);
  }

  /** The messages as llama.cpp hands them to the template (developer -> system, system folded in). */
  normalizeMessages(messages: readonly ChatMessage[]): ChatMessage[] {
    if (!Array.isArray(messages)) throw new ChatTemplateError("messages must be an array of { role, content }");
    let out = messages.map((m, i) => {
      if (!m || typeof m.role !== "string" || typeof m.content !== "string") {
        throw new ChatTemplateError(`message ${i} needs a string role and a string content`);
      }
      return m.role === "developer" && !this.source.includes("<|channel|>") ? { ...m, role: "system" } : m;
    });
    if (out.length > 0 && out[0].role === "system" && !this.supportsSystemRole) {
      out = out.length > 1 ? [{ ...out[1], content: `${out[0].content}\n${out[1].content}` }, ...out.slice(2)] : [];
    }
    return out;
  }

  /** Every variable the template is rendered with. */
  variables(messages: readonly ChatMessage[], options: RenderOptions = {}): Record<string, unknown> {
    return {
      ...this.baseVariables(options.now),
      messages: this.normalizeMessages(messages),
      add_generation_prompt: options.addGenerationPrompt ?? true,
      ...(options.tools ? { tools: options.tools } : {}),
      ...options.extra,
    };
  }

  /** The prompt text for `messages`; tokenize it with parseSpecial and addSpecial. */
  render(messages: readonly ChatMessage[], options: RenderOptions = {}): string {
    const vars = this.variables(messages, options);
    let text = this.run(vars);
    if (options.stripAddedSpecial ?? true) {
      if (this.addBos && this.bosToken !== "" && text.startsWith(this.bosToken)) text = text.slice(this.bosToken.length);
      if (this.addEos && this.eosToken !== "" && text.endsWith(this.eosToken)) text = text.slice(0, -this.eosToken.length);
    }
    return text;
  }
}

/** Renders a chat for a model (a GGUF header, its path, or its tokenizer). */
export function renderChat(
  model: GgufFile | string | Tokenizer,
  messages: readonly ChatMessage[],
  options: RenderOptions & ChatTemplateOptions = {},
): string {
  const tokenizer = model instanceof Tokenizer ? model : Tokenizer.fromGguf(model);
  return ChatTemplate.forTokenizer(tokenizer, options).render(messages, options);
}

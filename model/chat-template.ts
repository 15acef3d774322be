// Chat prompts from a model's tokenizer.chat_template (Jinja, rendered with @huggingface/jinja) as
// llama.cpp's common_chat_templates_apply does: messages, add_generation_prompt, bos_token and
// eos_token (the texts of the model's BOS/EOS tokens), enable_thinking and today's date; a system
// message is folded into the next message when the template ignores or refuses the system role;
// then the BOS text is cut from the front when the tokenizer adds BOS itself (EOS likewise).

import { Template } from "@huggingface/jinja";
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

export class ChatTemplate {
  private readonly compiled: Template;
  private systemRole: boolean | undefined;

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
      this.compiled = new Template(source);
    } catch (e) {
      throw new ChatTemplateError(`the chat template does not parse: ${(e as Error).message}`);
    }
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
        this.systemRole = this.compiled.render({ ...this.baseVariables(), messages: probe, add_generation_prompt: false }).includes(SYSTEM_PROBE);
      } catch {
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
    let text: string;
    try {
      text = this.compiled.render(vars);
    } catch (e) {
      throw new ChatTemplateError(`the chat template failed: ${(e as Error).message}`);
    }
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

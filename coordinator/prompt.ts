// From what a user typed (a prompt, or chat messages) to token ids, the same way for run, chat and the
// HTTP API: chat messages go through the model's own template, or a fallback the user chose (chatml
// when serving a model that ships none, as llama-server does).
import { readFileSync } from "node:fs";
import { ChatTemplate, type ChatMessage, type ChatTemplateOptions, type Tokenizer } from "../model/index.js";

/** --chat-template: "chatml" or "llama2" as fallbacks, anything else a Jinja file. */
export function chatTemplateChoice(t: string | undefined, defaultFallback?: "chatml" | "llama2"): ChatTemplateOptions {
  if (t === undefined) return defaultFallback ? { fallback: defaultFallback } : {};
  if (t === "chatml" || t === "llama2") return { fallback: t };
  return { template: readFileSync(t, "utf8") };
}

/** The chat template once, compiled: rendering a request's messages is then cheap. */
export class PromptRenderer {
  private template: ChatTemplate | undefined;

  constructor(private readonly tok: Tokenizer, private readonly choice: ChatTemplateOptions) {}

  /** The template (throws ChatTemplateError when the model has none and no fallback was chosen). */
  get chat(): ChatTemplate {
    this.template ??= ChatTemplate.forTokenizer(this.tok, this.choice);
    return this.template;
  }

  /** Messages rendered with the template, ready to generate the assistant's reply. The rendered text
   * leaves out the BOS the tokenizer adds itself (as llama.cpp does). */
  chatIds(messages: readonly ChatMessage[], tools?: readonly unknown[]): Int32Array {
    return this.tok.encode(this.chatText(messages, tools), { addSpecial: true, parseSpecial: true });
  }

  /** The text chatIds tokenizes. */
  chatText(messages: readonly ChatMessage[], tools?: readonly unknown[], extra?: Readonly<Record<string, unknown>>): string {
    return this.chat.render(messages, { addGenerationPrompt: true, tools, extra });
  }

  /** Text that continues a conversation's tokens: no BOS, special tokens parsed. */
  continuationIds(text: string): Int32Array {
    return this.tok.encode(text, { addSpecial: false, parseSpecial: true });
  }

  /** A plain prompt (BOS as the vocabulary asks). */
  textIds(prompt: string, parseSpecial = true): Int32Array {
    return this.tok.encode(prompt, { addSpecial: true, parseSpecial });
  }
}

/**
 * Conversations' tokens as the model read and wrote them, one per scope (serve: an API key or client;
 * chat: one). Tokenizing a whole conversation afresh each turn would tokenize the replies again, and
 * their text need not come back as the tokens that were generated, so the prompt cache would keep only
 * what precedes the first reply. Instead, as llama.cpp's chat does, a turn whose text continues the
 * scope's last exchange keeps every token of it (prompt and reply as generated) and tokenizes only the
 * text after it. A template that rewrites earlier turns (one that trims a reply, or drops its
 * reasoning) no longer continues the kept text: then the prompt is tokenized whole.
 */
export class ConversationTokens {
  /** Per scope, its last exchanges (oldest first): a client may keep several conversations going. */
  private readonly recent = new Map<string, { text: string; ids: readonly number[] }[]>();

  constructor(private readonly prompts: PromptRenderer, private readonly maxScopes = 64, private readonly perScope = 8) {}

  /** The ids of `text` (a rendered prompt: BOS added, special tokens parsed), and how many of them were
   * kept from the scope's exchange it continues (the longest one it starts with). */
  ids(scope: string, text: string): { ids: Int32Array; kept: number } {
    let best: { text: string; ids: readonly number[] } | undefined;
    for (const e of this.recent.get(scope) ?? []) if (text.startsWith(e.text) && (!best || e.text.length > best.text.length)) best = e;
    if (!best) return { ids: this.prompts.textIds(text), kept: 0 };
    const added = this.prompts.continuationIds(text.slice(best.text.length));
    return { ids: Int32Array.from([...best.ids, ...added]), kept: best.ids.length };
  }

  /** An exchange ended whole: the prompt's text and ids, the reply's text and its tokens as generated
   * (the end token left out: a template writes its own end of turn). Not for a reply cut by a stop
   * string: its text no longer stands for its tokens. */
  remember(scope: string, promptText: string, promptIds: Int32Array, replyText: string, replyIds: readonly number[]): void {
    const list = this.recent.get(scope) ?? [];
    this.recent.delete(scope);
    if (this.recent.size >= this.maxScopes) this.recent.delete(this.recent.keys().next().value!);
    list.push({ text: promptText + replyText, ids: [...promptIds, ...replyIds] });
    this.recent.set(scope, list.slice(-this.perScope));
  }

  /** A new conversation, or a turn that failed: the scope's next prompts are tokenized whole. */
  forget(scope: string): void {
    this.recent.delete(scope);
  }
}

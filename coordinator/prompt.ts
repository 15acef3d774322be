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
  chatIds(messages: readonly ChatMessage[]): Int32Array {
    return this.tok.encode(this.chatText(messages), { addSpecial: true, parseSpecial: true });
  }

  /** The text chatIds tokenizes. */
  chatText(messages: readonly ChatMessage[]): string {
    return this.chat.render(messages, { addGenerationPrompt: true });
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
 * A conversation's tokens as the model read and wrote them. Re-tokenizing a whole conversation each turn
 * would tokenize the replies afresh, and their text need not come back as the tokens that were
 * generated, so the prompt cache would keep only what precedes the first reply. Instead, as llama.cpp's
 * chat does, a turn keeps every token so far (the prompts and the replies as generated) and tokenizes
 * only the text the template adds after them. A template that rewrites earlier turns (one that trims a
 * reply, or drops its reasoning) no longer starts with the kept text: then the turn is tokenized whole.
 */
export class ChatTokens {
  private text = "";
  private ids: number[] = [];

  constructor(private readonly prompts: PromptRenderer) {}

  /** The ids of the whole conversation, ready for the assistant's reply, and how many were kept. */
  next(messages: readonly ChatMessage[]): { ids: Int32Array; kept: number } {
    const full = this.prompts.chatText(messages);
    if (this.ids.length === 0 || !full.startsWith(this.text)) return { ids: this.prompts.chatIds(messages), kept: 0 };
    const added = this.prompts.continuationIds(full.slice(this.text.length));
    return { ids: Int32Array.from([...this.ids, ...added]), kept: this.ids.length };
  }

  /** The turn was answered: the prompt it was given (from next) with its text, and the reply's tokens
   * as generated (the end token left out: the template writes its own end of turn). */
  answered(messages: readonly ChatMessage[], promptIds: Int32Array, replyIds: readonly number[], replyText: string): void {
    this.text = this.prompts.chatText(messages) + replyText;
    this.ids = [...promptIds, ...replyIds];
  }

  /** A new conversation, or a turn that failed: the next is tokenized whole. */
  reset(): void {
    this.text = "";
    this.ids = [];
  }
}

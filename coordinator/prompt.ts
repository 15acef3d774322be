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
    const text = this.chat.render(messages, { addGenerationPrompt: true, tools });
    return this.tok.encode(text, { addSpecial: true, parseSpecial: true });
  }

  /** A plain prompt (BOS as the vocabulary asks). */
  textIds(prompt: string, parseSpecial = true): Int32Array {
    return this.tok.encode(prompt, { addSpecial: true, parseSpecial });
  }
}

// The model's reasoning apart from its answer, as llama-server does by default (--reasoning-format
// auto) and Ollama does: gpt-oss's analysis channel (harmony.ts), or a <think>...</think> block at the
// start of the reply (Qwen3, QwQ, DeepSeek R1 and their distills). A template that opens the block
// itself (its generation prompt ends in <think>) leaves the model inside it from the first token.
// The reasoning and the answer are trimmed at the block's edges, as llama.cpp's parsers trim them.
import type { CallFormat } from "./format.js";
import { HarmonyParser } from "./harmony.js";
import { ToolCallParser, type ReplyEvent, type ReplyParser, type ToolCall } from "./parse.js";

/** How a model marks its reasoning, read from its chat template. */
export type ReasoningStyle = "harmony" | "think";

/** llama-server's --reasoning-format: auto (and its older name deepseek) splits, none keeps it in the content. */
export const REASONING_FORMATS = ["auto", "deepseek", "none"] as const;
export type ReasoningFormat = (typeof REASONING_FORMATS)[number];

const OPEN = "<think>";
const CLOSE = "</think>";

/** The reasoning style of a template's model (undefined: it has none this server knows). */
export function detectReasoning(templateSource: string | undefined): ReasoningStyle | undefined {
  const s = templateSource ?? "";
  if (s.includes("<|channel|>")) return "harmony";
  if (s.includes(CLOSE)) return "think";
  return undefined;
}

/** The opening the prompt ends with when its template opened the <think> block for the model ("<think>\n"). */
export function openedThink(promptText: string): string | undefined {
  const at = promptText.lastIndexOf(OPEN);
  return at >= 0 && promptText.slice(at + OPEN.length).trim() === "" ? promptText.slice(at) : undefined;
}

/** The reply as content only (no calls to read). */
class TextParser implements ReplyParser {
  readonly calls: readonly ToolCall[] = [];
  private content = "";

  push(piece: string): ReplyEvent[] {
    this.content += piece;
    return piece ? [{ kind: "content", text: piece }] : [];
  }

  finish() {
    return { events: [], content: this.content, reasoning: null };
  }
}

/** A <think> block at the start of the reply as reasoning; the rest goes to `inner` (calls, content). */
export class ThinkParser implements ReplyParser {
  private state: "start" | "inside" | "after" | "rest";
  private buf = "";
  private reasoning = "";

  /**
   * @param opened the opening the prompt ended with (the model starts inside the block), if it did
   * @param split false: no split (--reasoning-format none); the content then starts with the opening
   *   the prompt had, as llama.cpp's does
   */
  constructor(private readonly inner: ReplyParser, private readonly split: boolean, opened?: string) {
    this.state = !split ? "rest" : opened !== undefined ? "inside" : "start";
    if (!split && opened !== undefined) this.buf = opened;
  }

  get calls(): readonly ToolCall[] {
    return this.inner.calls;
  }

  push(piece: string): ReplyEvent[] {
    this.buf += piece;
    const out: ReplyEvent[] = [];
    while (this.buf.length > 0 && this.step(out));
    return out;
  }

  finish(): { events: ReplyEvent[]; content: string | null; reasoning: string | null } {
    const events: ReplyEvent[] = [];
    if (this.state === "inside") this.addReasoning(this.buf.trimEnd(), events);
    else if (this.state === "start" || this.state === "rest") events.push(...this.inner.push(this.buf));
    this.buf = "";
    const end = this.inner.finish();
    return { events: [...events, ...end.events], content: end.content, reasoning: this.reasoning || null };
  }

  private addReasoning(text: string, out: ReplyEvent[]): void {
    // The block's leading whitespace is no reasoning.
    const t = this.reasoning ? text : text.trimStart();
    if (!t) return;
    this.reasoning += t;
    out.push({ kind: "reasoning", text: t });
  }

  /** One move; false when it needs more text. */
  private step(out: ReplyEvent[]): boolean {
    switch (this.state) {
      case "start": {
        const s = this.buf.trimStart();
        if (s.startsWith(OPEN)) {
          this.buf = s.slice(OPEN.length);
          this.state = "inside";
          return true;
        }
        if (OPEN.startsWith(s)) return false;
        this.state = "rest";
        return true;
      }
      case "inside": {
        const at = this.buf.indexOf(CLOSE);
        if (at >= 0) {
          this.addReasoning(this.buf.slice(0, at).trimEnd(), out);
          this.buf = this.buf.slice(at + CLOSE.length);
          this.state = "after";
          return true;
        }
        // Hold back what may start the close, and trailing whitespace (it may be the block's last).
        let hold = 0;
        for (let n = Math.min(CLOSE.length - 1, this.buf.length); n > 0; n--) {
          if (this.buf.endsWith(CLOSE.slice(0, n))) {
            hold = n;
            break;
          }
        }
        const text = this.buf.slice(0, this.buf.length - hold).trimEnd();
        this.addReasoning(text, out);
        this.buf = this.buf.slice(text.length);
        return false;
      }
      case "after": {
        // The answer's leading whitespace is no content.
        const s = this.buf.trimStart();
        this.buf = s;
        if (!s) return false;
        this.state = "rest";
        return true;
      }
      case "rest":
        out.push(...this.inner.push(this.buf));
        this.buf = "";
        return false;
    }
  }
}

export interface ReplyParserOptions {
  /** The call format, when tools are given and tool_choice is not none. */
  readonly format?: CallFormat;
  /** The functions a call may name. */
  readonly names: readonly string[];
  readonly reasoning?: ReasoningStyle;
  /** Reasoning apart from the content (--reasoning-format auto); false: kept in the content (none). */
  readonly split: boolean;
  /** The rendered prompt (a <think> the template opened). */
  readonly promptText?: string;
}

/** The parser of a chat reply: calls in the model's format, reasoning in its style (undefined: the text is all content). */
export function replyParser(o: ReplyParserOptions): ReplyParser | undefined {
  if (o.reasoning === "harmony" || o.format?.name === "harmony") return new HarmonyParser(o.format?.name === "harmony" ? o.names : [], o.split);
  const calls = o.format ? new ToolCallParser(o.format, o.names) : undefined;
  if (o.reasoning !== "think") return calls;
  return new ThinkParser(calls ?? new TextParser(), o.split, o.promptText === undefined ? undefined : openedThink(o.promptText));
}

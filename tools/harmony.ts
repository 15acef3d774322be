// gpt-oss's replies, in OpenAI's harmony format, read as they stream. A reply is a run of messages,
// each a header, <|message|>, a body and an end: <|end|> between messages; <|call|> or <|return|>
// are end-of-generation tokens, so the last message usually just stops. After the first message each
// starts again with <|start|>assistant. The header names the channel (analysis: reasoning; final and
// commentary: the answer) and, for a call, the recipient, in the channel header
// (<|channel|>commentary to=functions.NAME <|constrain|>json) or in the role header
// ( to=functions.NAME<|channel|>commentary json). These are the shapes llama.cpp's gpt-oss parser
// accepts (common/parsers/gpt-oss.cpp), stray "<|channel|>commentary to=assistant" prefixes included;
// a call to a recipient that is not a given function (the model's built-in browser or python) is
// dropped, as there. Text outside any message (JSON forced from the first token, a tiny model's words)
// is content as it is, up to where a message begins.
import { FORMATS } from "./format.js";
import type { ReplyEvent, ReplyParser, ToolCall } from "./parse.js";

const MESSAGE = "<|message|>";
const ANALYSIS = "<|channel|>analysis<|message|>";
/** Texts that end a message's body (the last two are end-of-generation tokens a model rarely writes as text). */
const TERMINATORS = ["<|end|>", "<|call|>", "<|return|>"];
/** How a header may begin: a new message's role, its channel, or a recipient in the role header. */
const HEADER_STARTS = ["<|start|>", "<|channel|>", " to="];
/** Where a message may begin in text outside one (" to=" is too common in text to count there). */
const RESUME = ["<|start|>", "<|channel|>"];
/** Longer than any header the format has: past it without <|message|>, the text is not a header. */
const MAX_HEADER = 512;

type Body =
  | { readonly kind: "reasoning" | "content" | "drop" }
  /** Reasoning kept as content (--reasoning-format none), its markup with it, as llama.cpp keeps it. */
  | { readonly kind: "raw-analysis" }
  | { readonly kind: "call"; readonly index: number };

function mayBeHeader(t: string): boolean {
  return t.length <= MAX_HEADER && HEADER_STARTS.some((h) => t.startsWith(h) || h.startsWith(t));
}

/** The longest end of `t` that is the start of one of `words` (text to hold back until the next piece). */
function heldBack(t: string, words: readonly string[]): number {
  for (let n = Math.min(t.length, Math.max(...words.map((w) => w.length - 1))); n > 0; n--) {
    const end = t.slice(t.length - n);
    if (words.some((w) => w.startsWith(end))) return n;
  }
  return 0;
}

export class HarmonyParser implements ReplyParser {
  readonly calls: ToolCall[] = [];
  private state: "head" | "body" | "plain" = "head";
  private body: Body = { kind: "content" };
  private buf = "";
  private content = "";
  private reasoning = "";
  /** A call's arguments so far: their nesting depth, inside a string, after a backslash, begun. */
  private json = { depth: 0, inString: false, escaped: false, started: false };

  /**
   * @param names the functions a call may name (none: calls are dropped, as with tool_choice none)
   * @param split reasoning apart from the content (llama-server's --reasoning-format auto); false: the
   *   analysis messages stay in the content with their markup (none)
   */
  constructor(private readonly names: readonly string[], private readonly split = true) {}

  push(piece: string): ReplyEvent[] {
    this.buf += piece;
    const out: ReplyEvent[] = [];
    while (this.buf.length > 0 && this.step(out));
    return out;
  }

  finish(): { events: ReplyEvent[]; content: string | null; reasoning: string | null } {
    const events: ReplyEvent[] = [];
    // What is left: a body's last text (perhaps the start of an end it never wrote), or a header that
    // never reached its message (markup, no text of the reply).
    if (this.state !== "head") this.emit(this.buf, events);
    this.buf = "";
    const content = this.calls.length > 0 ? this.content.trim() || null : this.content;
    return { events, content, reasoning: this.reasoning || null };
  }

  private emit(text: string, out: ReplyEvent[]): void {
    if (!text) return;
    const b = this.state === "plain" ? { kind: "content" as const } : this.body;
    switch (b.kind) {
      case "reasoning":
        this.reasoning += text;
        out.push({ kind: "reasoning", text });
        return;
      case "content":
      case "raw-analysis":
        this.content += text;
        out.push({ kind: "content", text });
        return;
      case "call":
        this.calls[b.index].arguments += text;
        out.push({ kind: "arguments", index: b.index, text });
        return;
      case "drop":
        return;
    }
  }

  /** One move; false when it needs more text. */
  private step(out: ReplyEvent[]): boolean {
    switch (this.state) {
      case "plain": {
        // Text outside any message, up to where a message may begin (a call the grammar let through
        // after free text, with tool_choice auto).
        let at = -1;
        for (const h of RESUME) {
          const i = this.buf.indexOf(h);
          if (i >= 0 && (at < 0 || i < at)) at = i;
        }
        if (at >= 0) {
          this.emit(this.buf.slice(0, at), out);
          this.buf = this.buf.slice(at);
          this.state = "head";
          return true;
        }
        const hold = heldBack(this.buf, RESUME);
        this.emit(this.buf.slice(0, this.buf.length - hold), out);
        this.buf = this.buf.slice(this.buf.length - hold);
        return false;
      }
      case "head": {
        const at = this.buf.indexOf(MESSAGE);
        const header = at < 0 ? this.buf : this.buf.slice(0, at);
        if (!mayBeHeader(header)) {
          // Not a header after all: its first character is content, the rest is read afresh.
          this.state = "plain";
          this.emit(this.buf[0], out);
          this.buf = this.buf.slice(1);
          return true;
        }
        if (at < 0) return false;
        this.openBody(header, out);
        this.buf = this.buf.slice(at + MESSAGE.length);
        this.state = "body";
        return true;
      }
      case "body": {
        if (this.body.kind === "call") return this.stepArguments(out);
        let at = -1;
        let end = "";
        for (const t of TERMINATORS) {
          const i = this.buf.indexOf(t);
          if (i >= 0 && (at < 0 || i < at)) [at, end] = [i, t];
        }
        if (at >= 0) {
          this.emit(this.buf.slice(0, at), out);
          if (this.body.kind === "raw-analysis") this.emit(end, out);
          this.buf = this.buf.slice(at + end.length);
          this.state = "head";
          return true;
        }
        const hold = heldBack(this.buf, TERMINATORS);
        this.emit(this.buf.slice(0, this.buf.length - hold), out);
        this.buf = this.buf.slice(this.buf.length - hold);
        return false;
      }
    }
  }

  /** A call's arguments: they end where their JSON value closes (strings and escapes followed, so an
   * end marker inside a string is text), or at an end marker outside a string; what follows the value
   * up to the end marker is no part of them. */
  private stepArguments(out: ReplyEvent[]): boolean {
    const j = this.json;
    for (let i = 0; i < this.buf.length; i++) {
      const c = this.buf[i];
      if (j.inString) {
        if (j.escaped) j.escaped = false;
        else if (c === "\\") j.escaped = true;
        else if (c === "\"") j.inString = false;
        continue;
      }
      if (c === "<") {
        const rest = this.buf.slice(i);
        const end = TERMINATORS.find((t) => rest.startsWith(t));
        if (end) {
          this.emit(this.buf.slice(0, i), out);
          this.buf = rest.slice(end.length);
          this.state = "head";
          return true;
        }
        if (TERMINATORS.some((t) => t.startsWith(rest))) {
          this.emit(this.buf.slice(0, i), out);
          this.buf = rest;
          return false;
        }
      }
      if (c === "\"") j.inString = true;
      else if (c === "{" || c === "[") j.depth++;
      else if (c === "}" || c === "]") j.depth--;
      if (!/\s/.test(c)) j.started = true;
      if (j.started && j.depth === 0 && !j.inString && (c === "}" || c === "]" || c === "\"")) {
        this.emit(this.buf.slice(0, i + 1), out);
        this.buf = this.buf.slice(i + 1);
        this.body = { kind: "drop" };
        return true;
      }
    }
    this.emit(this.buf, out);
    this.buf = "";
    return false;
  }

  /** What the message with this header is: its last channel and its first recipient that is not the assistant. */
  private openBody(header: string, out: ReplyEvent[]): void {
    const channels = [...header.matchAll(/<\|channel\|>([A-Za-z0-9_.-]*)/g)].map((m) => m[1]);
    const channel = channels.at(-1) ?? "";
    const recipient = [...header.matchAll(/ to=([^\s<]+)/g)].map((m) => m[1]).find((r) => r !== "assistant");
    if (recipient !== undefined) {
      const name = recipient.startsWith("functions.") ? recipient.slice("functions.".length) : undefined;
      if (name === undefined || !this.names.includes(name)) {
        this.body = { kind: "drop" };
        return;
      }
      const id = FORMATS.harmony.newId();
      this.calls.push({ id, name, arguments: "" });
      this.body = { kind: "call", index: this.calls.length - 1 };
      this.json = { depth: 0, inString: false, escaped: false, started: false };
      out.push({ kind: "call", index: this.calls.length - 1, id, name });
      return;
    }
    if (channel === "analysis") {
      this.body = { kind: this.split ? "reasoning" : "raw-analysis" };
      if (!this.split) this.emit(ANALYSIS, out);
      return;
    }
    this.body = { kind: "content" };
  }
}

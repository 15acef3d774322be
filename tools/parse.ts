// Reads tool calls out of a reply as it is generated, so a stream can send them as OpenAI does: the
// text before a call as content, then per call its id and name once and its arguments in pieces. The
// arguments end where their JSON value closes (strings and escapes followed), not at the first text
// that looks like the format's end, which may sit inside a string.
import { GENERIC_RESPONSE_BEGIN, type CallFormat } from "./format.js";

export interface ToolCall {
  readonly id: string;
  readonly name: string;
  arguments: string;
}

export type ReplyEvent =
  | { readonly kind: "content"; readonly text: string }
  /** The model's reasoning (harmony's analysis channel, a <think> block), apart from its answer. */
  | { readonly kind: "reasoning"; readonly text: string }
  | { readonly kind: "call"; readonly index: number; readonly id: string; readonly name: string }
  | { readonly kind: "arguments"; readonly index: number; readonly text: string };

/** Reads a reply as it streams: its content, its reasoning and its calls, as events. */
export interface ReplyParser {
  readonly calls: readonly ToolCall[];
  push(piece: string): ReplyEvent[];
  /** The end of the reply: what is left, the content and the reasoning as wholes (null when there is none). */
  finish(): { events: ReplyEvent[]; content: string | null; reasoning: string | null };
}

type State = "text" | "begin" | "args" | "end";

export class ToolCallParser implements ReplyParser {
  readonly calls: ToolCall[] = [];
  private state: State = "text";
  private buf = "";
  /** The arguments' JSON: nesting depth, inside a string, after a backslash. */
  private depth = 0;
  private inString = false;
  private escaped = false;
  private started = false;
  /** Content, kept apart so the generic format's {"response": ...} can be unwrapped at the end. */
  private content = "";

  constructor(private readonly f: CallFormat, private readonly names: readonly string[]) {}

  /** The generic format's text reply is JSON, told apart only when whole: its content waits for finish(). */
  private get holdContent(): boolean {
    return this.f.name === "generic";
  }

  push(piece: string): ReplyEvent[] {
    this.buf += piece;
    const out: ReplyEvent[] = [];
    for (let progress = true; progress && this.buf.length > 0; ) progress = this.step(out);
    return out;
  }

  /** The end of the reply: what is left, and the content as a whole (null when there is none). */
  finish(): { events: ReplyEvent[]; content: string | null; reasoning: null } {
    const events: ReplyEvent[] = [];
    if (this.state === "text" || this.state === "begin") this.addContent(this.buf, events);
    else if (this.state === "args" && this.buf) this.addArgs(this.buf, events);
    this.buf = "";
    let content: string | null = this.content;
    if (this.holdContent) {
      content = unwrapGeneric(content);
      if (content) events.push({ kind: "content", text: content });
    }
    // Beside calls, the whitespace between them is no content.
    if (this.calls.length > 0) content = content.trim() || null;
    return { events, content, reasoning: null };
  }

  private addContent(text: string, out: ReplyEvent[]): void {
    if (!text) return;
    this.content += text;
    if (!this.holdContent) out.push({ kind: "content", text });
  }

  private addArgs(text: string, out: ReplyEvent[]): void {
    const call = this.calls.at(-1)!;
    call.arguments += text;
    out.push({ kind: "arguments", index: this.calls.length - 1, text });
  }

  /** One move of the state machine; false when it needs more text. */
  private step(out: ReplyEvent[]): boolean {
    const f = this.f;
    switch (this.state) {
      case "text": {
        const at = this.buf.indexOf(f.trigger);
        if (at >= 0) {
          this.addContent(this.buf.slice(0, at), out);
          this.buf = this.buf.slice(at);
          this.state = "begin";
          return true;
        }
        // Hold back what may be the start of the trigger.
        let hold = 0;
        for (let n = Math.min(f.trigger.length - 1, this.buf.length); n > 0; n--) {
          if (this.buf.endsWith(f.trigger.slice(0, n))) {
            hold = n;
            break;
          }
        }
        this.addContent(this.buf.slice(0, this.buf.length - hold), out);
        this.buf = this.buf.slice(this.buf.length - hold);
        return false;
      }
      case "begin": {
        for (const name of this.names) {
          const b = f.begin(name);
          if (this.buf.startsWith(b)) {
            const id = f.newId();
            this.calls.push({ id, name, arguments: "" });
            out.push({ kind: "call", index: this.calls.length - 1, id, name });
            this.buf = this.buf.slice(b.length);
            this.state = "args";
            this.depth = 0;
            this.inString = this.escaped = this.started = false;
            return true;
          }
        }
        if (this.names.some((n) => f.begin(n).startsWith(this.buf))) return false;
        // Not a call after all (text the grammar did not constrain): its first character is content.
        this.addContent(this.buf[0], out);
        this.buf = this.buf.slice(1);
        this.state = "text";
        return true;
      }
      case "args": {
        let i = 0;
        let done = false;
        for (; i < this.buf.length && !done; i++) {
          const c = this.buf[i];
          if (this.inString) {
            if (this.escaped) this.escaped = false;
            else if (c === "\\") this.escaped = true;
            else if (c === "\"") this.inString = false;
          } else if (c === "\"") this.inString = true;
          else if (c === "{" || c === "[") this.depth++;
          else if (c === "}" || c === "]") this.depth--;
          if (!/\s/.test(c)) this.started = true;
          done = this.started && this.depth === 0 && !this.inString && (c === "}" || c === "]" || c === "\"");
        }
        this.addArgs(this.buf.slice(0, i), out);
        this.buf = this.buf.slice(i);
        if (done) this.state = "end";
        return done;
      }
      case "end": {
        if (this.buf.length < f.end.length) {
          if (f.end.startsWith(this.buf)) return false;
        } else if (this.buf.startsWith(f.end)) {
          this.buf = this.buf.slice(f.end.length);
          this.state = "text";
          return true;
        }
        this.state = "text";
        return true;
      }
    }
  }
}

/** {"response": "text"} -> text; anything else is left as it is. */
function unwrapGeneric(content: string): string {
  const t = content.trim();
  if (!t.startsWith(GENERIC_RESPONSE_BEGIN.trim().slice(0, 2))) return content;
  try {
    const v = JSON.parse(t) as { response?: unknown };
    return typeof v.response === "string" ? v.response : content;
  } catch {
    return content;
  }
}

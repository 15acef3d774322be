// A generated token's way to the client, in one place: the run hands each token to push() (its
// request's onToken); its text is decoded (a piece may be part of a UTF-8 character), held back while
// it may begin a stop string, parsed for tool calls where the reply may call tools, and handed to the
// dialect's writer with the log probabilities of the tokens whose text it reaches.
import type { Sampler } from "../engine/index.js";
import { StreamingDecoder, type Tokenizer } from "../model/index.js";
import type { ReplyEvent, ReplyParser } from "../tools/index.js";
import type { ReplyWriter } from "./http-reply.js";
import { StopMatcher, type TokenLogprobs } from "./openai-reply.js";

export class ReplyStream {
  /** The reply's text so far, as handed on. */
  text = "";
  readonly stops: StopMatcher;
  /** Log probabilities (when asked for): one entry per generated token, with where its text starts
   * among the decoded text. A token belongs to the reply unless a stop string cut the text before it. */
  readonly entries: TokenLogprobs[] | undefined;
  private readonly decoder: StreamingDecoder;
  /** Tokens generated since the last piece was handed on (a piece held back for a stop string or a
   * split character waits for the next token). */
  private pending: number[] = [];
  private decodedLength = 0;
  private entriesSent = 0;

  constructor(
    tok: Tokenizer, stop: readonly string[], logprobs: boolean, readonly parser: ReplyParser | undefined,
    private readonly w: ReplyWriter, private readonly sampler: Sampler,
  ) {
    this.decoder = new StreamingDecoder(tok);
    this.stops = new StopMatcher(stop);
    this.entries = logprobs ? [] : undefined;
  }

  /** A generated token; false once a stop string ended the reply. */
  push(id: number): boolean {
    this.pending.push(id);
    if (this.entries && this.sampler.last) this.entries.push({ ...this.sampler.last, offset: this.decodedLength });
    this.emit(this.stops.push(this.decoded(this.decoder.push(id))));
    return !this.stops.stopped;
  }

  /** The generation ended: what the decoder and the stop matcher held back goes on; the entries keep
   * the reply's tokens, all but those a stop string cut off. */
  end(): void {
    this.emit(this.stops.push(this.decoded(this.decoder.flush())));
    this.emit(this.stops.flush());
    if (this.entries && this.stops.stopped) this.entries.length = this.entries.filter((e) => e.offset < this.text.length).length;
  }

  send(events: ReplyEvent[]): void {
    if (events.length === 0) return;
    this.w.events(events, this.pending, this.due(this.text.length));
    this.pending = [];
  }

  /** The entries not handed on yet whose text starts before `end`. */
  private due(end: number): TokenLogprobs[] | undefined {
    const { entries } = this;
    if (!entries) return undefined;
    let j = this.entriesSent;
    while (j < entries.length && entries[j].offset < end) j++;
    const out = entries.slice(this.entriesSent, j);
    this.entriesSent = j;
    return out;
  }

  private decoded(t: string): string {
    this.decodedLength += t.length;
    return t;
  }

  private emit(t: string): void {
    if (!t) return;
    this.text += t;
    this.send(this.parser ? this.parser.push(t) : [{ kind: "content", text: t }]);
  }
}

// prima-coord chat model.gguf (or run -i): a multi-turn chat in the terminal, alone or with workers.
// Each turn keeps the conversation's tokens as they were read and written (ConversationTokens) and
// adds the template's text for the new turn; the cluster's prompt cache keeps the earlier turns' KV on
// every device, so a turn pays only for its new tokens.
import { createInterface } from "node:readline";
import { Sampler } from "../engine/index.js";
import type { ChatMessage } from "../model/index.js";
import { StreamingDecoder, type Tokenizer } from "../model/index.js";
import { ENGINE_HELP, RING_HELP, SAMPLING_HELP, contextShiftFor, intArg, parseClusterArgs, usageExit, type ClusterArgs } from "./args.js";
import { CancelledError } from "./queue.js";
import { clusterFor, log, openHead } from "./head.js";
import { ConversationTokens } from "./prompt.js";
import { detectReasoning, replyParser, type ReplyEvent } from "../tools/index.js";

const HELP = `usage: prima-coord chat model.gguf [options]

A conversation in the terminal: type a message and press Enter. /reset starts over, /exit (or Ctrl-D)
leaves; Ctrl-C stops a reply that is being written.

The model's reasoning (gpt-oss's analysis, a <think> block) goes to stderr, its answer to stdout; only
the answer joins the conversation, as the API's clients send it back.

      --system TEXT        system message
  -n, --n-predict N        most tokens per reply (default 512)
${SAMPLING_HELP}
${ENGINE_HELP}
      --port N             gRPC port workers join on (default 7400)
${RING_HELP}`;

interface ChatArgs extends ClusterArgs {
  readonly system?: string;
  readonly nPredict: number;
  readonly port: number;
}

export async function chatCommand(argv: string[]): Promise<number> {
  let a: ChatArgs;
  try {
    const { cluster, values } = parseClusterArgs(argv, {
      system: { type: "string" }, "n-predict": { type: "string", short: "n" }, port: { type: "string" },
    }, HELP, "chat");
    a = {
      ...cluster, system: values.system as string | undefined, nPredict: intArg("n-predict", values["n-predict"] as string | undefined, 512, 1),
      port: intArg("port", values.port as string | undefined, 7400, 0, 65535),
    };
  } catch (e) {
    return usageExit(e);
  }
  return chatWith(a);
}

/** Strips control characters other than newline and tab from model text before it reaches the terminal. */
function printable(s: string): string {
  return s.replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g, "");
}

/** Prints a reply as its tokens come, escaped: its answer to stdout, its reasoning (where the template
 * has one) to stderr. finish() ends the line and gives the whole text and the answer alone. */
function replyPrinter(tok: Tokenizer, reasoning: ReturnType<typeof detectReasoning>, promptText: string): { token(id: number): void; finish(): { text: string; content: string } } {
  const stream = new StreamingDecoder(tok);
  const parser = replyParser({ names: [], reasoning, split: true, promptText });
  let text = "";
  const show = (events: readonly ReplyEvent[]) => {
    for (const e of events) {
      if (e.kind === "content") process.stdout.write(printable(e.text));
      else if (e.kind === "reasoning") process.stderr.write(printable(e.text));
    }
  };
  const write = (piece: string) => {
    text += piece;
    if (parser) show(parser.push(piece));
    else process.stdout.write(printable(piece));
  };
  return {
    token: (id) => write(stream.push(id)),
    finish: () => {
      write(stream.flush());
      const parts = parser?.finish();
      if (parts) show(parts.events);
      if (parts?.reasoning) process.stderr.write("\n");
      process.stdout.write("\n");
      return { text, content: parts ? parts.content ?? "" : text };
    },
  };
}

export async function chatWith(a: ClusterArgs & { system?: string; nPredict: number; port: number }): Promise<number> {
  const { model, tok, prompts } = openHead(a, "chatml");
  if (prompts.chat.isFallback) log(`the model has no chat template: using ${a.chatTemplate ?? "chatml"}`);
  const reasoning = prompts.chat.isFallback ? undefined : detectReasoning(prompts.chat.source);
  const cluster = clusterFor(a, model, log);
  const rl = createInterface({ input: process.stdin, output: process.stdout, terminal: process.stdin.isTTY === true });
  let current: AbortController | undefined;
  rl.on("SIGINT", () => {
    if (current) current.abort();
    else rl.close();
  });
  try {
    if (a.minWorkers > 0 || a.layerWindows !== undefined) {
      const port = await cluster.start(a.port);
      log(`listening for workers on port ${port}; waiting for ${a.minWorkers}`);
      await cluster.registry.waitFor(a.minWorkers, a.joinTimeoutS * 1000);
    }
    await cluster.ensurePlaced();
    const messages: ChatMessage[] = a.system ? [{ role: "system", content: a.system }] : [];
    const conversation = new ConversationTokens(prompts);
    const lines = rl[Symbol.asyncIterator]();
    for (;;) {
      if (process.stdin.isTTY) process.stdout.write("> ");
      const next = await lines.next();
      if (next.done) break;
      const line = next.value.trim();
      if (line === "/exit" || line === "/quit") break;
      if (line === "/reset") {
        messages.splice(a.system ? 1 : 0);
        conversation.forget("");
        console.log("(a new conversation)");
        continue;
      }
      if (!line) continue;
      messages.push({ role: "user", content: line });
      const promptText = prompts.chatText(messages);
      const { ids } = conversation.ids("", promptText);
      // Shifting, a conversation goes on past the context: the cache continues the last turn's shifted one.
      if (ids.length >= cluster.o.ctx && !a.contextShift) {
        console.error(`prima-coord: the conversation has ${ids.length} tokens, the context only ${cluster.o.ctx}: /reset, or raise --ctx`);
        messages.pop();
        continue;
      }
      const printer = replyPrinter(tok, reasoning, promptText);
      current = new AbortController();
      try {
        const out = await cluster.generate({
          kind: "chat", prompt: ids, maxTokens: a.nPredict, sampler: new Sampler(a.samplerOptions), isEnd: (id) => tok.isEog(id),
          contextShift: contextShiftFor(a, ids.length, tok.addBos, cluster.o.ctx),
          signal: current.signal,
          onToken: (id) => printer.token(id),
        });
        const reply = printer.finish();
        const r = out.result;
        log(`${r.ids.length} tokens, ${r.decodeSteps > 0 ? (r.decodeSteps / (r.decodeMs / 1000)).toFixed(1) : "-"} tok/s, ` +
          `first token after ${(out.firstTokenMs ?? 0).toFixed(0)} ms (${out.cachedTokens} of ${ids.length} prompt tokens cached)`);
        conversation.remember("", promptText, ids, reply.text, r.ids);
        messages.push({ role: "assistant", content: reply.content });
      } catch (e) {
        conversation.forget("");
        if (e instanceof CancelledError) continue;
        console.error(`\nprima-coord: ${(e as Error).message}`);
        messages.pop();
      } finally {
        current = undefined;
      }
    }
    return 0;
  } catch (e) {
    console.error(`prima-coord: ${e instanceof Error ? e.message : String(e)}`);
    return 1;
  } finally {
    rl.close();
    await cluster.close();
    model.close();
  }
}

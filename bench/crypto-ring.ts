// A ring of processes for bench/crypto.ts, built from ring/'s own API the way worker/device.ts and
// coordinator/ring-setup.ts build one: the head (embedding, its window, sampling) in the calling
// process, and devices as child processes (this file run as `device`), each on the native lane. The
// links are keyed (a fresh key per link, each given to its two ends only, as the coordinator hands
// them out) or plaintext, which the product never asks for: so the bench, not a switch in the
// product, says which.
//   node dist/bench/crypto-ring.js device   (reads its DeviceSpec as one JSON line on stdin)
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { createInterface } from "node:readline";
import { LocalModel, Sampler, generate } from "../engine/index.js";
import { Tokenizer } from "../model/index.js";
import {
  RING_COMPUTE_OPTIONS, RingLane, RingListener, RingNode, RingPipeline, dialSuccessor, resolveLinkOptions, type RingLink,
  type RingLinkOptions, type WindowSpec,
} from "../ring/index.js";
import { runWhenMain } from "./procs.js";

const FINGERPRINT = "bench-crypto-ring";
const HEAD_ID = "head";

/** What a device child is told: its layers, its neighbours and (keyed) its two links' keys. */
interface DeviceSpec {
  model: string;
  ringId: string;
  id: string;
  predecessorId: string;
  successorId: string;
  successorUrl: string;
  firstLayer: number;
  endLayer: number;
  ctx: number;
  maxBatch: number;
  /** Hex keys of the link from the predecessor and the link to the successor; absent: plaintext. */
  keyIn?: string;
  keyOut?: string;
}

export interface RingRun {
  ids: number[];
  /** Decode time per token (the head's generate, after the prompt). */
  msPerToken: number;
  /** Whether every device's lane ran sealed links (as it reported). */
  sealed: boolean[];
}

const linkOptions = (id: string, ringId: string, hiddenSize: number, maxBatch: number, log: (l: string) => void, key?: Uint8Array): RingLinkOptions => ({
  identity: { deviceId: id, modelFingerprint: FINGERPRINT, hiddenSize, ringId },
  maxTokensPerFrame: maxBatch,
  log,
  ...(key ? { linkKey: key } : {}),
});

// ---- a device (child process) -------------------------------------------------------------------

async function device(): Promise<void> {
  const line = await new Promise<string>((resolve) => createInterface({ input: process.stdin }).once("line", resolve));
  const s = JSON.parse(line) as DeviceSpec;
  const log = (l: string) => console.error(`[${s.id}] ${l}`);
  const model = LocalModel.open(s.model, RING_COMPUTE_OPTIONS);
  let successor: RingLink | undefined;
  let predecessor: RingLink | undefined;
  let lane: RingLane | null = null;
  const node = new RingNode({
    model, windows: [{ firstLayer: s.firstLayer, endLayer: s.endLayer, cycle: 0 }], cycles: 1, ctx: s.ctx, maxBatch: s.maxBatch,
    prefetch: true, releaseAfterUse: false, isHead: false,
    send: async (f) => {
      await successor!.send(f);
    },
    onError: (m) => log(`frame failed: ${m}`),
  });
  const keyIn = s.keyIn ? Buffer.from(s.keyIn, "hex") : undefined;
  const keyOut = s.keyOut ? Buffer.from(s.keyOut, "hex") : undefined;
  const own = (key?: Uint8Array) => linkOptions(s.id, s.ringId, model.nEmbd, s.maxBatch, log, key);
  const startLane = () => {
    if (lane || !predecessor || !successor) return;
    lane = RingLane.start({
      model: model.native, node, link: resolveLinkOptions(own(keyIn)), predecessor, successor, onError: (m) => log(`lane: ${m}`),
    });
    // The head waits for this line: a run on JS links would not measure what the product does.
    console.log(lane ? `lane ${predecessor.encrypted && successor.encrypted ? "sealed" : "plaintext"}` : "no lane");
  };
  const listener = await RingListener.listen({ ...own(keyIn), host: "127.0.0.1", port: 0, expectedPeerDeviceId: s.predecessorId, singlePeer: true });
  listener.on("link", (link) => {
    predecessor = link;
    link.on("frame", (f) => {
      if (f.type === "hello") return;
      if (lane) lane.takeFrame(f);
      else node.receive(f);
    });
    // After ws has finished with the message that brought this link (the HELLO), before it reads more.
    queueMicrotask(startLane);
  });
  console.log(`listening ${listener.port}`);
  successor = await dialSuccessor(s.successorUrl, { ...own(keyOut), expectedPeerDeviceId: s.successorId });
  startLane();
  // Ends when the head closes stdin (or kills it).
  await new Promise<void>((r) => process.stdin.once("end", () => r()).resume());
  await (lane as RingLane | null)?.close("bench over");
  await Promise.allSettled([successor.close(), predecessor?.close(), listener.close()]);
  node.close();
  model.close();
}

// ---- the head (this process) --------------------------------------------------------------------

interface Child {
  child: ChildProcess;
  lines: string[];
  err: () => string;
  waitLine: (re: RegExp) => Promise<RegExpMatchArray>;
}

function startDevice(spec: DeviceSpec): Child {
  const child = spawn(process.execPath, [new URL(import.meta.url).pathname, "device"], { stdio: ["pipe", "pipe", "pipe"] });
  const lines: string[] = [];
  let err = "";
  createInterface({ input: child.stdout! }).on("line", (l) => lines.push(l));
  child.stderr!.on("data", (d: Buffer) => (err += d.toString()));
  child.stdin!.write(`${JSON.stringify(spec)}\n`);
  const waitLine = async (re: RegExp): Promise<RegExpMatchArray> => {
    for (const t0 = Date.now(); Date.now() - t0 < 120_000; await new Promise((r) => setTimeout(r, 10))) {
      for (const l of lines) {
        const m = l.match(re);
        if (m) return m;
      }
      if (child.exitCode !== null) break;
    }
    throw new Error(`device ${spec.id}: no line matching ${re}:\n${err}`);
  };
  return { child, lines, err: () => err, waitLine };
}

/**
 * Decodes `tokens` greedily after `prompt` on a ring of the head and devices holding `windows` (layer
 * counts, the head's last, as --layer-windows), keyed or plaintext. The head's model is the caller's
 * (opened with RING_COMPUTE_OPTIONS), so runs do not pay for opening it.
 */
export async function ringRun(o: { model: LocalModel; path: string; windows: number[]; keyed: boolean; prompt: string; tokens: number; ctx: number }): Promise<RingRun> {
  const { model } = o;
  const maxBatch = 128;
  const ringId = randomUUID();
  const log = (l: string) => console.error(`[head] ${l}`);
  const ids = o.windows.slice(0, -1).map((_, i) => `dev${i + 1}`);
  const n = ids.length;
  // keys[i]: the link into device i; keys[n]: the link into the head.
  const keys = Array.from({ length: n + 1 }, () => (o.keyed ? randomBytes(32) : undefined));
  const starts = o.windows.map((_, i) => o.windows.slice(0, i).reduce((a, b) => a + b, 0));
  const headWindow: WindowSpec = { firstLayer: starts[n], endLayer: starts[n] + o.windows[n], cycle: 0 };
  let link: RingLink | undefined;
  const pipelineRef: { p?: RingPipeline } = {};
  const node = new RingNode({
    model, windows: [headWindow], cycles: 1, ctx: o.ctx, maxBatch, prefetch: true, releaseAfterUse: false, isHead: true,
    send: async (f) => {
      await link!.send(f);
    },
    deliver: (f, logits) => void pipelineRef.p?.deliver(f, logits),
    shifted: (f) => pipelineRef.p?.shifted(f),
    logitsFor: (f) => pipelineRef.p?.logitsFor(f),
    onError: (m) => log(`frame failed: ${m}`),
  });
  const pipeline = (pipelineRef.p = new RingPipeline({ model, node, nCtx: o.ctx, maxBatch, wireDtype: "f32" }));
  const own = (key?: Uint8Array) => linkOptions(HEAD_ID, ringId, model.nEmbd, maxBatch, log, key);
  const children: Child[] = [];
  let listener: RingListener | undefined;
  try {
    listener = await RingListener.listen({ ...own(keys[n]), host: "127.0.0.1", port: 0, expectedPeerDeviceId: ids[n - 1], singlePeer: true });
    listener.on("link", (l) => l.on("frame", (f) => {
      if (f.type !== "hello") node.receive(f);
    }));
    // From the last device back: each dials its successor, which already listens.
    let successorUrl = `ws://127.0.0.1:${listener.port}`;
    for (let i = n - 1; i >= 0; i--) {
      const c = startDevice({
        model: o.path, ringId, id: ids[i], predecessorId: i === 0 ? HEAD_ID : ids[i - 1], successorId: i + 1 < n ? ids[i + 1] : HEAD_ID,
        successorUrl, firstLayer: starts[i], endLayer: starts[i] + o.windows[i], ctx: o.ctx, maxBatch,
        ...(o.keyed ? { keyIn: keys[i]!.toString("hex"), keyOut: keys[i + 1]!.toString("hex") } : {}),
      });
      children.unshift(c);
      successorUrl = `ws://127.0.0.1:${(await c.waitLine(/^listening (\d+)$/))[1]}`;
    }
    link = await dialSuccessor(successorUrl, { ...own(keys[0]), expectedPeerDeviceId: ids[0] });
    const sealed = await Promise.all(children.map(async (c) => (await c.waitLine(/^(lane (sealed|plaintext)|no lane)$/))[2] === "sealed"));
    if (children.some((c) => c.lines.includes("no lane"))) throw new Error("a device's links did not go to the native lane");
    if (link.encrypted !== o.keyed || sealed.some((x) => x !== o.keyed)) throw new Error("the ring's links were not what this run asked for");
    const tok = Tokenizer.fromGguf(model.gguf);
    const res = await generate(model, pipeline, tok.encode(o.prompt, { addSpecial: true }), { maxTokens: o.tokens, sampler: new Sampler({ temperature: 0 }) });
    if (res.decodeSteps === 0) throw new Error("the ring decoded no token");
    return { ids: res.ids, msPerToken: res.decodeMs / res.decodeSteps, sealed };
  } finally {
    await link?.close("bench over").catch(() => undefined);
    for (const c of children) c.child.stdin!.end();
    await Promise.all(children.map((c) => Promise.race([
      new Promise((r) => (c.child.exitCode !== null ? r(null) : c.child.once("exit", r))),
      new Promise((r) => setTimeout(r, 5000)),
    ])));
    for (const c of children) if (c.child.exitCode === null) c.child.kill("SIGKILL");
    await listener?.close();
    node.close();
  }
}

runWhenMain(import.meta.url, async () => {
  if (process.argv[2] !== "device") throw new Error("usage: crypto-ring.js device (bench/crypto.ts starts it)");
  await device();
});

// The Vercel AI SDK and LangChain against `serve` on a generated model with a real vocabulary and a
// real chat template: Qwen3's 151,669 tokens (151,936 rows) and its template, whose tool calls are
// Hermes `<tool_call>` blocks (`<tool_call>` one token of the vocabulary), unlike the shipped model
// (512 tokens, no template: the generic format). First on the head alone, then the same server once
// two workers joined and it placed the layers on a loopback ring of three (the head samples and
// constrains; the workers run their windows). The same checks as on the shipped model
// (structured-clients.ts); one server for both, so the grammars compiled for the 151k-token vocabulary
// in the first half (about 2 s each) serve the second.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { modelShapeByName, type ModelShape } from "../../model/index.js";
import { killAll } from "../ring/cluster.js";
import { testModel } from "../profiler/models.js";
import { joinWorker, startServe, until, type Served } from "./serve-harness.js";
import { checkAiSdk, checkLangChain } from "./structured-clients.js";

afterAll(() => killAll());

/** tiny-qwen3 with Qwen3's vocabulary (and so its chat template) and a third layer, one per device. */
const SHAPE: ModelShape = { ...modelShapeByName("tiny-qwen3")!, name: "clients-qwen3", nLayers: 3, nVocab: 151936, defaultVocab: "qwen2" };

describe("structured output and tools through the clients, on a generated qwen3 with Qwen3's vocabulary and template", () => {
  let s: Served;
  let model: string;
  beforeAll(async () => {
    model = await testModel(SHAPE, "Q8_0");
    // The windows name the workers to come; alone, the head runs all three layers.
    s = await startServe(["--ctx", "1024", "--layer-windows", "w1=1,w2=1,head=1"], { model });
  }, 120_000);
  afterAll(() => s.proc.child.kill("SIGKILL"));

  describe("on the head alone", () => {
    it("its template's tool format is Hermes <tool_call> blocks", async () => {
      const props = (await (await fetch(`${s.url}/props`)).json()) as { chat_template?: string };
      expect(props.chat_template).toContain("<tool_call>");
    });
    it("the Vercel AI SDK", () => checkAiSdk(s), 120_000);
    it("LangChain", () => checkLangChain(s), 120_000);
  });

  describe("through a ring of two loopback workers and the head", () => {
    const counter = async (name: string) => Number(new RegExp(`^${name} (\\S+)$`, "m").exec(await (await fetch(`${s.url}/metrics`)).text())?.[1]);
    let replans = 0;
    beforeAll(async () => {
      joinWorker(s.clusterPort, "w1", model);
      joinWorker(s.clusterPort, "w2", model);
      await until<{ plan: { ringOrder: string[] } | null }>(`${s.url}/api/state`, (_, b) => (b.plan?.ringOrder.length ?? 0) === 3, 90_000);
      replans = await counter("prima_replans_total");
    }, 120_000);
    it("the Vercel AI SDK", () => checkAiSdk(s), 120_000);
    it("LangChain", () => checkLangChain(s), 120_000);
    it("the ring stayed in place: every request ran on three devices", async () => {
      const state = (await (await fetch(`${s.url}/api/state`)).json()) as { plan: { ringOrder: string[] } };
      expect(state.plan.ringOrder).toHaveLength(3);
      // No device lost and no placement since the ring formed.
      expect(await counter("prima_devices_lost_total")).toBe(0);
      expect(await counter("prima_replans_total")).toBe(replans);
    });
  });
});

// ClusterState fixtures: a household ring (a desktop head, a laptop streaming from disk, a phone still
// loading, a Raspberry Pi left out, a lost tablet) and the same state with hostile strings.
import type { ClusterState, DeviceState } from "../../coordinator/state.js";
import { STATE_VERSION } from "../../coordinator/state.js";

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;

function device(over: Partial<DeviceState> & Pick<DeviceState, "id" | "name">): DeviceState {
  return {
    address: "127.0.0.1:7401",
    isHead: false,
    state: "ready",
    detail: null,
    loadProgress: null,
    os: "Linux 6.1 (Debian 12)",
    cpu: "Intel Core i5-8250U",
    threads: 8,
    ramTotalBytes: 16 * GiB,
    ramAvailableBytes: 9.5 * GiB,
    anonRssBytes: 310 * MiB,
    memPressure: 0.04,
    diskReadBytesPerS: 1.8e9,
    gpu: { present: false, used: false, name: null },
    ringPosition: null,
    set: "M4",
    windows: [],
    predicted: null,
    measured: null,
    joinedUnixMs: Date.now() - 600_000,
    ...over,
  };
}

/** 22 layers, k = 2: laptop, phone, head take 5 + 2 + 4 layers in each cycle. */
export function sampleState(now = Date.now()): ClusterState {
  const L = 22;
  const plan = {
    generation: 3,
    planner: "halda exact",
    cycles: 2,
    ringOrder: ["w1", "w2", "head"],
    layersPerCycle: [5, 2, 4],
    predictedMsPerToken: 48.5,
    windows: [
      { device: "w1", firstLayer: 0, endLayer: 5, cycle: 0 },
      { device: "w2", firstLayer: 5, endLayer: 7, cycle: 0 },
      { device: "head", firstLayer: 7, endLayer: 11, cycle: 0 },
      { device: "w1", firstLayer: 11, endLayer: 16, cycle: 1 },
      { device: "w2", firstLayer: 16, endLayer: 18, cycle: 1 },
      { device: "head", firstLayer: 18, endLayer: 22, cycle: 1 },
    ],
    leftOut: [{ device: "w3", reason: "disk 35 MB/s and 1 GiB RAM: it would add 310 ms per token" }],
    notes: ["w1 streams its windows from disk; k = 2 lets it page in the next window while others compute"],
    madeUnixMs: now - 120_000,
  };
  const win = (id: string) => plan.windows.filter((w) => w.device === id);
  const history = Array.from({ length: 60 }, (_, i) => ({ unixMs: now - (59 - i) * 5000, tokensPerS: i < 20 ? 0 : 16 + 4 * Math.sin(i / 4) }));
  return {
    version: STATE_VERSION,
    cluster: "home",
    model: {
      name: "tinyllama-1.1b-chat",
      path: "/models/tinyllama-1.1b-chat.Q4_K_M.gguf",
      architecture: "llama",
      layers: L,
      sizeBytes: 638 * MiB,
      quantization: "Q4_K_M",
      fingerprint: "9f2c1e7a55b04d1e8c3a2f6b7d9e0a1b",
      contextTokens: 2048,
      // q8_0 K and V: 22 layers x 2 rows of 4 heads x 64 in blocks of 34 bytes per 32
      kvCache: { typeK: "q8_0", typeV: "q8_0", bytesPerToken: 22 * 2 * 256 * 34 / 32 },
    },
    server: { startedUnixMs: now - 3_700_000, nowUnixMs: now, ready: true, status: "serving: 1 request running", clusterPort: 7400 },
    plan,
    devices: [
      device({
        id: "head", name: "desktop", address: "192.168.1.10", isHead: true, state: "busy", cpu: "AMD Ryzen 7 5700G", threads: 16,
        ramTotalBytes: 32 * GiB, ramAvailableBytes: 21 * GiB, anonRssBytes: 420 * MiB, ringPosition: 2,
        gpu: { present: true, used: false, name: "Radeon Vega 8" },
        windows: win("head").map((w) => ({ firstLayer: w.firstLayer, endLayer: w.endLayer, cycle: w.cycle, residentBytes: 112 * MiB, totalBytes: 112 * MiB })),
        predicted: { computeMs: 11.2, memoryMs: 2.1, diskMs: 0, commMs: 0.4, totalMs: 13.7 },
        measured: { computeMs: 12.0, waitMs: 34.1, sendMs: 0.3, majorFaultsPerToken: 0, tokens: 412 },
        joinedUnixMs: now - 3_700_000,
      }),
      device({
        id: "w1", name: "laptop", address: "192.168.1.23:50812", ramTotalBytes: 8 * GiB, ramAvailableBytes: 0.6 * GiB, memPressure: 0.31,
        diskReadBytesPerS: 480e6, ringPosition: 0, set: "M3",
        windows: win("w1").map((w, i) => ({ firstLayer: w.firstLayer, endLayer: w.endLayer, cycle: w.cycle, residentBytes: i === 0 ? 96 * MiB : 41 * MiB, totalBytes: 140 * MiB })),
        predicted: { computeMs: 14.0, memoryMs: 2.5, diskMs: 9.8, commMs: 0.9, totalMs: 27.2 },
        measured: { computeMs: 15.1, waitMs: 18.0, sendMs: 0.8, descheduledMs: 0.65, majorFaultsPerToken: 212.4, tokens: 412 },
      }),
      device({
        id: "w2", name: "phone", address: "192.168.1.31:40100", state: "loading", loadProgress: 0.62, detail: "paging in window 2 of 2",
        os: "Android 14", cpu: "Snapdragon 8 Gen 2", threads: 8, ramTotalBytes: 12 * GiB, ramAvailableBytes: 4.1 * GiB, diskReadBytesPerS: 1.1e9,
        ringPosition: 1, set: "M4",
        windows: win("w2").map((w) => ({ firstLayer: w.firstLayer, endLayer: w.endLayer, cycle: w.cycle, residentBytes: null, totalBytes: 56 * MiB })),
        predicted: { computeMs: 6.3, memoryMs: 0.9, diskMs: 0, commMs: 1.2, totalMs: 8.4 },
      }),
      device({
        id: "w3", name: "raspberry-pi", address: "192.168.1.40:41002", state: "left-out", detail: null, os: "Linux 6.6 (Raspberry Pi OS)",
        cpu: "Cortex-A72", threads: 4, ramTotalBytes: 1 * GiB, ramAvailableBytes: 0.4 * GiB, diskReadBytesPerS: 35e6, set: null,
        anonRssBytes: 18 * MiB, memPressure: null,
      }),
      device({
        id: "w4", name: "tablet", address: "192.168.1.52:39001", state: "lost", detail: "no heartbeat for 2.1 s (control stream closed: ECONNRESET)",
        os: "Linux 5.15", cpu: "MediaTek Kompanio 1300T", threads: 8, set: null, anonRssBytes: null, memPressure: null,
      }),
    ],
    links: [
      { from: "w1", to: "w2", hopMs: 1.9 },
      { from: "w2", to: "head", hopMs: 2.4 },
      { from: "head", to: "w1", hopMs: null },
    ],
    requests: {
      queueLength: 2,
      active: { id: "chatcmpl-7", kind: "chat", promptTokens: 45, cachedTokens: 30, generatedTokens: 112, tokensPerS: 18.4, timeToFirstTokenMs: 420, startedUnixMs: now - 7000 },
      completed: 14,
      failed: 1,
      generatedTokens: 3810,
      history,
    },
    events: [
      { unixMs: now - 3_600_000, kind: "joined", message: "laptop (w1) joined from 192.168.1.23" },
      { unixMs: now - 3_500_000, kind: "joined", message: "phone (w2) joined from 192.168.1.31" },
      { unixMs: now - 200_000, kind: "lost", message: "tablet (w4) lost: no heartbeat for 2.1 s" },
      { unixMs: now - 120_000, kind: "replan", message: "re-planned on 3 devices: k = 2, predicted 48.5 ms/token" },
      { unixMs: now - 60_000, kind: "info", message: "raspberry-pi (w3) left out: disk too slow" },
    ],
  };
}

export const HOSTILE_HTML = `<img src=x onerror="window.__pwned=1"> "quoted" 'single' & <b>bold</b>`;
export const HOSTILE_TERM = "evil\u001b[2J\u001b[31mred\u0007\r\u009b1m";

/** The sample with device names, OS strings, reasons, events and the model name set to hostile text. */
export function hostileState(now = Date.now()): ClusterState {
  const s = sampleState(now);
  return {
    ...s,
    cluster: `${HOSTILE_HTML}`,
    model: { ...s.model, name: `<script>window.__pwned=2</script>${HOSTILE_TERM}` },
    plan: s.plan && { ...s.plan, leftOut: [{ device: "w3", reason: `<img src=x onerror="window.__pwned=3">` }], notes: [HOSTILE_HTML] },
    devices: s.devices.map((d, i) => ({
      ...d,
      name: i === 0 ? HOSTILE_HTML : i === 1 ? HOSTILE_TERM : `${d.name}<svg onload="window.__pwned=4">`,
      os: `<iframe src="javascript:window.__pwned=5"></iframe>`,
      detail: d.state === "lost" ? `<a href="javascript:window.__pwned=6">reason</a>${HOSTILE_TERM}` : d.detail,
    })),
    events: [...s.events, { unixMs: now, kind: "error", message: `${HOSTILE_HTML}${HOSTILE_TERM}` }],
  };
}

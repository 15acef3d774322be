// Measured speeds are cached per device, so a restart does not measure again. The key is what the
// speeds depend on: the hardware, the OS and its kernel build, our native build, the thread count and
// the CPU limits of the cgroup. Inside one device's entry, kernel timings are keyed by weight type and
// shape, KV-write costs by width, disk speeds by block device and read throttle, and forward passes by
// the layers' shapes, so a second model or a second disk only adds entries. Memory, GPU memory and
// links change all the time: never cached.
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, renameSync, statSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, join } from "node:path";
import { packageRoot } from "../base/index.js";
import type { StepTiming } from "./compute.js";
import type { DiskMeasurement } from "./disk.js";
import type { ForwardTiming } from "./forward.js";

export const CACHE_VERSION = 5; // 4: forward passes (profiler/forward.ts), with the disk as they reread it; 5: the disk's CPU share

export interface CachedSpeeds {
  readonly version: number;
  readonly key: string;
  /** What the key was made of, for people reading the file. */
  readonly identity: Readonly<Record<string, string | number>>;
  memReadBytesPerS?: number;
  windowCallMs?: number;
  kernels: Record<string, StepTiming>;
  /** By kvFloats. */
  kvCopyMs: Record<string, number>;
  /** By diskKey(). */
  disks: Record<string, DiskMeasurement>;
  /** By forwardKey(): the engine's pass over a stand-in of a model's first layers. */
  forward: Record<string, ForwardTiming>;
  /** By forwardKey(): the recent timings of that pass, as scales of the kernels' figures (profile.ts
   * takes their median). */
  passScales?: Record<string, PassScale[]>;
}

/** One timing of the pass in memory: ForwardCalibration.scale, and when (Unix ms). */
export interface PassScale {
  readonly scale: number;
  readonly atMs: number;
}

/** How long a pass's timing counts, and how many count: a device's figure is the median of its last
 * RECENT_PASSES timings within RECENT_PASS_MS. A timing that catches a slow second of a shared machine
 * is outvoted; a device that stays slower (a user's own program) shows at its second timing. */
export const RECENT_PASS_MS = 5 * 60_000, RECENT_PASSES = 3;

/** Of `list` (it may come from a file: only objects whose `field` is a positive finite number and whose
 * atMs is a time not after `nowMs` count), the last `count` within `withinMs` of `nowMs`, oldest first,
 * each once (a file's copy and ours hold the same ones after a save), with only those two fields. */
export function recentTimed<K extends string>(list: unknown, field: K, nowMs: number, withinMs: number, count: number): ({ readonly atMs: number } & Record<K, number>)[] {
  const unique = new Map<string, { readonly atMs: number } & Record<K, number>>();
  for (const o of Array.isArray(list) ? list : []) {
    const v = (o as Record<string, unknown> | null)?.[field], atMs = (o as { atMs?: unknown } | null)?.atMs;
    if (typeof v !== "number" || !Number.isFinite(v) || v <= 0 || typeof atMs !== "number" || atMs > nowMs || nowMs - atMs >= withinMs) continue;
    unique.set(`${atMs} ${v}`, { atMs, [field]: v } as { readonly atMs: number } & Record<K, number>);
  }
  return [...unique.values()].sort((a, b) => a.atMs - b.atMs).slice(-count);
}

/** The timings of `before` and `added` (either may come from a file: only well-formed ones) that
 * still count at `nowMs`, oldest first. */
export function recentPassScales(before: unknown, added: readonly PassScale[], nowMs: number): PassScale[] {
  return recentTimed([...(Array.isArray(before) ? before : []), ...added], "scale", nowMs, RECENT_PASS_MS, RECENT_PASSES);
}

/** $PRIMA_PROFILE_DIR, else $XDG_CACHE_HOME/prima/profiles, else ~/.cache/prima/profiles. */
export function defaultCacheDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.PRIMA_PROFILE_DIR) return env.PRIMA_PROFILE_DIR;
  return join(env.XDG_CACHE_HOME || join(homedir(), ".cache"), "prima", "profiles");
}

/** Size and time of our compiled addon: a rebuilt kernel may be faster or slower. */
export function nativeBuildId(): string {
  const addon = join(packageRoot(), "build", "Release", "prima.node");
  if (!existsSync(addon)) return "unknown";
  const s = statSync(addon);
  return `${s.size}-${Math.floor(s.mtimeMs)}`;
}

export function cacheKey(identity: Readonly<Record<string, string | number>>): string {
  return createHash("sha256").update(JSON.stringify(identity)).digest("hex").slice(0, 24);
}

/** mkdir -p, one level at a time (Node's recursive mkdir never returns under /proc). */
export function makeDirs(dir: string): void {
  const missing: string[] = [];
  for (let d = dir; !existsSync(d); d = dirname(d)) {
    missing.unshift(d);
    if (dirname(d) === d) break;
  }
  for (const d of missing) mkdirSync(d);
}

function fileOf(dir: string, key: string): string {
  return join(dir, `${key}.json`);
}

/** The cached speeds for this key, or an empty entry (an unreadable or foreign file counts as empty). */
export function loadSpeeds(dir: string, key: string, identity: Readonly<Record<string, string | number>>): CachedSpeeds {
  const empty: CachedSpeeds = { version: CACHE_VERSION, key, identity, kernels: {}, kvCopyMs: {}, disks: {}, forward: {} };
  try {
    const j = JSON.parse(readFileSync(fileOf(dir, key), "utf8")) as CachedSpeeds;
    if (j.version !== CACHE_VERSION || j.key !== key || typeof j.kernels !== "object" || typeof j.disks !== "object" || typeof j.kvCopyMs !== "object") return empty;
    return { ...empty, ...j, forward: typeof j.forward === "object" && j.forward !== null ? j.forward : {}, identity };
  } catch {
    return empty;
  }
}

/** The file's recent timings and ours, per pass; a key from the file is only ever a key (fromEntries). */
function mergedPassScales(onDisk: unknown, ours: CachedSpeeds["passScales"]): Record<string, PassScale[]> {
  const now = Date.now(), disk = new Map(Object.entries(typeof onDisk === "object" && onDisk !== null ? onDisk : {}));
  const keys = new Set([...disk.keys(), ...Object.keys(ours ?? {})]);
  return Object.fromEntries([...keys].map((k) => [k, recentPassScales(disk.get(k), ours?.[k] ?? [], now)] as const).filter(([, kept]) => kept.length > 0));
}

/** Merges into what is on disk (another process may have added entries) and writes atomically. */
export function saveSpeeds(dir: string, s: CachedSpeeds): string {
  makeDirs(dir);
  const onDisk = loadSpeeds(dir, s.key, s.identity);
  const merged: CachedSpeeds = {
    ...s,
    memReadBytesPerS: s.memReadBytesPerS ?? onDisk.memReadBytesPerS,
    windowCallMs: s.windowCallMs ?? onDisk.windowCallMs,
    kernels: { ...onDisk.kernels, ...s.kernels },
    kvCopyMs: { ...onDisk.kvCopyMs, ...s.kvCopyMs },
    disks: { ...onDisk.disks, ...s.disks },
    forward: { ...onDisk.forward, ...s.forward },
    passScales: mergedPassScales(onDisk.passScales, s.passScales),
  };
  const file = fileOf(dir, s.key);
  writeJsonAtomically(file, merged);
  return file;
}

/** Writes `value` as JSON to `file` through a temporary file and a rename: a reader (another process)
 * sees the old file or the new one, never half of one. */
export function writeJsonAtomically(file: string, value: unknown): void {
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, JSON.stringify(value, null, 1));
  renameSync(tmp, file);
}

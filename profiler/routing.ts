// A mixture of experts' routing skew, measured on this device: a short fixed text through every layer
// in one pass, then each layer's per-expert hit counts (window.info().expertHits) as the model
// profile's routing share (model/ routingShareFromHits). Halda prices an overloaded device's rereads
// with it (docs/HALDA.md "Mixture of experts"). One prefill of a few dozen tokens: every weight is read
// once, no decode loop, so it costs about one prompt.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { LocalModel } from "../engine/index.js";
import { Tokenizer, withMeasuredRouting, type ModelProfile } from "../model/index.js";
import { cacheKey, defaultCacheDir, makeDirs, writeJsonAtomically } from "./cache.js";

/** Varied prose, code and numbers, so the router sees more than one kind of token. */
export const ROUTING_TEXT =
  "The river rose three feet overnight, and by morning the ferry had stopped running. " +
  "function add(a, b) { return a + b; } // 42 + 17 = 59. " +
  "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen. " +
  "Je pense, donc je suis. The quick brown fox jumps over the lazy dog.";

export interface RoutingOptions {
  /** Token ids to run instead of ROUTING_TEXT (e.g. the user's prompt). */
  readonly tokens?: Int32Array;
  /** At most this many tokens (default 64): enough for the shape of the skew, cheap to run. */
  readonly maxTokens?: number;
}

/** The profile with its routing share measured on `model` (the same file); a dense model's comes back as is. */
export async function measureExpertRouting(model: LocalModel, profile: ModelProfile, options: RoutingOptions = {}): Promise<ModelProfile> {
  if (!profile.moe) return profile;
  const { hits, tokens } = await expertHits(model, profile, options);
  return withMeasuredRouting(profile, hits, tokens);
}

async function expertHits(model: LocalModel, profile: ModelProfile, options: RoutingOptions): Promise<{ hits: number[][]; tokens: number }> {
  const max = options.maxTokens ?? 64;
  const all = options.tokens ?? Tokenizer.fromGguf(model.gguf).encode(ROUTING_TEXT);
  const tokens = all.subarray(0, Math.min(all.length, max));
  if (tokens.length === 0) throw new Error("measureExpertRouting: no tokens to run");
  const w = model.window(0, model.nLayers, { ctx: tokens.length });
  try {
    await w.forward(model.embed(tokens), 0, tokens.length);
    const hits = w.info().expertHits;
    if (!hits) throw new Error(`${model.path}: the engine reported no expert hits for a model with ${profile.moe!.nExpert} experts`);
    return { hits: hits.map((l) => [...l]), tokens: tokens.length };
  } finally {
    w.close();
  }
}

const ROUTING_CACHE_VERSION = 1;

/** Each layer's hits as a file held: nLayers lists of nExpert counts (finite, >= 0), or null. */
function cachedHits(file: string, fingerprint: string, profile: ModelProfile): { hits: number[][]; tokens: number } | null {
  try {
    const j = JSON.parse(readFileSync(file, "utf8")) as { version?: unknown; fingerprint?: unknown; tokens?: unknown; hits?: unknown };
    const n = profile.moe!.nExpert;
    const ok = j.version === ROUTING_CACHE_VERSION && j.fingerprint === fingerprint && Number.isInteger(j.tokens) && (j.tokens as number) > 0 &&
      Array.isArray(j.hits) && j.hits.length === profile.nLayers &&
      j.hits.every((l: unknown) => Array.isArray(l) && l.length === n && l.every((h: unknown) => typeof h === "number" && Number.isFinite(h) && h >= 0));
    return ok ? { hits: j.hits as number[][], tokens: j.tokens as number } : null;
  } catch {
    return null;
  }
}

/**
 * The routing measured once per model (by its fingerprint) and kept in the profile cache beside the
 * device's speeds: a ring's plan prices each window by its layers' routing (docs/HALDA.md MoE-3). A file
 * that is not this model's hits counts as none and is measured again. A dense model comes back as is.
 */
export async function cachedExpertRouting(model: LocalModel, profile: ModelProfile, fingerprint: string, log: (line: string) => void, dir = defaultCacheDir()): Promise<ModelProfile> {
  if (!profile.moe) return profile;
  const file = join(dir, `routing-${cacheKey({ fingerprint })}.json`);
  const cached = cachedHits(file, fingerprint, profile);
  if (cached) {
    log(`routing: each layer's expert hits as measured before over ${cached.tokens} tokens (kept for this model)`);
    return withMeasuredRouting(profile, cached.hits, cached.tokens);
  }
  const t0 = performance.now();
  const measured = await expertHits(model, profile, {});
  log(`routing: each layer's expert hits measured over ${measured.tokens} tokens in ${((performance.now() - t0) / 1000).toFixed(1)} s (kept for this model)`);
  try {
    makeDirs(dir);
    writeJsonAtomically(file, { version: ROUTING_CACHE_VERSION, fingerprint, ...measured });
  } catch (e) {
    log(`routing: could not keep the measurement (${(e as Error).message}); it is measured again next time`);
  }
  return withMeasuredRouting(profile, measured.hits, measured.tokens);
}

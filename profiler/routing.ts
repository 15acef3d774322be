// A mixture of experts' routing skew, measured on this device: a short fixed text through every layer
// in one pass, then each layer's per-expert hit counts (window.info().expertHits) as the model
// profile's routing share (model/ routingShareFromHits). Halda prices an overloaded device's rereads
// with it (docs/HALDA.md "Mixture of experts"). One prefill of a few dozen tokens: every weight is read
// once, no decode loop, so it costs about one prompt.
import type { LocalModel } from "../engine/index.js";
import { Tokenizer, withMeasuredRouting, type ModelProfile } from "../model/index.js";

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
  const max = options.maxTokens ?? 64;
  const all = options.tokens ?? Tokenizer.fromGguf(model.gguf).encode(ROUTING_TEXT);
  const tokens = all.subarray(0, Math.min(all.length, max));
  if (tokens.length === 0) throw new Error("measureExpertRouting: no tokens to run");
  const w = model.window(0, model.nLayers, { ctx: tokens.length });
  try {
    await w.forward(model.embed(tokens), 0, tokens.length);
    const hits = w.info().expertHits;
    if (!hits) throw new Error(`${model.path}: the engine reported no expert hits for a model with ${profile.moe.nExpert} experts`);
    return withMeasuredRouting(profile, hits, tokens.length);
  } finally {
    w.close();
  }
}

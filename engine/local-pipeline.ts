// One device, every layer: a single window over the whole model, logits from the same native call.
import type { KvCacheTypes } from "../model/index.js";
import type { NativeWindow } from "../native/index.js";
import type { Pipeline } from "./generate.js";
import type { LocalModel } from "./local-model.js";
import { QuickForward } from "./quick-forward.js";

export class LocalPipeline implements Pipeline {
  readonly window: NativeWindow;
  private readonly logits: Float32Array;
  private readonly runner: QuickForward;

  constructor(model: LocalModel, readonly nCtx: number, maxBatch = 128, kvCacheTypes?: KvCacheTypes) {
    this.window = model.window(0, model.nLayers, { ctx: nCtx, maxBatch, kvCacheTypes });
    this.logits = new Float32Array(model.nVocab);
    this.runner = new QuickForward(this.window);
  }

  async forward(acts: Float32Array, pos: number, nTokens: number): Promise<Float32Array> {
    await this.runner.forward(acts, pos, nTokens, this.logits);
    return this.logits;
  }

  truncate(pos: number): void {
    this.window.kvTruncate(Math.min(pos, this.window.info().filled));
  }

  resumable(pos: number): number {
    return this.window.kvResumable(pos);
  }

  async shift(p0: number, nDiscard: number, nPast: number): Promise<void> {
    this.window.kvShift(p0, nDiscard, nPast);
  }

  h2oScores(): Float32Array | null {
    return this.window.h2oScores();
  }

  close(): void {
    this.window.close();
  }
}

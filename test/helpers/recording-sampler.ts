// A greedy sampler that keeps each step's logits: the context-shift tests compare them with llama.cpp's.
import { Sampler } from "../../engine/index.js";

export class RecordingSampler extends Sampler {
  readonly rows: Float32Array[] = [];
  constructor() {
    super({ temperature: 0 });
  }
  override sample(logits: Float32Array, history: readonly number[]): number {
    this.rows.push(logits.slice());
    return super.sample(logits, history);
  }
}

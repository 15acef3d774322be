// The list of models a model cache wrote, kept in the cache folder: the cache evicts only what is on
// it, so a file it did not make (a model of the user's in the same folder, a file planted under a
// fingerprint's name) is never deleted or written. A missing list owns nothing; so does one that
// cannot be read or parsed (nothing is evicted rather than a guess).
import { join } from "node:path";
import { readFileNoFollow, writeFileAtomic } from "./persist.js";

export const MANIFEST_NAME = "prima-cache-manifest.json";
const FINGERPRINT = /^[0-9a-f]{16,128}$/;
/** Far more than any cache's list: a larger file is not one this cache wrote. */
const MAX_MANIFEST_BYTES = 1 << 20;

export class CacheManifest {
  readonly path: string;

  constructor(dir: string) {
    this.path = join(dir, MANIFEST_NAME);
  }

  /** The fingerprints of the models this cache wrote. */
  read(): Set<string> {
    try {
      const m = JSON.parse(readFileNoFollow(this.path, MAX_MANIFEST_BYTES) ?? "{}") as { models?: unknown };
      return new Set(Array.isArray(m?.models) ? m.models.filter((f): f is string => typeof f === "string" && FINGERPRINT.test(f)) : []);
    } catch {
      return new Set();
    }
  }

  has(fingerprint: string): boolean {
    return this.read().has(fingerprint);
  }

  /** Recorded before the model's file is made: a crash between the two leaves a name with no file
   * (harmless), never a file of the cache's that it does not know. */
  add(fingerprint: string): void {
    const models = this.read();
    if (models.has(fingerprint)) return;
    models.add(fingerprint);
    this.write(models);
  }

  /** Dropped after the model's files are gone. */
  remove(fingerprints: Iterable<string>): void {
    const models = this.read();
    for (const f of fingerprints) models.delete(f);
    this.write(models);
  }

  private write(models: Set<string>): void {
    writeFileAtomic(this.path, `${JSON.stringify({ version: 1, models: [...models].sort() })}\n`);
  }
}

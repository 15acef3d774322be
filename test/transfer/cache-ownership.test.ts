// The model cache owns only what it wrote (issue #36, finding 1): it never writes through a symbolic
// link planted under a model's name, refuses a cache folder that is a link unless allowed, evicts
// only the models its manifest lists, and evicts nothing when evicting cannot make enough room.
import { existsSync, linkSync, lstatSync, mkdirSync, readFileSync, renameSync, statSync, symlinkSync, unlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { CacheError, MANIFEST_NAME, ModelCache, NoRoomError, chunkDigest, type ModelInfo } from "../../transfer/index.js";
import { tempDir } from "../helpers/temp.js";

const CHUNK = 64 << 10;
const MiB = 1 << 20;
const info = (fp: string, fileBytes = MiB): ModelInfo => ({ fingerprint: fp, fileBytes, dataOffset: 4096, chunkBytes: CHUNK, name: fp });
const fp = (c: string) => c.repeat(64);

/** A model of the cache's own with `chunks` chunks written (so it occupies their blocks). */
async function ownModel(cache: ModelCache, fingerprint: string, chunks: number): Promise<string> {
  const m = cache.open(info(fingerprint));
  const data = Buffer.alloc(CHUNK, 7);
  for (let i = 0; i < chunks; i++) expect(await m.writeVerified(i, data, chunkDigest(data))).toBe(true);
  m.close();
  return m.path;
}

/** A file of the user's: its bytes, to compare after. */
function userFile(path: string, bytes: number): Buffer {
  const data = Buffer.alloc(bytes, 0x5a);
  writeFileSync(path, data);
  return data;
}

describe("the model cache never follows a symbolic link", () => {
  it("refuses a link planted at <cache>/<fingerprint>.gguf and leaves its target as it was", () => {
    const root = tempDir("prima-cache-link-");
    const cacheDir = join(root, "cache");
    mkdirSync(cacheDir);
    const victim = join(root, "precious.txt");
    const before = userFile(victim, 1000);
    const planted = join(cacheDir, `${fp("a")}.gguf`);
    symlinkSync(victim, planted);
    const cache = new ModelCache(cacheDir);
    expect(() => cache.open(info(fp("a")))).toThrow(CacheError);
    expect(() => cache.open(info(fp("a")))).toThrow(/is a symbolic link, not a model this cache wrote: refused \(never written through\)/);
    expect(readFileSync(victim)).toEqual(before);
    expect(statSync(victim).size).toBe(1000);
    expect(lstatSync(planted).isSymbolicLink()).toBe(true);
  });

  it("refuses a link even where the manifest lists the model (the link came after the cache wrote it)", async () => {
    const root = tempDir("prima-cache-relink-");
    const cacheDir = join(root, "cache");
    const cache = new ModelCache(cacheDir);
    const path = await ownModel(cache, fp("b"), 1);
    const victim = join(root, "precious.txt");
    const before = userFile(victim, 2000);
    // The cache's file replaced by a link (rename over it, as an attacker would).
    symlinkSync(victim, `${path}.link`);
    renameSync(`${path}.link`, path);
    expect(() => cache.open(info(fp("b")))).toThrow(/symbolic link/);
    expect(readFileSync(victim)).toEqual(before);
  });

  it("refuses its own model's name when it is a hard link to a file elsewhere", async () => {
    const root = tempDir("prima-cache-hardlink-");
    const cache = new ModelCache(join(root, "cache"));
    const path = await ownModel(cache, fp("9"), 0);
    const victim = join(root, "precious.bin");
    const before = userFile(victim, MiB);
    unlinkSync(path);
    linkSync(victim, path);
    expect(() => cache.open(info(fp("9")))).toThrow(/has other names \(hard links\): refused/);
    expect(readFileSync(victim)).toEqual(before);
  });

  it("refuses a file under a model's name that it did not write, and leaves it", () => {
    const cacheDir = tempDir("prima-cache-foreign-");
    const path = join(cacheDir, `${fp("c")}.gguf`);
    const before = userFile(path, 3000);
    expect(() => new ModelCache(cacheDir).open(info(fp("c")))).toThrow(/was not written by this model cache \(it is not in its manifest\)/);
    expect(readFileSync(path)).toEqual(before);
  });

  it("refuses a cache folder that is a symbolic link unless allowed", () => {
    const root = tempDir("prima-cache-dirlink-");
    const real = join(root, "models-of-mine");
    mkdirSync(real);
    const link = join(root, "cache");
    symlinkSync(real, link);
    expect(() => new ModelCache(link).checkFolder()).toThrow(CacheError);
    expect(() => new ModelCache(link).open(info(fp("d")))).toThrow(/is a symbolic link \(to .*models-of-mine\): refused.*--allow-cache-link/);
    expect(existsSync(join(real, `${fp("d")}.gguf`))).toBe(false);
    // Asked for, it is used.
    const m = new ModelCache(link, { allowLink: true }).open(info(fp("d")));
    m.close();
    expect(statSync(join(real, `${fp("d")}.gguf`)).size).toBe(MiB);
  });
});

describe("eviction touches only the cache's own models, and only when that makes room", () => {
  it("never deletes a user's model in the cache folder, even under its limit's pressure; refuses naming the bytes", async () => {
    const root = tempDir("prima-cache-user-");
    const mine = join(root, "my-models");
    mkdirSync(mine);
    // The user's models, one even named like a fingerprint, and a cache pointed at their folder.
    const users = [join(mine, "llama.gguf"), join(mine, `${fp("e")}.gguf`)];
    const before = users.map((p) => userFile(p, 512 << 10));
    const link = join(root, "cache");
    symlinkSync(mine, link);
    const cache = new ModelCache(link, { limitBytes: MiB / 2, allowLink: true });
    const m = cache.open(info(fp("f")));
    let thrown: unknown;
    try {
      m.checkRoom([...Array(16).keys()]);
    } catch (e) {
      thrown = e;
    }
    m.close();
    expect(thrown).toBeInstanceOf(NoRoomError);
    expect((thrown as NoRoomError).neededBytes).toBe(MiB);
    expect((thrown as Error).message).toMatch(/1048576 bytes \(1\.0 MiB\) needed, \d+ bytes \([\d.]+ MiB\) free under the model cache limit/);
    users.forEach((p, i) => expect(readFileSync(p)).toEqual(before[i]));
  });

  it("evicts nothing when evicting every other model it wrote cannot make enough room", async () => {
    const cacheDir = tempDir("prima-cache-nothing-");
    // Two models of 8 chunks (512 KiB) each under a 1.25 MiB limit.
    const cache = new ModelCache(cacheDir, { limitBytes: 1.25 * MiB });
    const older = await ownModel(cache, fp("1"), 8);
    const newer = await ownModel(cache, fp("2"), 8);
    // A third that needs 1.5 MiB on its own: over the limit whatever goes.
    const big = cache.open(info(fp("3"), 1.5 * MiB));
    expect(() => big.checkRoom([...Array(24).keys()])).toThrow(/none was evicted/);
    big.close();
    expect(existsSync(older)).toBe(true);
    expect(existsSync(newer)).toBe(true);
    expect(existsSync(`${older}.chunks`)).toBe(true);
    // One that fits once the older goes: only the older goes.
    const next = cache.open(info(fp("4")));
    next.checkRoom([...Array(10).keys()]); // 640 KiB
    next.close();
    expect(existsSync(older)).toBe(false);
    expect(existsSync(newer)).toBe(true);
    expect(JSON.parse(readFileSync(join(cacheDir, MANIFEST_NAME), "utf8")).models).not.toContain(fp("1"));
  });

  it("a manifest that cannot be read owns nothing: nothing is evicted", async () => {
    const cacheDir = tempDir("prima-cache-badmanifest-");
    const cache = new ModelCache(cacheDir, { limitBytes: 0.75 * MiB });
    const own = await ownModel(cache, fp("5"), 8);
    writeFileSync(join(cacheDir, MANIFEST_NAME), "{ not json");
    const next = new ModelCache(cacheDir, { limitBytes: 0.75 * MiB }).open(info(fp("6")));
    expect(() => next.checkRoom([...Array(16).keys()])).toThrow(NoRoomError);
    next.close();
    expect(existsSync(own)).toBe(true);
  });

  it("does not follow a link planted at the manifest's temporary name", async () => {
    const root = tempDir("prima-cache-tmplink-");
    const cacheDir = join(root, "cache");
    mkdirSync(cacheDir);
    const victim = join(root, "precious.txt");
    const before = userFile(victim, 100);
    symlinkSync(victim, join(cacheDir, `${MANIFEST_NAME}.${process.pid}.tmp`));
    new ModelCache(cacheDir).open(info(fp("7"))).close();
    expect(readFileSync(victim)).toEqual(before);
    expect(JSON.parse(readFileSync(join(cacheDir, MANIFEST_NAME), "utf8")).models).toEqual([fp("7")]);
  });
});

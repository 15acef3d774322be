// A device short of disk (issue #36, finding 5): the profile's disk probe takes a smaller scratch file
// where the disk has little room, and where not even the smallest fits it says so by the bytes needed
// and free (the coordinator's refusal carries that message). Small disks are tmpfs mounts (root only).
import { readdirSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { describeModel, readGguf } from "../../model/index.js";
import { MIN_PROBE_BYTES, modelWorkload, profileDevice } from "../../profiler/index.js";
import { root } from "../helpers/process.js";
import { canMount, tempDir, tmpfsDir } from "../helpers/temp.js";

const workload = modelWorkload(describeModel(readGguf(`${root}models/stories260K.gguf`)));

describe.runIf(canMount)("the profile on a disk with little room", () => {
  it("probes with a smaller scratch file, under half of what is free, and leaves nothing behind", async () => {
    const disk = tmpfsDir("prima-low-disk-", "8m");
    const lines: string[] = [];
    const r = await profileDevice({ name: "low", workload, threads: 1, diskDirs: [disk], cacheDir: tempDir("prima-low-disk-profile-"), quick: true, progress: (l) => lines.push(l) });
    expect(r.details.disk.dir).toBe(disk);
    expect(r.details.disk.fileBytes).toBeGreaterThanOrEqual(MIN_PROBE_BYTES);
    expect(r.details.disk.fileBytes).toBeLessThanOrEqual(4 << 20);
    expect(r.details.disk.seqReadBytesPerS).toBeGreaterThan(0);
    expect(r.details.disk.randReadBytesPerS).toBeGreaterThan(0);
    expect(lines.join("\n")).toMatch(/disk: reading a [\d.]+ MiB scratch file \(the disk is short of room\)/);
    expect(readdirSync(disk)).toEqual([]);
  });

  it("refuses with the bytes needed and free where not even the smallest probe fits", async () => {
    const disk = tmpfsDir("prima-low-disk-", "1m");
    const profile = profileDevice({ name: "low", workload, threads: 1, diskDirs: [disk], cacheDir: tempDir("prima-low-disk-profile-"), quick: true });
    await expect(profile).rejects.toThrow(new RegExp(`too little disk under ${disk} for the disk probe: ${2 * MIN_PROBE_BYTES} bytes needed free .*, \\d+ bytes free`));
    expect(readdirSync(disk)).toEqual([]);
  });
});

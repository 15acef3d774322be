// A cluster identity for tests that start a WorkerRegistry in their own process: made once per test
// process (a key pair and certificate take a few ms), never written to disk.
import { createIdentity, type ClusterIdentity } from "../../trust/index.js";

let made: Promise<ClusterIdentity> | undefined;

export function testIdentity(): Promise<ClusterIdentity> {
  made ??= createIdentity();
  return made;
}

/** RegistryOptions.trust for a test registry. */
export async function testTrust(): Promise<{ identity: ClusterIdentity }> {
  return { identity: await testIdentity() };
}

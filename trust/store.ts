// The coordinator's side of the cluster secret: a key pair, its self-signed certificate and the join
// token, created on first start and kept per cluster name in the user's config directory (0600 files
// in a 0700 folder). `<name>.key` holds everything (the coordinator's); `<name>.token` holds the token
// alone, to copy to workers (--token-file). A rotation replaces both key and secret: workers that
// joined before must get the new token, and the running coordinator picks it up (refresh()).
import { execFile } from "node:child_process";
import { webcrypto, createPrivateKey, randomBytes, X509Certificate } from "node:crypto";
import { chmodSync, linkSync, mkdirSync, readFileSync, renameSync, statSync, unlinkSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { packageRoot } from "../base/index.js";
import { TrustError, formatToken, parseToken, sha256, type JoinToken } from "./token.js";

/** $XDG_CONFIG_HOME/prima, else ~/.config/prima. */
export function configDir(): string {
  const base = process.env.XDG_CONFIG_HOME || join(homedir(), ".config");
  return join(base, "prima");
}

/** A cluster name as a file name: itself when plainly safe, else a hash of it. */
function fileName(cluster: string): string {
  return /^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$/.test(cluster) ? cluster : `cluster-${sha256(Buffer.from(cluster)).toString("hex").slice(0, 16)}`;
}

export interface ClusterIdentity {
  readonly token: JoinToken;
  /** The token as workers are given it. */
  readonly tokenText: string;
  readonly keyPem: string;
  readonly certPem: string;
}

interface Saved {
  version: 1;
  token: string;
  key: string;
  cert: string;
}

/** A fresh key pair (ECDSA P-256: small, fast to make, every TLS stack speaks it), its self-signed
 * certificate, and a new secret. The certificate names nothing about the cluster or the machine:
 * anyone may see it in a TLS handshake. */
export async function createIdentity(): Promise<ClusterIdentity> {
  // @peculiar/x509 writes the certificate (no hand-made ASN.1); it needs a Reflect polyfill, and only
  // the coordinator, only when it makes a certificate, loads either.
  await import("reflect-metadata");
  const x509 = await import("@peculiar/x509");
  x509.cryptoProvider.set(webcrypto as unknown as Crypto);
  const alg = { name: "ECDSA", namedCurve: "P-256", hash: "SHA-256" };
  const keys = await webcrypto.subtle.generateKey(alg, true, ["sign", "verify"]);
  const now = Date.now();
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: randomBytes(8).toString("hex").replace(/^[89a-f]/, "1"),
    name: "CN=prima cluster",
    notBefore: new Date(now - 24 * 3600_000),
    notAfter: new Date(now + 100 * 365 * 24 * 3600_000), // pinned by hash: expiry would only strand workers
    keys: keys as CryptoKeyPair,
    signingAlgorithm: alg,
    // Its own trust anchor: the worker's gRPC client verifies the chain against this very certificate.
    extensions: [new x509.BasicConstraintsExtension(true, undefined, true)],
  });
  const certPem = cert.toString("pem");
  const pkcs8 = Buffer.from(await webcrypto.subtle.exportKey("pkcs8", (keys as CryptoKeyPair).privateKey));
  const keyPem = createPrivateKey({ key: pkcs8, format: "der", type: "pkcs8" }).export({ format: "pem", type: "pkcs8" }) as string;
  const token = { pin: sha256(new X509Certificate(certPem).raw), secret: randomBytes(32) };
  return { token, tokenText: formatToken(token), keyPem, certPem };
}

/** Making an identity takes a fraction of a second; a loaded machine gets this long. */
const MAKE_IDENTITY_TIMEOUT_MS = 60_000;

/** createIdentity in a child process (make-identity.ts, run from dist/: the suite runs after tsc), as
 * the key file holds it, checked. */
function createIdentityApart(keyFile: string): Promise<string> {
  const script = join(packageRoot(), "dist", "trust", "make-identity.js");
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [script], { timeout: MAKE_IDENTITY_TIMEOUT_MS, maxBuffer: 1 << 20 }, (err, stdout, stderr) => {
      if (err) {
        const why = err.killed ? `it took more than ${MAKE_IDENTITY_TIMEOUT_MS / 1000} s` : (stderr.trim().split("\n").pop() || err.message);
        reject(new TrustError(`cannot make the cluster's key and certificate for ${keyFile}: ${why}`));
        return;
      }
      try {
        parseSaved(stdout, "the identity just made");
        resolve(stdout);
      } catch (e) {
        reject(e);
      }
    });
  });
}

function parseSaved(text: string, file: string): ClusterIdentity {
  let s: Saved;
  try {
    s = JSON.parse(text) as Saved;
  } catch {
    throw new TrustError(`${file} is not a prima cluster identity (not JSON); move it away to make a new one`);
  }
  if (s?.version !== 1 || typeof s.key !== "string" || typeof s.cert !== "string" || typeof s.token !== "string") {
    throw new TrustError(`${file} is not a prima cluster identity; move it away to make a new one`);
  }
  const token = parseToken(s.token);
  if (!sha256(new X509Certificate(s.cert).raw).equals(token.pin)) throw new TrustError(`${file}: its token does not pin its certificate`);
  return { token, tokenText: s.token, keyPem: s.key, certPem: s.cert };
}

/** Writes text to path with mode 0600 through a temporary file: renamed over it (replace), or
 * linked to it (create: fails with EEXIST when another process got there first). */
function writePrivate(path: string, text: string, how: "replace" | "create"): void {
  const tmp = `${path}.${process.pid}.${randomBytes(4).toString("hex")}.tmp`;
  writeFileSync(tmp, text, { mode: 0o600 });
  try {
    if (how === "replace") renameSync(tmp, path);
    else linkSync(tmp, path);
  } finally {
    if (how === "create") unlinkSync(tmp);
  }
}

export class TrustStore {
  private current: ClusterIdentity;
  private stamp: string;
  /** Counts rotations seen by this process (0: the identity it started with). */
  generation = 0;

  private constructor(readonly cluster: string, readonly keyFile: string, readonly tokenFile: string, id: ClusterIdentity, readonly created: boolean) {
    this.current = id;
    this.stamp = stampOf(keyFile);
    this.syncTokenFile();
  }

  /** The cluster's identity from the config directory, created when missing (or replaced, with
   * rotate). Safe against several processes creating the same cluster's at once. */
  static async open(cluster: string, o: { rotate?: boolean; dir?: string } = {}): Promise<TrustStore> {
    const dir = o.dir ?? configDir();
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const base = join(dir, fileName(cluster));
    const keyFile = `${base}.key`, tokenFile = `${base}.token`;
    let created = false;
    if (o.rotate) {
      writePrivate(keyFile, await createIdentityApart(keyFile), "replace");
      created = true;
    } else {
      let text: string | undefined;
      try {
        text = readFileSync(keyFile, "utf8");
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw new TrustError(`cannot read ${keyFile}: ${(e as Error).message}`);
      }
      if (text === undefined) {
        const made = await createIdentityApart(keyFile);
        try {
          writePrivate(keyFile, made, "create");
          created = true;
        } catch (e) {
          if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw new TrustError(`cannot write ${keyFile}: ${(e as Error).message}`);
        }
      }
    }
    checkPrivate(keyFile);
    return new TrustStore(cluster, keyFile, tokenFile, parseSaved(readFileSync(keyFile, "utf8"), keyFile), created);
  }

  get identity(): ClusterIdentity {
    return this.current;
  }

  /** Reads the identity again if its file changed (a `prima-coord token --rotate` meanwhile); true
   * when it did. A file made unreadable keeps the identity in use. */
  refresh(): boolean {
    const stamp = stampOf(this.keyFile);
    if (stamp === this.stamp) return false;
    this.stamp = stamp;
    try {
      const next = parseSaved(readFileSync(this.keyFile, "utf8"), this.keyFile);
      if (next.tokenText === this.current.tokenText) return false;
      this.current = next;
      this.generation++;
      this.syncTokenFile();
      return true;
    } catch {
      return false;
    }
  }

  private syncTokenFile(): void {
    let old = "";
    try {
      old = readFileSync(this.tokenFile, "utf8");
    } catch {
      // not written yet
    }
    if (old.trim() !== this.current.tokenText) writePrivate(this.tokenFile, `${this.current.tokenText}\n`, "replace");
  }
}

/** The identity as its key file holds it. */
export function savedIdentity(id: ClusterIdentity): string {
  const s: Saved = { version: 1, token: id.tokenText, key: id.keyPem, cert: id.certPem };
  return `${JSON.stringify(s)}\n`;
}

function stampOf(file: string): string {
  try {
    const s = statSync(file);
    return `${s.ino}:${s.mtimeMs}:${s.size}`;
  } catch {
    return "";
  }
}

/** The key file must be the owner's alone: tightened when it is not (an old umask, a copy). */
function checkPrivate(file: string): void {
  if ((statSync(file).mode & 0o077) !== 0) chmodSync(file, 0o600);
}

/** The token a worker was given: --token, else --token-file, else $PRIMA_TOKEN. */
export function workerToken(o: { token?: string; tokenFile?: string }): JoinToken | undefined {
  if (o.token !== undefined) return parseToken(o.token);
  if (o.tokenFile !== undefined) {
    let text: string;
    try {
      text = readFileSync(o.tokenFile, "utf8");
    } catch (e) {
      throw new TrustError(`cannot read the token file ${o.tokenFile}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
    }
    return parseToken(text);
  }
  const env = process.env.PRIMA_TOKEN;
  return env ? parseToken(env) : undefined;
}

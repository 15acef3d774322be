// BLAKE3 for chunk digests, in CommonJS so that both the main thread (transfer/chunks.ts) and the
// sink's worker thread (transfer/cache.ts, eval'd CommonJS) load this one file. The BLAKE3 team's
// Rust code through @napi-rs/blake-hash where a binary ships for this platform (0.1 s per GB on one
// AVX-512 core), else hash-wasm's WebAssembly build (about a tenth of the speed, the same digests):
// prebuilt binaries exist for x64 and arm64 Linux, macOS, Windows, FreeBSD and Android, not for
// 32-bit ARM. PRIMA_BLAKE3=wasm takes the WebAssembly build (tests).
"use strict";

function nativeBlake3() {
  if (process.env.PRIMA_BLAKE3 === "wasm") return undefined;
  try {
    const { blake3 } = require("@napi-rs/blake-hash");
    return (data) => blake3(Buffer.from(data.buffer, data.byteOffset, data.byteLength)).toString("hex");
  } catch {
    return undefined;
  }
}

let digest = nativeBlake3();

/** Resolves once a BLAKE3 is ready (at once with the native one). */
const ready = digest
  ? Promise.resolve()
  : require("hash-wasm").createBLAKE3().then((h) => {
    digest = (data) => {
      h.init();
      h.update(data);
      return h.digest("hex");
    };
  });

/** The BLAKE3-256 digest of data as hex; only after `ready`. */
function blake3Hex(data) {
  if (!digest) throw new Error("BLAKE3 is not ready yet (await ready first)");
  return digest(data);
}

module.exports = { ready, blake3Hex, native: digest !== undefined };

// XGrammar's WebAssembly build (@mlc-ai/web-xgrammar), loaded once. Its package says "type": "module"
// but its bundle is UMD, so Node's import sees no exports: it is compiled here as the CommonJS it is.
// Its C++ errors abort the call (the module stays usable) after printing "[FATAL] file.cc:N: why" on
// console.error, which the module binds once when it starts: that first start happens here with
// console.error and console.log routed through a sink, so a failed call can say why in its error.
import { readFileSync } from "node:fs";
import Module, { createRequire } from "node:module";
import { dirname } from "node:path";
import type * as XG from "@mlc-ai/web-xgrammar";

export type XGrammar = typeof XG;

let loaded: Promise<XGrammar> | undefined;
/** The engine's latest message lines (errors and warnings), for the call that caused them. */
const messages: string[] = [];

function isEngineLine(line: string): boolean {
  return /^\[(FATAL|WARNING|INFO)\]|^Aborted\(/.test(line);
}

function routed(orig: (...a: unknown[]) => void): (...a: unknown[]) => void {
  return (...a: unknown[]) => {
    const line = a.map(String).join(" ");
    if (!isEngineLine(line)) return orig(...a);
    messages.push(line);
    if (messages.length > 8) messages.shift();
  };
}

/** The engine, started on first use. */
export function xgrammar(): Promise<XGrammar> {
  loaded ??= (async () => {
    const require = createRequire(import.meta.url);
    const file = require.resolve("@mlc-ai/web-xgrammar");
    const m = new Module(file) as Module & { _compile(src: string, file: string): void; paths: string[] };
    m.filename = file;
    m.paths = (Module as unknown as { _nodeModulePaths(dir: string): string[] })._nodeModulePaths(dirname(file));
    m._compile(readFileSync(file, "utf8"), file);
    const xg = m.exports as XGrammar;
    const log = console.log, error = console.error;
    console.log = routed(log);
    console.error = routed(error);
    try {
      (await xg.Grammar.builtinJSONGrammar()).dispose(); // starts the module, which binds the sink
    } finally {
      console.log = log;
      console.error = error;
    }
    return xg;
  })();
  return loaded;
}

/** An engine call's failure, with the engine's own reason. `broken`: the module aborted (or threw
 * a C++ exception it had no message for) and its memory can no longer be trusted: later calls fail
 * with "memory access out of bounds", or worse, answer wrongly. */
export class EngineFailure extends Error {
  constructor(message: string, readonly broken: boolean) {
    super(message);
  }
}

/** Runs an engine call; its failure becomes an EngineFailure. */
export async function engineCall<T>(what: string, f: () => Promise<T> | T): Promise<T> {
  messages.length = 0;
  try {
    return await f();
  } catch (e) {
    const fatal = messages.find((l) => l.startsWith("[FATAL]"));
    // "[FATAL] /path/to/x.cc:75: Regex parsing error ..." -> "Regex parsing error ..."
    const raw = e instanceof Error ? e.message : String(e);
    const broken = !fatal && (e instanceof WebAssembly.RuntimeError || !(e instanceof Error) || /^Aborted\(/.test(raw));
    const why = fatal ? fatal.replace(/^\[FATAL\]\s*\S+?\.cc:\d+:\s*/, "") : broken ? `the engine failed (${raw.slice(0, 100)})` : raw;
    throw new EngineFailure(`${what}: ${why.slice(0, 500)}`, broken);
  }
}

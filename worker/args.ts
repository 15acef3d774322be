// Argument parsing shared by `prima-worker` and `prima-worker profile`: usage errors print the
// message and the help text and give exit code 2; --help prints the help and gives 0.
import { parseArgs, type ParseArgsConfig } from "node:util";

type Options = NonNullable<ParseArgsConfig["options"]> & { help: { type: "boolean"; short: "h" } };
type Values<O extends Options> = ReturnType<typeof parseArgs<{ args: string[]; options: O }>>["values"];

/** The parsed values, or the exit code when there is nothing more to do (help or a usage error).
 * `options` must have `help` (-h). */
export function parseWorkerArgs<O extends Options>(argv: string[], options: O, help: string): Values<O> | number {
  let values: Values<O>;
  try {
    ({ values } = parseArgs({ args: argv, options }));
  } catch (e) {
    console.error(`${(e as Error).message}\n${help}`);
    return 2;
  }
  if ((values as { help?: boolean }).help) {
    console.log(help);
    return 0;
  }
  return values;
}

/** --threads as a whole number >= 1 (undefined when not given); "bad" after printing why not. */
export function threadsArg(v: string | undefined): number | undefined | "bad" {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1 || n > 1024) {
    console.error("--threads must be a whole number from 1 to 1024");
    return "bad";
  }
  return n;
}

/** `--NAME` given without a value (last, or followed by another option) becomes `--NAME=`, so a
 * string option can also stand alone (`--join` alone means: find the coordinator on the network). */
export function allowBare(argv: readonly string[], name: string): string[] {
  return argv.map((a, i) => (a === `--${name}` && (i === argv.length - 1 || argv[i + 1].startsWith("-")) ? `--${name}=` : a));
}

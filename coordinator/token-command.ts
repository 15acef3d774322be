// prima-coord token [--name NAME] [--rotate]: the cluster's join token, as workers are given it, and
// where it is kept. --rotate makes a new one (and a new certificate): a running serve picks it up
// within a few seconds and lets go of the workers that joined with the old one.
import { hostname } from "node:os";
import { parseArgs } from "node:util";
import { TrustStore, configDir } from "../trust/index.js";

const HELP = `usage: prima-coord token [--name NAME] [--rotate] [--quiet]

  --name NAME   the cluster (serve --name; default: this host's name, as serve's; run and chat use "prima")
  --rotate      replace the token and the coordinator's certificate: every worker needs the new token
  --quiet       print the token alone (for scripts: PRIMA_TOKEN="$(prima-coord token --quiet)")

Tokens are kept in ${configDir()} (NAME.token, 0600), made on first use.`;

export async function tokenCommand(argv: string[]): Promise<number> {
  let values: { name?: string; rotate?: boolean; quiet?: boolean; help?: boolean };
  try {
    ({ values } = parseArgs({ args: argv, options: { name: { type: "string" }, rotate: { type: "boolean" }, quiet: { type: "boolean" }, help: { type: "boolean", short: "h" } } }));
  } catch (e) {
    console.error(`${(e as Error).message}\n${HELP}`);
    return 2;
  }
  if (values.help) {
    console.log(HELP);
    return 0;
  }
  const name = values.name ?? hostname();
  const t = await TrustStore.open(name, { rotate: values.rotate });
  if (values.quiet) {
    console.log(t.identity.tokenText);
    return 0;
  }
  if (values.rotate) console.log(`new join token for cluster "${name}" (a running serve lets go of workers with the old one within seconds):`);
  else if (t.created) console.log(`new join token for cluster "${name}":`);
  console.log(t.identity.tokenText);
  console.log(`kept in ${t.tokenFile}; on a worker: prima-worker --join HOST:PORT --token ${t.identity.tokenText}`);
  return 0;
}

#!/usr/bin/env node
// prima-coord: the coordinator's command line. Each subcommand lives in its own module and is loaded
// on demand, so `prima-coord run` does not pay for the scheduler or the model generator.

type Command = (args: string[]) => Promise<number>;

const commands: Record<string, { summary: string; load: () => Promise<Command> }> = {
  run: { summary: "run model.gguf -p PROMPT [-n N]   generate text (alone, or with joined workers)", load: async () => (await import("./run-command.js")).runCommand },
  serve: { summary: "serve model.gguf [--port 8080]   the cluster as a service: OpenAI API, dashboard, workers join any time", load: async () => (await import("./serve-command.js")).serveCommand },
  chat: { summary: "chat model.gguf   a conversation in the terminal (alone, or with joined workers)", load: async () => (await import("./chat-command.js")).chatCommand },
  status: { summary: "status [host:port] [--watch] [--json]   the cluster's state in the terminal", load: async () => (await import("./status-command.js")).statusCommand },
  perplexity: { summary: "perplexity model.gguf -f text.txt [--ctx N]   how well the model predicts a text (as llama-perplexity)", load: async () => (await import("./perplexity-command.js")).perplexityCommand },
  plan: { summary: "plan model.gguf --devices devices.json   print Halda's plan for a cluster", load: async () => (await import("./plan-command.js")).planCommand },
  token: { summary: "token [--name NAME] [--rotate]   the join token workers need (made on first use)", load: async () => (await import("./token-command.js")).tokenCommand },
  "make-model": { summary: "make-model --shape NAME --type TYPE --out FILE   write a random-weight GGUF", load: async () => (await import("./make-model-command.js")).makeModelCommand },
};

function usage(): string {
  return ["usage: prima-coord <command> [options]", "", ...Object.entries(commands).map(([n, c]) => `  ${n.padEnd(11)} ${c.summary}`)].join("\n");
}

async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (!name || name === "-h" || name === "--help") {
    console.log(usage());
    return name ? 0 : 2;
  }
  const cmd = commands[name];
  if (!cmd) {
    console.error(`prima-coord: unknown command "${name}"\n${usage()}`);
    return 2;
  }
  return (await cmd.load())(rest);
}

main(process.argv.slice(2)).then(
  (code) => { process.exitCode = code; },
  (err: unknown) => {
    console.error(`prima-coord: ${err instanceof Error ? err.message : String(err)}`);
    process.exitCode = 1;
  },
);

// A fake worker in its own process, for tests that freeze it (SIGSTOP): joins the coordinator at
// <address> as <name> with <fingerprint> and the join <token>, sends heartbeats, answers nothing,
// prints "joined <id>".
//
//   node fake-worker-child.mjs <address> <name> <fingerprint> <token>
import { PROTOCOL_VERSION, coordinatorClient } from "../../dist/control/index.js";
import { clusterCredentials, joinProof, parseToken } from "../../dist/trust/index.js";

const [address, name, fingerprint, tokenText] = process.argv.slice(2);
const token = parseToken(tokenText);
const stream = coordinatorClient(address, await clusterCredentials(address, token, 5000)).session();
stream.on("data", (m) => {
  if (m.msg === "welcome") console.log(`joined ${m.welcome.deviceId}`);
  if (m.msg === "challenge") {
    stream.write({
      join: {
        protocolVersion: PROTOCOL_VERSION, deviceName: name, hardwareId: "fake", dataHost: "", dataPort: 9, modelFingerprint: fingerprint,
        modelPath: "fake.gguf", profileJson: "", proof: joinProof(token, m.challenge.nonce),
      },
    });
  }
});
stream.on("error", () => process.exit(0));
stream.on("end", () => process.exit(0));
setInterval(() => stream.write({ heartbeat: { sentUnixMs: Date.now() } }), 300);

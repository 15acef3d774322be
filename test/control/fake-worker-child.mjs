// A fake worker in its own process, for tests that freeze it (SIGSTOP): joins the coordinator at
// <address> as <name> with <fingerprint>, sends heartbeats, answers nothing, prints "joined <id>".
//
//   node fake-worker-child.mjs <address> <name> <fingerprint>
import { PROTOCOL_VERSION, coordinatorClient } from "../../dist/control/index.js";

const [address, name, fingerprint] = process.argv.slice(2);
const stream = coordinatorClient(address).session();
stream.on("data", (m) => {
  if (m.msg === "welcome") console.log(`joined ${m.welcome.deviceId}`);
});
stream.on("error", () => process.exit(0));
stream.on("end", () => process.exit(0));
stream.write({
  join: {
    protocolVersion: PROTOCOL_VERSION, deviceName: name, hardwareId: "fake", dataHost: "", dataPort: 9, modelFingerprint: fingerprint,
    modelPath: "fake.gguf", profileJson: "",
  },
});
setInterval(() => stream.write({ heartbeat: { sentUnixMs: Date.now() } }), 300);

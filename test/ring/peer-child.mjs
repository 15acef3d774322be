// A minimal ring peer in its own process, for link tests that must freeze (SIGSTOP) or kill a peer.
// It speaks the handshake from DESIGN.md's header table directly (not through ring/), so the tests
// also check ring/ against an independent writer of the wire format.
//
//   node peer-child.mjs dial <ws-url> <hello-json>    dial a RingListener, print "linked"
//   node peer-child.mjs listen <hello-json>           print "port <n>", accept one dialer, print "linked"
import WebSocket, { WebSocketServer } from "ws";

const [mode, ...rest] = process.argv.slice(2);

function helloFrame(hello) {
  const payload = Buffer.from(JSON.stringify(hello), "utf8");
  const buf = Buffer.alloc(32 + payload.length); // zeroed: request, position, tokens, cycle, dtype, reserved, row width
  buf.write("PRMA", 0, "latin1");
  buf.writeUInt16LE(1, 4); // header version
  buf.writeUInt16LE(1, 6); // HELLO
  buf.writeUInt32LE(payload.length, 28);
  payload.copy(buf, 32);
  return buf;
}

function isHello(data) {
  return Buffer.isBuffer(data) && data.length > 32 && data.toString("latin1", 0, 4) === "PRMA" && data.readUInt16LE(6) === 1;
}

if (mode === "dial") {
  const [url, helloJson] = rest;
  const ws = new WebSocket(url);
  ws.on("open", () => ws.send(helloFrame(JSON.parse(helloJson))));
  ws.once("message", (data) => console.log(isHello(data) ? "linked" : "refused"));
  ws.on("error", (e) => console.log(`error ${e.message}`));
} else if (mode === "listen") {
  const [helloJson] = rest;
  const wss = new WebSocketServer({ host: "127.0.0.1", port: 0 }, () => console.log(`port ${wss.address().port}`));
  wss.on("connection", (ws) => {
    ws.once("message", (data) => {
      if (!isHello(data)) return ws.terminate();
      ws.send(helloFrame(JSON.parse(helloJson)));
      console.log("linked");
    });
    ws.on("error", () => {});
  });
} else {
  console.error(`unknown mode ${mode}`);
  process.exit(2);
}

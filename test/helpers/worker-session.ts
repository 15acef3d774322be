// A real worker's control session (worker/session.ts) against a test's registry, with a test's
// handler: joined as `name` with `profileJson`, stopped by the cleanup it pushes.
import type { JoinToken } from "../../trust/index.js";
import { WorkerSession, type SessionHandler } from "../../worker/session.js";

export function startSession(o: {
  address: string; token: JoinToken; name: string; fingerprint: string; profileJson: string; handler: SessionHandler; cleanups: (() => unknown)[];
}): WorkerSession {
  const session = new WorkerSession({
    coordinator: o.address, token: o.token, log: () => {}, once: true,
    join: { deviceName: o.name, hardwareId: "t", dataHost: "", dataPort: 9, modelFingerprint: o.fingerprint, modelPath: "m.gguf", profileJson: o.profileJson },
  }, o.handler);
  const running = session.run();
  o.cleanups.push(async () => {
    session.stop();
    await running.catch(() => {});
  });
  return session;
}

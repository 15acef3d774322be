// Server-Sent Events over fetch(): EventSource cannot send an Authorization header, and the state
// stream and the chat stream both need one when the server has an API key.

/**
 * Yields { event, data } for each message of a text/event-stream response body. `onBytes` is called
 * whenever anything arrives (comments too), so a caller can tell a quiet stream from a dead one.
 */
export async function* readEvents(response, onBytes) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "message";
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      onBytes?.();
      buffer += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buffer.search(/\r\n|\r|\n/)) >= 0) {
        // A lone CR at the end may be half of a CRLF split across chunks: wait for the next one.
        if (nl === buffer.length - 1 && buffer[nl] === "\r") break;
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + (buffer.startsWith("\r\n", nl) ? 2 : 1));
        if (line === "") {
          if (data.length) yield { event, data: data.join("\n") };
          event = "message";
          data = [];
        } else if (!line.startsWith(":")) {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const v = colon < 0 ? "" : line.slice(colon + (line[colon + 1] === " " ? 2 : 1));
          if (field === "event") event = v;
          else if (field === "data") data.push(v);
        }
      }
    }
  } finally {
    reader.releaseLock();
  }
}

/** The message of an OpenAI-style error body ({ error: { message } }), or the status line. */
export async function errorMessage(response) {
  let text = "";
  try {
    text = await response.text();
    const body = JSON.parse(text);
    if (body && body.error && typeof body.error.message === "string") return body.error.message;
  } catch {
    // Not JSON: fall back to the status and the start of the body.
  }
  return `HTTP ${response.status}${text ? `: ${text.slice(0, 200)}` : ""}`;
}

// The chat panel: talks to the model through the server's own OpenAI API (POST /v1/chat/completions
// with stream: true) and appends each streamed piece to the page as text.
import { fmtNum, h, textLines } from "./dom.js";
import { errorMessage, readEvents } from "./sse.js";

/**
 * `api` is { headers(): object, needKey(message): Promise<void>, modelName(): string|null } from app.js.
 * Elements: the form, its textarea, the message list, the send/stop button, temperature and max tokens.
 */
export function setupChat(els, api) {
  const history = [];
  let controller = null;
  let modelId = null;

  async function resolveModel() {
    if (modelId) return modelId;
    try {
      const r = await fetch("/v1/models", { headers: api.headers() });
      if (r.ok) {
        const body = await r.json();
        if (body && Array.isArray(body.data) && body.data[0] && typeof body.data[0].id === "string") modelId = body.data[0].id;
      }
    } catch {
      // The state's model name below is as good a guess.
    }
    return modelId ?? api.modelName() ?? "default";
  }

  function bubble(role, text) {
    const body = h("div", { class: "msg-body" }, textLines(text));
    const el = h("div", { class: ["msg", role] }, h("div", { class: "msg-role" }, role === "user" ? "you" : "model"), body);
    els.log.appendChild(el);
    els.log.scrollTop = els.log.scrollHeight;
    return { el, body };
  }

  function setBusy(busy) {
    els.send.textContent = busy ? "Stop" : "Send";
    els.send.classList.toggle("stop", busy);
    els.input.disabled = busy;
  }

  async function send(text) {
    history.push({ role: "user", content: text });
    bubble("user", text);
    const out = bubble("assistant", "");
    out.el.classList.add("streaming");
    controller = new AbortController();
    setBusy(true);
    const started = performance.now();
    let pieces = 0;
    let answer = "";
    try {
      const temperature = Number(els.temperature.value);
      const maxTokens = Number(els.maxTokens.value);
      const body = JSON.stringify({
        model: await resolveModel(),
        messages: history,
        stream: true,
        ...(Number.isFinite(temperature) ? { temperature } : {}),
        ...(Number.isInteger(maxTokens) && maxTokens > 0 ? { max_tokens: maxTokens } : {}),
      });
      let r;
      for (;;) {
        r = await fetch("/v1/chat/completions", {
          method: "POST",
          headers: { "Content-Type": "application/json", ...api.headers() },
          body,
          signal: controller.signal,
        });
        if (r.status !== 401) break;
        await api.needKey(await errorMessage(r));
      }
      if (!r.ok) throw new Error(await errorMessage(r));
      for await (const m of readEvents(r)) {
        if (m.data === "[DONE]") break;
        const chunk = JSON.parse(m.data);
        if (chunk.error) throw new Error(chunk.error.message ?? "the server reported an error");
        const piece = chunk.choices?.[0]?.delta?.content;
        if (typeof piece === "string" && piece) {
          answer += piece;
          pieces++;
          out.body.appendChild(textLines(piece));
          els.log.scrollTop = els.log.scrollHeight;
        }
      }
      history.push({ role: "assistant", content: answer });
      const secs = (performance.now() - started) / 1000;
      out.el.appendChild(h("div", { class: "msg-meta" }, `${pieces} pieces in ${fmtNum(secs)} s`));
    } catch (err) {
      const stopped = err && err.name === "AbortError";
      if (answer) history.push({ role: "assistant", content: answer });
      else history.pop(); // an unanswered question would confuse the next turn
      out.el.appendChild(h("div", { class: stopped ? "msg-meta" : "msg-error" }, stopped ? "stopped" : `Error: ${err instanceof Error ? err.message : String(err)}`));
    } finally {
      out.el.classList.remove("streaming");
      controller = null;
      setBusy(false);
      els.input.focus();
    }
  }

  els.form.addEventListener("submit", (e) => {
    e.preventDefault();
    if (controller) { controller.abort(); return; }
    const text = els.input.value.trim();
    if (!text) return;
    els.input.value = "";
    void send(text);
  });
  els.input.addEventListener("keydown", (e) => {
    // Enter sends, Shift+Enter is a new line (as in most chat boxes).
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); els.form.requestSubmit(); }
  });
  els.clear.addEventListener("click", () => {
    if (controller) controller.abort();
    history.length = 0;
    els.log.replaceChildren();
  });
}

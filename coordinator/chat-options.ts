// A chat request's say over its template and its reasoning, as llama-server reads them: the template's
// own variables (chat_template_kwargs, e.g. {"enable_thinking": false} for Qwen3), OpenAI's
// reasoning_effort (gpt-oss's template reads it; "none" turns thinking off) and reasoning_format
// (none keeps the reasoning in the content, auto splits it; serve --reasoning-format is the default).
import { REASONING_FORMATS, type ReasoningFormat } from "../tools/index.js";
import { ApiError } from "./openai.js";

const EFFORTS = ["none", "minimal", "low", "medium", "high"];
const MAX_KWARGS_BYTES = 16 << 10;

function bad(param: string, message: string): ApiError {
  return new ApiError(400, `${param}: ${message}`, "invalid_request_error", "invalid_value", param);
}

export interface ChatOptions {
  /** Variables the chat template is rendered with besides the messages and tools. */
  readonly templateVars?: Readonly<Record<string, unknown>>;
  readonly reasoningFormat?: ReasoningFormat;
}

export function parseChatOptions(b: Record<string, unknown>): ChatOptions {
  const vars: Record<string, unknown> = {};
  const kw = b.chat_template_kwargs;
  if (kw !== undefined && kw !== null) {
    if (typeof kw !== "object" || Array.isArray(kw)) throw bad("chat_template_kwargs", "must be an object of template variables");
    if (JSON.stringify(kw).length > MAX_KWARGS_BYTES) throw bad("chat_template_kwargs", `at most ${MAX_KWARGS_BYTES} bytes of JSON`);
    for (const [k, v] of Object.entries(kw)) if (k !== "messages" && k !== "tools" && k !== "add_generation_prompt") vars[k] = v;
    if (vars.enable_thinking !== undefined && typeof vars.enable_thinking !== "boolean") throw bad("chat_template_kwargs.enable_thinking", "must be true or false");
  }
  const effort = b.reasoning_effort;
  if (effort !== undefined && effort !== null) {
    if (typeof effort !== "string" || !EFFORTS.includes(effort)) throw bad("reasoning_effort", `must be one of ${EFFORTS.join(", ")}`);
    if (effort === "none") vars.enable_thinking = false;
    else vars.reasoning_effort = effort;
  }
  const f = b.reasoning_format;
  if (f !== undefined && f !== null && (typeof f !== "string" || !(REASONING_FORMATS as readonly string[]).includes(f))) {
    throw bad("reasoning_format", `must be one of ${REASONING_FORMATS.join(", ")}`);
  }
  return { ...(Object.keys(vars).length ? { templateVars: vars } : {}), ...(f ? { reasoningFormat: f as ReasoningFormat } : {}) };
}

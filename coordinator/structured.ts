// A request's structured output, between the OpenAI API and the sampler: which grammar constrains the
// reply (response_format, or the tools' call format from its trigger or from the first token), what
// the chat template is given (tools, and for templates without tool support the generic format's
// instructions and earlier calls and results as plain turns), and how the reply is read back.
import { GrammarError, GrammarSet, SchemaError, type ConstraintSpec, type GrammarConstraint } from "../grammar/index.js";
import type { ChatMessage, Tokenizer } from "../model/index.js";
import { FORMATS, answerGrammar, detectFormat, detectReasoning, genericToolPrompt, replyParser, toolGrammar, type CallFormat, type ReasoningFormat, type ReplyParser } from "../tools/index.js";
import { ApiError, type ParsedRequest } from "./openai.js";

export interface StructuredPlan {
  /** The messages and tools the chat template renders. */
  readonly messages: readonly ChatMessage[];
  readonly templateTools?: readonly unknown[];
  readonly spec?: ConstraintSpec;
  /** The request's field the grammar comes from, as a refusal names it. */
  readonly param?: "response_format" | "tools";
  /** Reads the reply's calls and reasoning out of its text as it streams, given the rendered prompt
   * (undefined: the text is all content). */
  parser(promptText: string | undefined): ReplyParser | undefined;
}

/** Works out the plan for a parsed chat or completion request under this template. */
export function planStructured(p: ParsedRequest, templateSource: string | undefined, templateIsFallback: boolean, reasoningFormat: ReasoningFormat = "auto"): StructuredPlan {
  const reasoning = p.kind === "chat" && !templateIsFallback ? detectReasoning(templateSource) : undefined;
  const split = reasoningFormat !== "none";
  const messages = reasoning === "harmony" ? harmonyMessages(p.messages ?? []) : p.messages ?? [];
  const textOnly = (promptText: string | undefined) => replyParser({ names: [], reasoning, split, promptText });
  if (p.responseFormat) {
    const rf = p.responseFormat;
    // gpt-oss answers a schema in its final channel's JSON message; other models (and JSON mode, whose
    // any-object grammar is the engine's own) with the bare JSON.
    const tag = reasoning === "harmony" && rf.kind === "json-schema" ? answerGrammar(FORMATS.harmony, rf.schema) : undefined;
    const spec: ConstraintSpec = tag !== undefined ? { kind: "structural-tag", tag } : rf.kind === "json-object" ? { kind: "json-object" } : { kind: "json-schema", schema: rf.schema };
    // The grammar holds from the first token: no <think> block the template opened is being written.
    return { messages, spec, param: "response_format", parser: () => textOnly(undefined) };
  }
  if (!p.tools || p.tools.length === 0) return { messages, parser: textOnly };
  const format: CallFormat = templateIsFallback ? detectFormat(undefined) : detectFormat(templateSource);
  const choice = p.toolChoice ?? "auto";
  const tag = toolGrammar(format, p.tools, choice, p.parallelToolCalls ?? true);
  const spec: ConstraintSpec | undefined = tag === undefined ? undefined : { kind: "structural-tag", tag };
  const names = p.tools.map((t) => t.name);
  // With a grammar from the first token (calls required, or the generic format's JSON reply) the reply
  // starts outside any <think> block the template opened.
  const fromFirst = tag !== undefined && (choice !== "auto" || format.name === "generic");
  const parser = (promptText: string | undefined) =>
    replyParser({ format: choice === "none" ? undefined : format, names, reasoning, split, promptText: fromFirst ? undefined : promptText });
  if (format.name !== "generic") {
    const templateTools = p.tools.map((t) => ({ type: "function", function: { name: t.name, description: t.description ?? "", parameters: t.parameters } }));
    return { messages, templateTools, spec, parser };
  }
  return { messages: genericMessages(messages, genericToolPrompt(p.tools, choice)), spec, parser };
}

/** gpt-oss's template reads an earlier turn's reasoning as `thinking` (it keeps it for a turn that
 * called a tool, until a final answer follows) and refuses a turn with both content and thinking beside
 * calls: the content gives way, as llama.cpp's gpt-oss handler does. */
function harmonyMessages(messages: readonly ChatMessage[]): ChatMessage[] {
  return messages.map((m) => {
    if (m.role !== "assistant" || typeof m.reasoning_content !== "string" || m.reasoning_content === "") return m;
    const { reasoning_content: thinking, ...rest } = m;
    const calls = m.tool_calls as unknown[] | undefined;
    return calls?.length ? { ...rest, content: "", thinking } : { ...rest, thinking };
  });
}

/** Earlier calls and results as turns any template renders: calls as the generic format's JSON lines,
 * results as user turns; the tools' description joins the system message. */
function genericMessages(messages: readonly ChatMessage[], toolPrompt: string): ChatMessage[] {
  const out: ChatMessage[] = messages.map((m) => {
    const calls = m.tool_calls as { function: { name: string; arguments: unknown } }[] | undefined;
    if (m.role === "assistant" && calls?.length) {
      const lines = calls.map((c) => JSON.stringify({ tool_call: { name: c.function.name, arguments: c.function.arguments } }));
      return { role: "assistant", content: [m.content, ...lines].filter(Boolean).join("\n") };
    }
    if (m.role === "tool") return { role: "user", content: JSON.stringify({ tool_response: { tool_call_id: m.tool_call_id, content: m.content } }) };
    return { role: m.role, content: m.content };
  });
  if (out[0]?.role === "system") out[0] = { role: "system", content: `${out[0].content}\n\n${toolPrompt}` };
  else out.unshift({ role: "system", content: toolPrompt });
  return out;
}

/** The grammars of the served model, compiled on first use. */
export class Constraints {
  private set: Promise<GrammarSet> | undefined;
  /** Time the constraint added (masks and accepts) and the tokens it constrained, for /metrics. */
  ms = 0;
  tokens = 0;

  constructor(private readonly tok: Tokenizer) {}

  /** A matcher for the spec; a grammar the engine refuses is a 400. */
  async start(spec: ConstraintSpec, param: string = spec.kind === "structural-tag" ? "tools" : "response_format"): Promise<GrammarConstraint> {
    // A setup that failed (the engine's thread died or hung) is tried afresh by the next request.
    this.set ??= GrammarSet.forTokenizer(this.tok).catch((e: unknown) => {
      this.set = undefined;
      throw e;
    });
    const set = await this.set;
    try {
      return await set.constraint(spec);
    } catch (e) {
      if (e instanceof SchemaError || e instanceof GrammarError) {
        throw new ApiError(400, `${param}: ${e.message}`, "invalid_request_error", "unsupported_schema", param);
      }
      throw e;
    }
  }

  /** Counts a finished constraint and frees it. */
  done(c: GrammarConstraint): void {
    this.ms += c.ms;
    this.tokens += c.steps;
    c.dispose();
  }
}

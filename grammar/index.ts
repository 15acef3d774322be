// grammar/: constrained decoding. Compiles JSON Schemas, JSON mode, GBNF grammars and tool-call
// formats for a model's vocabulary with XGrammar (WebAssembly), and gives the sampler, at each step,
// the tokens that keep the output valid.
export { GrammarSet, closingStart, GrammarConstraint, GrammarError, type ConstraintSpec } from "./constraint.js";
export { checkSchema, SchemaError, SCHEMA_LIMITS, FORMATS } from "./schema-check.js";
export { forEngine } from "./schema-rewrite.js";
export { FORMAT_PATTERNS } from "./schema-formats.js";
export { xgrammar } from "./xgrammar.js";

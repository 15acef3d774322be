// The JSON Schema keywords as the rewrite for the engine sorts them.

export type Json = Record<string, unknown>;

/** Keywords that constrain a value (the others are annotations, or hold definitions). */
export const VALIDATION = new Set([
  "type", "enum", "const", "properties", "patternProperties", "additionalProperties", "required", "items", "prefixItems",
  "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
  "exclusiveMaximum", "minProperties", "maxProperties", "anyOf", "oneOf", "allOf", "$ref", "unevaluatedProperties", "unevaluatedItems",
]);
/** The type a keyword applies to (it is ignored for values of other types). */
export const KIND: Readonly<Record<string, string>> = {
  minLength: "string", maxLength: "string", pattern: "string", format: "string",
  minimum: "number", maximum: "number", exclusiveMinimum: "number", exclusiveMaximum: "number",
  properties: "object", patternProperties: "object", additionalProperties: "object", required: "object",
  minProperties: "object", maxProperties: "object", unevaluatedProperties: "object",
  items: "array", prefixItems: "array", minItems: "array", maxItems: "array", unevaluatedItems: "array",
};

export const has = (o: Json, k: string) => o[k] !== undefined;
export const validationKeys = (o: Json) => Object.keys(o).filter((k) => VALIDATION.has(k) && o[k] !== undefined);

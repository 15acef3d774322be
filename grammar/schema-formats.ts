// The JSON Schema formats the decoder honours, as the patterns the engine is given for them.

/**
 * Formats given to the engine as patterns: its own grammars for these let through what validators
 * (ajv, pydantic) reject (minute 60, February 30, an email domain with no dot, host labels over 63
 * characters, "09" in an address, a raw quote in a JSON pointer, URIs RFC 3986 refuses, a short UUID, "PT1D"). Each pattern is a subset of the
 * format as RFC 3339, RFC 6901 and ajv-formats define it.
 */
const DATE = "[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))";
const TIME = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
const LABEL = "[A-Za-z0-9]([A-Za-z0-9-]{0,40}[A-Za-z0-9])?";
const OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
const POINTER = "(/([A-Za-z0-9._-]|~[01])*)*";
const PATH = "(/[A-Za-z0-9._~-]{0,40}){0,8}";
export const FORMAT_PATTERNS: Readonly<Record<string, string>> = {
  date: `^${DATE}$`,
  time: `^${TIME}$`,
  "date-time": `^${DATE}T${TIME}$`,
  email: `^[A-Za-z0-9_+-]+(\\.[A-Za-z0-9_+-]+)*@(${LABEL}\\.){1,3}[A-Za-z]{2,12}$`,
  hostname: `^${LABEL}(\\.${LABEL}){0,3}$`,
  ipv4: `^(${OCTET}\\.){3}${OCTET}$`,
  uri: `^https?://${LABEL}(\\.${LABEL}){0,3}${PATH}$`,
  "uri-reference": `^(https?://${LABEL}(\\.${LABEL}){0,3})?${PATH}$`,
  "json-pointer": `^${POINTER}$`,
  "relative-json-pointer": `^(0|[1-9][0-9]{0,5})(#|${POINTER})$`,
  uuid: "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
  ipv6: "^([0-9a-f]{1,4}:){7}[0-9a-f]{1,4}$",
  duration: "^P([0-9]{1,4}Y)?([0-9]{1,4}M)?[0-9]{1,4}D(T[0-9]{1,2}H([0-9]{1,2}M)?([0-9]{1,2}S)?)?$",
};

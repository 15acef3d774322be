// ggml tensor types as GGUF stores them: id, name, block size (elements) and block size (bytes).
// Ids are llama.cpp's (ggml.h); a file may name any of them, the engine runs only `supported` ones.

export interface GgmlTypeInfo {
  readonly id: number;
  readonly name: string;
  readonly blockElems: number;
  readonly blockBytes: number;
  /** The native engine has kernels for it. */
  readonly supported: boolean;
}

const TYPES: readonly GgmlTypeInfo[] = [
  { id: 0, name: "F32", blockElems: 1, blockBytes: 4, supported: true },
  { id: 1, name: "F16", blockElems: 1, blockBytes: 2, supported: true },
  { id: 2, name: "Q4_0", blockElems: 32, blockBytes: 18, supported: true },
  { id: 3, name: "Q4_1", blockElems: 32, blockBytes: 20, supported: true },
  { id: 6, name: "Q5_0", blockElems: 32, blockBytes: 22, supported: true },
  { id: 7, name: "Q5_1", blockElems: 32, blockBytes: 24, supported: true },
  { id: 8, name: "Q8_0", blockElems: 32, blockBytes: 34, supported: true },
  { id: 9, name: "Q8_1", blockElems: 32, blockBytes: 36, supported: false },
  { id: 10, name: "Q2_K", blockElems: 256, blockBytes: 84, supported: true },
  { id: 11, name: "Q3_K", blockElems: 256, blockBytes: 110, supported: true },
  { id: 12, name: "Q4_K", blockElems: 256, blockBytes: 144, supported: true },
  { id: 13, name: "Q5_K", blockElems: 256, blockBytes: 176, supported: true },
  { id: 14, name: "Q6_K", blockElems: 256, blockBytes: 210, supported: true },
  { id: 15, name: "Q8_K", blockElems: 256, blockBytes: 292, supported: false },
  { id: 16, name: "IQ2_XXS", blockElems: 256, blockBytes: 66, supported: false },
  { id: 17, name: "IQ2_XS", blockElems: 256, blockBytes: 74, supported: false },
  { id: 18, name: "IQ3_XXS", blockElems: 256, blockBytes: 98, supported: false },
  { id: 19, name: "IQ1_S", blockElems: 256, blockBytes: 50, supported: false },
  { id: 20, name: "IQ4_NL", blockElems: 32, blockBytes: 18, supported: true },
  { id: 21, name: "IQ3_S", blockElems: 256, blockBytes: 110, supported: false },
  { id: 22, name: "IQ2_S", blockElems: 256, blockBytes: 82, supported: false },
  { id: 23, name: "IQ4_XS", blockElems: 256, blockBytes: 136, supported: true },
  { id: 24, name: "I8", blockElems: 1, blockBytes: 1, supported: false },
  { id: 25, name: "I16", blockElems: 1, blockBytes: 2, supported: false },
  { id: 26, name: "I32", blockElems: 1, blockBytes: 4, supported: false },
  { id: 27, name: "I64", blockElems: 1, blockBytes: 8, supported: false },
  { id: 28, name: "F64", blockElems: 1, blockBytes: 8, supported: false },
  { id: 29, name: "IQ1_M", blockElems: 256, blockBytes: 56, supported: false },
  { id: 30, name: "BF16", blockElems: 1, blockBytes: 2, supported: true },
  { id: 34, name: "TQ1_0", blockElems: 256, blockBytes: 54, supported: false },
  { id: 35, name: "TQ2_0", blockElems: 256, blockBytes: 66, supported: false },
  { id: 39, name: "MXFP4", blockElems: 32, blockBytes: 17, supported: true },
];

const BY_ID = new Map(TYPES.map((t) => [t.id, t]));
const BY_NAME = new Map(TYPES.map((t) => [t.name, t]));

export const GgmlType = {
  F32: 0, F16: 1, Q4_0: 2, Q4_1: 3, Q5_0: 6, Q5_1: 7, Q8_0: 8, Q8_1: 9,
  Q2_K: 10, Q3_K: 11, Q4_K: 12, Q5_K: 13, Q6_K: 14, Q8_K: 15, IQ4_NL: 20, IQ4_XS: 23, BF16: 30, MXFP4: 39,
} as const;

export function ggmlTypeInfo(id: number): GgmlTypeInfo | undefined {
  return BY_ID.get(id);
}

export function ggmlTypeByName(name: string): GgmlTypeInfo | undefined {
  return BY_NAME.get(name.toUpperCase());
}

export function ggmlTypeName(id: number): string {
  return BY_ID.get(id)?.name ?? `type#${id}`;
}

export const supportedGgmlTypes: readonly GgmlTypeInfo[] = TYPES.filter((t) => t.supported);

/** Bytes of a row of `elems` elements, or an error string when the row is not whole blocks. */
export function rowBytes(typeId: number, elems: number): number {
  const t = BY_ID.get(typeId);
  if (!t) throw new Error(`unknown ggml type ${typeId}`);
  if (elems % t.blockElems !== 0) {
    throw new Error(`row of ${elems} elements is not a multiple of ${t.name}'s block of ${t.blockElems}`);
  }
  return (elems / t.blockElems) * t.blockBytes;
}

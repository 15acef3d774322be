// From a GGUF header to what the engine needs: hyper-parameters and a checked tensor table. The
// families and what each needs are in model/arch/ (one file per family); everything else is refused
// by name.

import { GgufError, metaString, type GgufFile, type GgufTensorInfo } from "./gguf.js";
import { printable } from "../base/index.js";
import { ggmlTypeInfo, ggmlTypeName } from "./ggml-types.js";
import {
  commonHParams, familyOf, fileVocabSize, keyReader, layerFromTable, supportedArchitectures,
  type ArchFamily, type HParams, type LayerTensors, type ModelDescription, type ModelTensors, type TensorRef,
} from "./arch/index.js";

export { families, familyOf, supportedArchitectures } from "./arch/index.js";
export type {
  ArchFamily, Architecture, FamilyShape, HParams, LayerSlot, LayerTensors, ModelDescription, ModelTensors, TensorRef,
} from "./arch/index.js";

/** Mixture-of-experts families prima does not run yet, with what they need beyond qwen3moe and Mixtral. */
const MOE_NEEDS: Readonly<Record<string, string>> = {
  deepseek2: "multi-head latent attention (MLA) and shared experts",
  deepseek: "shared experts",
  qwen2moe: "shared experts with a sigmoid gate",
  granitemoe: "Granite's multipliers and shared experts",
  olmoe: "unnormalised expert weights",
};

function familyOfFile(f: GgufFile): ArchFamily {
  const archName = metaString(f, "general.architecture");
  if (archName === undefined) throw new GgufError(`${f.path}: missing general.architecture`);
  const family = familyOf(archName);
  if (!family) {
    const needs = MOE_NEEDS[archName];
    if (needs) throw new GgufError(`${f.path}: architecture "${archName}" is a mixture-of-experts family prima does not run yet: it needs ${needs} (supported: ${supportedArchitectures.join(", ")})`);
    throw new GgufError(`${f.path}: architecture "${printable(archName, 80)}" is not supported (supported: ${supportedArchitectures.join(", ")})`);
  }
  return family;
}

export function readHParams(f: GgufFile): HParams {
  const family = familyOfFile(f);
  const keys = keyReader(f, family.name);
  const nExpert = keys.number("expert_count") ?? 0;
  if (!family.moe && (nExpert !== 0 || keys.hasTensor("blk.0.ffn_gate_inp.weight"))) {
    throw new GgufError(`${f.path}: ${family.name}.expert_count = ${nExpert}: mixture-of-experts layers are not supported for ${family.name}`);
  }
  const common = commonHParams(keys, family.name, family.ropeNeox, fileVocabSize(f), family.yarn);
  return family.hparams(keys, { ...common, hasRopeFreqs: common.hasRopeFreqs && Boolean(family.ropeFreqs) });
}

/** Checks every tensor the architecture needs: present, supported type, expected shape. */
export function readModelTensors(f: GgufFile, hp: HParams): ModelTensors {
  const byName = new Map<string, GgufTensorInfo>(f.tensors.map((t) => [t.name, t]));
  const read = new Set<string>();
  const get = (name: string, dims: readonly number[], opts: { optional?: boolean; f32Only?: boolean } = {}): TensorRef | undefined => {
    const t = byName.get(name);
    if (!t) {
      if (opts.optional) return undefined;
      throw new GgufError(`${f.path}: missing tensor ${name}`);
    }
    read.add(name);
    const info = ggmlTypeInfo(t.type);
    if (!info?.supported) throw new GgufError(`${f.path}: tensor ${name} has type ${ggmlTypeName(t.type)}, which prima does not support`);
    if (opts.f32Only && t.type !== 0) throw new GgufError(`${f.path}: tensor ${name} must be F32, is ${ggmlTypeName(t.type)}`);
    const shapeOk = t.dims.length >= dims.length && dims.every((d, i) => t.dims[i] === d) && t.dims.slice(dims.length).every((d) => d === 1);
    if (!shapeOk) throw new GgufError(`${f.path}: tensor ${name} has shape [${t.dims.join(", ")}], expected [${dims.join(", ")}]`);
    return { name, type: t.type, dims: t.dims, offset: t.offset, nBytes: t.nBytes };
  };
  const must = (name: string, dims: readonly number[], f32Only = false) => get(name, dims, { f32Only })!;
  const E = hp.nEmbd;
  const tokenEmbd = must("token_embd.weight", [E, hp.nVocab]);
  const outputNorm = must("output_norm.weight", [E], true);
  const output = hp.tiedEmbeddings ? tokenEmbd : get("output.weight", [E, hp.nVocab], { optional: true }) ?? tokenEmbd;
  const family = familyOfFile(f);
  // a tensor the family's build ignores in llama.cpp is ignored here too
  const ropeFreqs = family.ropeFreqs ? get("rope_freqs.weight", [hp.ropeDims / 2], { optional: true, f32Only: true }) : undefined;
  checkLayerCount(f, hp.nLayers);
  const layers: LayerTensors[] = [];
  for (let i = 0; i < hp.nLayers; i++) {
    layers.push(layerFromTable(family.layer, hp, i, (name, dims, f32) => must(name, dims, f32)));
  }
  const factors = (name: string) => (family.longRope ? get(name, [hp.ropeDims / 2], { optional: true, f32Only: true }) : undefined);
  const ropeFactorsLong = factors("rope_factors_long.weight"), ropeFactorsShort = factors("rope_factors_short.weight");
  if (family.strictTensors) {
    const unread = f.tensors.find((t) => !read.has(t.name));
    if (unread) throw new GgufError(`${f.path}: tensor ${printable(unread.name, 120)} is not part of the ${family.name} model prima runs; refusing rather than ignoring it`);
  }
  return { tokenEmbd, outputNorm, output, ropeFreqs, ropeFactorsLong, ropeFactorsShort, layers };
}

/** block_count must agree with the blk.N tensors: a file that says fewer layers than it holds would
 * run part of the model silently, one that says more would fail later on a missing tensor. */
function checkLayerCount(f: GgufFile, nLayers: number): void {
  let top = -1;
  let topName = "";
  for (const t of f.tensors) {
    const m = /^blk\.(\d+)\./.exec(t.name);
    if (m && Number(m[1]) > top) {
      top = Number(m[1]);
      topName = t.name;
    }
  }
  const key = `${f.metadata.get("general.architecture")?.value}.block_count`;
  if (top >= nLayers) {
    throw new GgufError(`${f.path}: ${key} says ${nLayers} layers, but the file has tensors of layer ${top} (${topName}); the header is wrong or hostile`);
  }
  if (top < nLayers - 1) {
    throw new GgufError(`${f.path}: ${key} says ${nLayers} layers, but the file has tensors of ${top + 1} (no blk.${top + 1}.* tensor)`);
  }
}

export function describeModel(f: GgufFile): ModelDescription {
  const hparams = readHParams(f);
  return { path: f.path, fileBytes: f.fileBytes, hparams, tensors: readModelTensors(f, hparams) };
}

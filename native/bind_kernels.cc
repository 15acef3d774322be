// JS surface of the kernel table (kernels.h): quantize/dequantize/dot on caller-owned typed arrays, for
// tests, the benchmark and the model generator. Every argument is checked; bad input throws a JS error
// naming the problem and never reaches the C kernels.
#include <napi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include "kernels.h"
#include "ops.h"
#include "kv_cache.h"
#include "sparse_attn.h"
#include "attn_tile.h"
}

namespace {

bool Fail(Napi::Env env, const std::string &msg) {
  Napi::Error::New(env, msg).ThrowAsJavaScriptException();
  return false;
}

// A typed array's bytes, copied to 32-byte aligned scratch when the view is misaligned (the kernels
// read blocks through struct pointers; float and half fields need natural alignment).
struct Bytes {
  uint8_t *data = nullptr;
  size_t length = 0;
  uint8_t *original = nullptr;
  std::vector<uint8_t> scratch;
  void Bind(uint8_t *p, size_t n, bool copyIn) {
    original = p;
    length = n;
    if (reinterpret_cast<uintptr_t>(p) % 32 == 0 || n == 0) {
      data = p;
      return;
    }
    scratch.resize(n + 32);
    uintptr_t base = (reinterpret_cast<uintptr_t>(scratch.data()) + 31) & ~uintptr_t(31);
    data = reinterpret_cast<uint8_t *>(base);
    if (copyIn) std::memcpy(data, p, n);
  }
  void CopyOut() {
    if (data != original && length) std::memcpy(original, data, length);
  }
};

bool GetTyped(Napi::Env env, const Napi::Value &v, napi_typedarray_type want, const char *what, Bytes &out,
              bool copyIn) {
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != want) {
    const char *name = want == napi_float32_array ? "Float32Array" : want == napi_uint16_array ? "Uint16Array" : "Uint8Array";
    return Fail(env, std::string(what) + " must be a " + name);
  }
  Napi::TypedArray t = v.As<Napi::TypedArray>();
  uint8_t *p = static_cast<uint8_t *>(t.ArrayBuffer().Data()) + t.ByteOffset();
  out.Bind(p, t.ByteLength(), copyIn);
  return true;
}

bool GetInt(Napi::Env env, const Napi::Value &v, const char *what, int64_t lo, int64_t hi, int64_t &out) {
  if (!v.IsNumber()) return Fail(env, std::string(what) + " must be a number");
  double d = v.As<Napi::Number>().DoubleValue();
  if (!std::isfinite(d) || d != std::floor(d) || d < (double)lo || d > (double)hi)
    return Fail(env, std::string(what) + " must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                         " (got " + v.ToString().Utf8Value() + ")");
  out = (int64_t)d;
  return true;
}

// Optional SIMD level argument: a name ("scalar", "avx2", "neon") or undefined for the selected level.
bool GetLevel(Napi::Env env, const Napi::Value &v, int &level) {
  if (v.IsUndefined() || v.IsNull()) {
    level = prima_simd_level();
    return true;
  }
  if (!v.IsString()) return Fail(env, "simd level must be a string (scalar, avx2, neon)");
  std::string s = v.As<Napi::String>().Utf8Value();
  for (int l = 0; l < 4; l++) {
    if (s == prima_simd_name(l)) {
      if (!prima_simd_available(l)) return Fail(env, "simd level " + s + " is not available on this CPU/build");
      level = l;
      return true;
    }
  }
  return Fail(env, "unknown simd level '" + s + "' (scalar, avx2, avx512, neon)");
}

std::string TypeLabel(int type) {
  const char *n = prima_type_name(type);
  return n ? std::string(n) : "type " + std::to_string(type);
}

bool GetKernels(Napi::Env env, const Napi::Value &v, int level, const char *fn, const prima_type_kernels *&k) {
  int64_t type;
  if (!GetInt(env, v, "type", 0, PRIMA_TYPE_COUNT - 1, type)) return false;
  k = prima_kernels_at((int)type, level);
  if (!k) return Fail(env, std::string(fn) + ": " + TypeLabel((int)type) + " is not a weight type with kernels");
  return true;
}

// Checks that a row of n elements of a type fills a buffer exactly; returns the row's bytes.
bool CheckRow(Napi::Env env, const char *fn, int type, int64_t n, size_t have, const char *what, size_t &bytes) {
  int be = prima_type_block_elems(type);
  if (n <= 0 || be <= 0 || n % be)
    return Fail(env, std::string(fn) + ": " + std::to_string(n) + " elements is not a whole number of " + TypeLabel(type) +
                         " blocks (" + std::to_string(be) + " elements each)");
  bytes = prima_row_bytes(type, n);
  if (have != bytes)
    return Fail(env, std::string(fn) + ": " + what + " holds " + std::to_string(have) + " bytes, a " + TypeLabel(type) +
                         " row of " + std::to_string(n) + " elements needs " + std::to_string(bytes));
  return true;
}

Napi::Value SimdLevel(const Napi::CallbackInfo &info) {
  return Napi::String::New(info.Env(), prima_simd_name(prima_simd_level()));
}

Napi::Value SimdLevels(const Napi::CallbackInfo &info) {
  Napi::Array a = Napi::Array::New(info.Env());
  uint32_t i = 0;
  for (int l = 0; l < 4; l++)
    if (prima_simd_available(l)) a.Set(i++, Napi::String::New(info.Env(), prima_simd_name(l)));
  return a;
}

// typeInfo(type, level?) -> { name, blockElems, blockBytes, actType, dotSimd, dotRows, gemm } or null
Napi::Value TypeInfo(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int64_t type;
  int level;
  if (!GetInt(env, info[0], "type", 0, PRIMA_TYPE_COUNT - 1, type) || !GetLevel(env, info[1], level)) return env.Undefined();
  const prima_type_kernels *k = prima_kernels_at((int)type, level);
  if (!k) return env.Null();
  Napi::Object o = Napi::Object::New(env);
  o.Set("name", k->name);
  o.Set("blockElems", k->block_elems);
  o.Set("blockBytes", k->block_bytes);
  o.Set("actType", k->act_type);
  o.Set("dotSimd", prima_simd_name(k->dot_simd));
  o.Set("dotRows", k->dot_rows != nullptr);
  o.Set("gemm", k->gemm != nullptr);
  return o;
}

Napi::Value RowBytes(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int64_t type, n;
  if (!GetInt(env, info[0], "type", 0, PRIMA_TYPE_COUNT - 1, type) || !GetInt(env, info[1], "n", 0, INT64_C(1) << 40, n))
    return env.Undefined();
  if (!prima_type_name((int)type)) return Fail(env, "rowBytes: " + TypeLabel((int)type) + " is not a known type"), env.Undefined();
  size_t b = prima_row_bytes((int)type, n);
  if (!b && n) {
    Fail(env, "rowBytes: " + std::to_string(n) + " elements is not a whole number of " + TypeLabel((int)type) + " blocks");
    return env.Undefined();
  }
  return Napi::Number::New(env, (double)b);
}

// quantizeRef(type, src: Float32Array, dst: Uint8Array): llama.cpp's quantize_row_*_ref.
Napi::Value QuantizeRef(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  const prima_type_kernels *k;
  Bytes src, dst;
  size_t bytes;
  if (!GetKernels(env, info[0], PRIMA_SIMD_SCALAR, "quantizeRef", k) ||
      !GetTyped(env, info[1], napi_float32_array, "quantizeRef: src", src, true) ||
      !GetTyped(env, info[2], napi_uint8_array, "quantizeRef: dst", dst, false))
    return env.Undefined();
  int64_t n = (int64_t)(src.length / 4);
  if (!k->quantize_ref) return Fail(env, std::string("quantizeRef: no reference quantizer for ") + k->name), env.Undefined();
  if (!CheckRow(env, "quantizeRef", k->type, n, dst.length, "dst", bytes)) return env.Undefined();
  k->quantize_ref(reinterpret_cast<const float *>(src.data), dst.data, n);
  dst.CopyOut();
  return env.Undefined();
}

// dequantize(type, src: Uint8Array, dst: Float32Array, level?). Also accepts the activation formats.
Napi::Value Dequantize(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int level;
  int64_t type;
  Bytes src, dst;
  size_t bytes;
  if (!GetLevel(env, info[3], level) || !GetInt(env, info[0], "type", 0, PRIMA_TYPE_COUNT - 1, type) ||
      !GetTyped(env, info[1], napi_uint8_array, "dequantize: src", src, true) ||
      !GetTyped(env, info[2], napi_float32_array, "dequantize: dst", dst, false))
    return env.Undefined();
  prima_dequantize_fn fn = prima_dequantizer_at((int)type, level);
  if (!fn) return Fail(env, "dequantize: " + TypeLabel((int)type) + " has no dequantizer"), env.Undefined();
  int64_t n = (int64_t)(dst.length / 4);
  if (!CheckRow(env, "dequantize", (int)type, n, src.length, "src", bytes)) return env.Undefined();
  fn(src.data, reinterpret_cast<float *>(dst.data), n);
  dst.CopyOut();
  return env.Undefined();
}

// quantizeAct(actType, src: Float32Array, dst: Uint8Array, level?): activation formats for the dots.
Napi::Value QuantizeAct(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int level;
  int64_t type;
  Bytes src, dst;
  size_t bytes;
  if (!GetLevel(env, info[3], level) || !GetInt(env, info[0], "actType", 0, PRIMA_TYPE_COUNT - 1, type) ||
      !GetTyped(env, info[1], napi_float32_array, "quantizeAct: src", src, true) ||
      !GetTyped(env, info[2], napi_uint8_array, "quantizeAct: dst", dst, false))
    return env.Undefined();
  prima_quantize_fn fn = prima_act_quantizer_at((int)type, level);
  if (!fn) return Fail(env, "quantizeAct: " + TypeLabel((int)type) + " is not an activation format"), env.Undefined();
  int64_t n = (int64_t)(src.length / 4);
  if (!CheckRow(env, "quantizeAct", (int)type, n, dst.length, "dst", bytes)) return env.Undefined();
  fn(reinterpret_cast<const float *>(src.data), dst.data, n);
  dst.CopyOut();
  return env.Undefined();
}

struct DotArgs {
  const prima_type_kernels *k;
  int64_t n, stride, nc;
  Bytes w, a;
  size_t wRow, aRow;
};

// Shared checks of dot/benchDot: weights hold `rows` rows, activations nc rows `stride` bytes apart.
bool GetDotArgs(Napi::Env env, const Napi::CallbackInfo &info, const char *fn, int level, int64_t rows, DotArgs &d) {
  if (!GetKernels(env, info[0], level, fn, d.k) || !GetInt(env, info[1], "n", 1, INT32_MAX, d.n) ||
      !GetTyped(env, info[2], napi_uint8_array, "w", d.w, true) ||
      !GetTyped(env, info[3], napi_uint8_array, "a", d.a, true) ||
      !GetInt(env, info[4], "aStride", 0, INT64_C(1) << 40, d.stride) ||
      !GetInt(env, info[5], "nc", 1, PRIMA_MAX_NC, d.nc))
    return false;
  if (!CheckRow(env, fn, d.k->type, d.n, d.w.length / (size_t)rows, "a weight row", d.wRow)) return false;
  if (d.w.length != d.wRow * (size_t)rows)
    return Fail(env, std::string(fn) + ": w holds " + std::to_string(d.w.length) + " bytes, " + std::to_string(rows) +
                         " rows need " + std::to_string(d.wRow * rows));
  d.aRow = prima_row_bytes(d.k->act_type, d.n);
  if ((size_t)d.stride < d.aRow)
    return Fail(env, std::string(fn) + ": aStride " + std::to_string(d.stride) + " is shorter than an activation row (" +
                         std::to_string(d.aRow) + " bytes of " + TypeLabel(d.k->act_type) + ")");
  size_t need = (size_t)(d.nc - 1) * (size_t)d.stride + d.aRow;
  if (d.a.length < need)
    return Fail(env, std::string(fn) + ": a holds " + std::to_string(d.a.length) + " bytes, " + std::to_string(d.nc) +
                         " activation rows need " + std::to_string(need));
  return true;
}

// dot(type, n, w: Uint8Array, a: Uint8Array, aStride, nc, out: Float32Array, level?)
Napi::Value Dot(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int level;
  DotArgs d;
  Bytes out;
  if (!GetLevel(env, info[7], level) || !GetDotArgs(env, info, "dot", level, 1, d) ||
      !GetTyped(env, info[6], napi_float32_array, "dot: out", out, false))
    return env.Undefined();
  if (out.length < (size_t)d.nc * 4) return Fail(env, "dot: out holds fewer than nc floats"), env.Undefined();
  d.k->dot((int)d.n, d.w.data, d.a.data, (size_t)d.stride, (int)d.nc, reinterpret_cast<float *>(out.data));
  out.CopyOut();
  return env.Undefined();
}

// dotRows(type, n, w: Uint8Array, wStride, nr, a: Uint8Array, out: Float32Array, level?): out[r] = dot(weight row r,
// activation row a) for nr weight rows wStride bytes apart (the level's rows kernel, or its dot row by row).
Napi::Value DotRows(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int level;
  int64_t n, wStride, nr;
  const prima_type_kernels *k;
  Bytes w, a, out;
  if (!GetLevel(env, info[7], level) || !GetKernels(env, info[0], level, "dotRows", k) ||
      !GetInt(env, info[1], "n", 1, INT32_MAX, n) || !GetTyped(env, info[2], napi_uint8_array, "w", w, true) ||
      !GetInt(env, info[3], "wStride", 0, INT64_C(1) << 40, wStride) || !GetInt(env, info[4], "nr", 1, 1 << 20, nr) ||
      !GetTyped(env, info[5], napi_uint8_array, "a", a, true) ||
      !GetTyped(env, info[6], napi_float32_array, "dotRows: out", out, false))
    return env.Undefined();
  size_t wRow, aRow;
  if (!CheckRow(env, "dotRows", k->type, n, prima_row_bytes(k->type, n), "a weight row", wRow) ||
      !CheckRow(env, "dotRows", k->act_type, n, a.length, "a", aRow))
    return env.Undefined();
  if ((size_t)wStride < wRow)
    return Fail(env, "dotRows: wStride " + std::to_string(wStride) + " is shorter than a weight row (" + std::to_string(wRow) +
                         " bytes of " + TypeLabel(k->type) + ")"), env.Undefined();
  const size_t need = (size_t)(nr - 1) * (size_t)wStride + wRow;
  if (w.length < need)
    return Fail(env, "dotRows: w holds " + std::to_string(w.length) + " bytes, " + std::to_string(nr) + " rows need " +
                         std::to_string(need)), env.Undefined();
  if (out.length < (size_t)nr * 4) return Fail(env, "dotRows: out holds fewer than nr floats"), env.Undefined();
  prima_dot_rows(k, (int)n, w.data, (size_t)wStride, (int)nr, a.data, reinterpret_cast<float *>(out.data));
  out.CopyOut();
  return env.Undefined();
}

// gemm(type, n, w: Uint8Array, wStride, nr, a: Uint8Array, aStride, nt, out: Float32Array, outStride, accumulate, level?):
// out[t * outStride + r] (+)= dot(weight row r, activation row t), a prompt's product (the level's gemm, or its dot).
Napi::Value Gemm(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int level;
  int64_t n, wStride, nr, aStride, nt, outStride;
  const prima_type_kernels *k;
  Bytes w, a, out;
  if (!GetLevel(env, info[11], level) || !GetKernels(env, info[0], level, "gemm", k) ||
      !GetInt(env, info[1], "n", 1, INT32_MAX, n) || !GetTyped(env, info[2], napi_uint8_array, "w", w, true) ||
      !GetInt(env, info[3], "wStride", 0, INT64_C(1) << 40, wStride) || !GetInt(env, info[4], "nr", 1, 1 << 20, nr) ||
      !GetTyped(env, info[5], napi_uint8_array, "a", a, true) ||
      !GetInt(env, info[6], "aStride", 0, INT64_C(1) << 40, aStride) || !GetInt(env, info[7], "nt", 1, 1 << 20, nt) ||
      !GetTyped(env, info[8], napi_float32_array, "gemm: out", out, true) ||
      !GetInt(env, info[9], "outStride", 0, INT64_C(1) << 40, outStride))
    return env.Undefined();
  if (!info[10].IsBoolean()) return Fail(env, "gemm: accumulate must be a boolean"), env.Undefined();
  size_t wRow, aRow;
  if (!CheckRow(env, "gemm", k->type, n, prima_row_bytes(k->type, n), "a weight row", wRow) ||
      !CheckRow(env, "gemm", k->act_type, n, prima_row_bytes(k->act_type, n), "an activation row", aRow))
    return env.Undefined();
  if ((size_t)wStride < wRow || (size_t)aStride < aRow || outStride < nr)
    return Fail(env, "gemm: a stride is shorter than its row (wStride " + std::to_string(wStride) + " < " + std::to_string(wRow) +
                         ", aStride " + std::to_string(aStride) + " < " + std::to_string(aRow) + " or outStride " +
                         std::to_string(outStride) + " < nr " + std::to_string(nr) + ")"), env.Undefined();
  if (w.length < (size_t)(nr - 1) * (size_t)wStride + wRow || a.length < (size_t)(nt - 1) * (size_t)aStride + aRow ||
      out.length / 4 < (size_t)(nt - 1) * (size_t)outStride + (size_t)nr)
    return Fail(env, "gemm: w, a or out is shorter than nr rows, nt activation rows or nt output rows need"), env.Undefined();
  prima_gemm(k, (int)n, w.data, (size_t)wStride, (int)nr, a.data, (size_t)aStride, (int)nt, reinterpret_cast<float *>(out.data),
             (size_t)outStride, info[10].As<Napi::Boolean>().Value());
  out.CopyOut();
  return env.Undefined();
}

// kvStore(type, x: Float32Array, dst: Uint8Array): one cache row, quantized as a window writes it.
Napi::Value KvStore(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int64_t type;
  Bytes x, dst;
  if (!GetInt(env, info[0], "type", 0, PRIMA_TYPE_COUNT - 1, type) || !GetTyped(env, info[1], napi_float32_array, "x", x, true) ||
      !GetTyped(env, info[2], napi_uint8_array, "dst", dst, false))
    return env.Undefined();
  if (!prima_kv_type_ok((int)type)) return Fail(env, "kvStore: " + TypeLabel((int)type) + " is not a KV cache type"), env.Undefined();
  size_t bytes;
  if (!CheckRow(env, "kvStore", (int)type, (int64_t)(x.length / 4), dst.length, "dst", bytes)) return env.Undefined();
  prima_kv_store((int)type, reinterpret_cast<const float *>(x.data), dst.data, (int)(x.length / 4));
  dst.CopyOut();
  return env.Undefined();
}

// kvAttend(kType, vType, k: Uint8Array, v: Uint8Array, nPos, ratio, d, q: Float32Array, scale, softcap, out: Float32Array,
// level?): the attention of ratio query heads over nPos cached rows of one KV head (rows back to back), as a window's
// attention computes it at that level.
Napi::Value KvAttend(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int64_t kt, vt, nPos, ratio, d;
  int level;
  Bytes k, v, q, out;
  if (!GetInt(env, info[0], "kType", 0, PRIMA_TYPE_COUNT - 1, kt) || !GetInt(env, info[1], "vType", 0, PRIMA_TYPE_COUNT - 1, vt) ||
      !GetTyped(env, info[2], napi_uint8_array, "k", k, true) || !GetTyped(env, info[3], napi_uint8_array, "v", v, true) ||
      !GetInt(env, info[4], "nPos", 1, 1 << 20, nPos) || !GetInt(env, info[5], "ratio", 1, 64, ratio) ||
      !GetInt(env, info[6], "d", 1, 1024, d) || !GetTyped(env, info[7], napi_float32_array, "q", q, true) ||
      !info[8].IsNumber() || !info[9].IsNumber() || !GetTyped(env, info[10], napi_float32_array, "out", out, false) ||
      !GetLevel(env, info[11], level))
    return env.Undefined();
  const char *why = prima_kv_type_problem((int)kt, (int)d);
  if (!why) why = prima_kv_type_problem((int)vt, (int)d);
  if (why) return Fail(env, std::string("kvAttend: a cache type ") + why), env.Undefined();
  const size_t kRow = prima_row_bytes((int)kt, d), vRow = prima_row_bytes((int)vt, d);
  if (k.length != kRow * (size_t)nPos || v.length != vRow * (size_t)nPos || q.length != 4 * (size_t)(ratio * d) ||
      out.length != 4 * (size_t)(ratio * d))
    return Fail(env, "kvAttend: k, v must hold nPos rows of their type, q and out ratio x d floats"), env.Undefined();
  std::vector<uint8_t> scratch(prima_kv_attend_scratch_bytes((int)ratio, (int)d) + 64);
  void *aligned = reinterpret_cast<void *>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t(63));
  const prima_kv_head K = {(int)kt, k.data, kRow, 0}, V = {(int)vt, v.data, vRow, 0};
  prima_kv_attend(&K, &V, reinterpret_cast<const float *>(q.data), (int)ratio, (int)d, 0, (int)nPos,
                  (float)info[8].As<Napi::Number>().DoubleValue(), (float)info[9].As<Napi::Number>().DoubleValue(), nullptr,
                  reinterpret_cast<float *>(out.data), aligned, level);
  out.CopyOut();
  return env.Undefined();
}

// kvAttendRows(kType, vType, k, v, pos0, nTok, ratio, d, q, scale, softcap, window, out, level?): the attention of nTok
// consecutive tokens at pos0.. (their ratio query heads each, nTok x ratio x d floats) over the causal rows of one KV head
// (pos0 + nTok rows back to back), as a window's batch computes it at that level: tiled (attn_tile.c) where the tile
// takes the cache, else row by row. Returns whether it ran tiled.
Napi::Value KvAttendRows(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int64_t kt, vt, pos0, nTok, ratio, d, window;
  int level;
  Bytes k, v, q, out;
  if (!GetInt(env, info[0], "kType", 0, PRIMA_TYPE_COUNT - 1, kt) || !GetInt(env, info[1], "vType", 0, PRIMA_TYPE_COUNT - 1, vt) ||
      !GetTyped(env, info[2], napi_uint8_array, "k", k, true) || !GetTyped(env, info[3], napi_uint8_array, "v", v, true) ||
      !GetInt(env, info[4], "pos0", 0, 1 << 20, pos0) || !GetInt(env, info[5], "nTok", 1, 1 << 12, nTok) ||
      !GetInt(env, info[6], "ratio", 1, 64, ratio) || !GetInt(env, info[7], "d", 1, 1024, d) ||
      !GetTyped(env, info[8], napi_float32_array, "q", q, true) || !info[9].IsNumber() || !info[10].IsNumber() ||
      !GetInt(env, info[11], "window", 0, 1 << 20, window) || !GetTyped(env, info[12], napi_float32_array, "out", out, false) ||
      !GetLevel(env, info[13], level))
    return env.Undefined();
  const char *why = prima_kv_type_problem((int)kt, (int)d);
  if (!why) why = prima_kv_type_problem((int)vt, (int)d);
  if (why) return Fail(env, std::string("kvAttendRows: a cache type ") + why), env.Undefined();
  const size_t kRow = prima_row_bytes((int)kt, d), vRow = prima_row_bytes((int)vt, d), n = (size_t)(pos0 + nTok), qdim = (size_t)(ratio * d);
  if (k.length != kRow * n || v.length != vRow * n || q.length != 4 * qdim * (size_t)nTok || out.length != q.length)
    return Fail(env, "kvAttendRows: k, v must hold pos0 + nTok rows of their type, q and out nTok x ratio x d floats"), env.Undefined();
  const prima_kv_head K = {(int)kt, k.data, kRow, 0}, V = {(int)vt, v.data, vRow, 0};
  const float scale = (float)info[9].As<Napi::Number>().DoubleValue(), softcap = (float)info[10].As<Napi::Number>().DoubleValue();
  const float *qf = reinterpret_cast<const float *>(q.data);
  float *of = reinterpret_cast<float *>(out.data);
  const bool tiled = prima_kv_tile_ok(&K, &V, (int)d, level);
  const size_t bytes = tiled ? prima_kv_tile_scratch_bytes((int)ratio, (int)d) : prima_kv_attend_scratch_bytes((int)ratio, (int)d);
  std::vector<uint8_t> scratch(bytes + 64);
  void *aligned = reinterpret_cast<void *>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t(63));
  const int per = prima_kv_tile_tokens((int)ratio);
  for (int t0 = 0; t0 < nTok; t0 += tiled ? per : 1) {
    const int nt = tiled ? std::min<int>(per, (int)nTok - t0) : 1, hi = (int)pos0 + t0 + 1;
    if (tiled)
      prima_kv_attend_tile(&K, &V, qf + t0 * qdim, qdim, nt, (int)pos0 + t0, (int)window, (int)ratio, (int)d, scale, softcap, nullptr,
                           of + t0 * qdim, aligned);
    else
      prima_kv_attend(&K, &V, qf + t0 * qdim, (int)ratio, (int)d, window > 0 && hi > window ? hi - (int)window : 0, hi, scale, softcap,
                      nullptr, of + t0 * qdim, aligned, level);
  }
  out.CopyOut();
  return Napi::Boolean::New(env, tiled);
}

// {window, sinks, logStride, block} as sparse attention's settings, checked by prima_sparse_problem.
static bool GetSparse(Napi::Env env, const Napi::Value &v, prima_sparse_cfg &c) {
  if (!v.IsObject()) return Fail(env, "sparse settings must be {window, sinks, logStride, block}");
  Napi::Object o = v.As<Napi::Object>();
  int64_t w, s, b;
  if (!GetInt(env, o.Get("window"), "sparse.window", 1, 1 << 22, w) || !GetInt(env, o.Get("sinks"), "sparse.sinks", 0, 1 << 22, s) ||
      !GetInt(env, o.Get("block"), "sparse.block", 0, 1 << 22, b))
    return false;
  if (!o.Get("logStride").IsBoolean()) return Fail(env, "sparse.logStride must be a boolean");
  c = {(int)w, (int)s, o.Get("logStride").As<Napi::Boolean>().Value() ? 1 : 0, (int)b};
  const char *why = prima_sparse_problem(&c);
  return why ? Fail(env, std::string("sparse: ") + why) : true;
}

// sparseSelect(sparse, i): {sinkEnd, windowStart, rungs: number[], blocks}: what a query at position i sees (prima_sparse_select).
Napi::Value SparseSelect(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  prima_sparse_cfg c;
  int64_t i;
  if (!GetSparse(env, info[0], c) || !GetInt(env, info[1], "i", 0, 1 << 30, i)) return env.Undefined();
  int sink_end, wlo, n_blocks, rungs[PRIMA_SPARSE_MAX_RUNGS];
  const int n = prima_sparse_select(&c, (int)i, &sink_end, &wlo, rungs, &n_blocks);
  Napi::Object o = Napi::Object::New(env);
  Napi::Array r = Napi::Array::New(env, n);
  for (int j = 0; j < n; j++) r.Set(j, rungs[j]);
  o.Set("sinkEnd", sink_end);
  o.Set("windowStart", wlo);
  o.Set("rungs", r);
  o.Set("blocks", n_blocks);
  return o;
}

// sparseLandmarks(kType, vType, k, v, nBlocks, d, block, lmK: Float32Array, lmV: Float32Array): the landmarks of blocks
// [0, nBlocks) of one KV head's rows (back to back), nBlocks x d floats each, as a window keeps them.
Napi::Value SparseLandmarks(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int64_t kt, vt, nb, d, block;
  Bytes k, v, lk, lv;
  if (!GetInt(env, info[0], "kType", 0, PRIMA_TYPE_COUNT - 1, kt) || !GetInt(env, info[1], "vType", 0, PRIMA_TYPE_COUNT - 1, vt) ||
      !GetTyped(env, info[2], napi_uint8_array, "k", k, true) || !GetTyped(env, info[3], napi_uint8_array, "v", v, true) ||
      !GetInt(env, info[4], "nBlocks", 0, 1 << 20, nb) || !GetInt(env, info[5], "d", 1, 1024, d) ||
      !GetInt(env, info[6], "block", 2, 1 << 20, block) || !GetTyped(env, info[7], napi_float32_array, "lmK", lk, false) ||
      !GetTyped(env, info[8], napi_float32_array, "lmV", lv, false))
    return env.Undefined();
  const char *why = prima_kv_type_problem((int)kt, (int)d);
  if (!why) why = prima_kv_type_problem((int)vt, (int)d);
  if (why) return Fail(env, std::string("sparseLandmarks: a cache type ") + why), env.Undefined();
  const size_t kRow = prima_row_bytes((int)kt, d), vRow = prima_row_bytes((int)vt, d), rows = (size_t)(nb * block);
  if (k.length < kRow * rows || v.length < vRow * rows || lk.length != 4 * (size_t)(nb * d) || lv.length != 4 * (size_t)(nb * d))
    return Fail(env, "sparseLandmarks: k, v must hold nBlocks x block rows, lmK and lmV nBlocks x d floats"), env.Undefined();
  const prima_kv_head K = {(int)kt, k.data, kRow, 0}, V = {(int)vt, v.data, vRow, 0};
  float *mk = reinterpret_cast<float *>(lk.data), *mv = reinterpret_cast<float *>(lv.data);
  for (int b = 0; b < (int)nb; b++) prima_sparse_landmark(&K, &V, b * (int)block, (int)block, (int)d, mk + (size_t)b * d, mv + (size_t)b * d);
  lk.CopyOut();
  lv.CopyOut();
  return env.Undefined();
}

// kvAttendSparse(kType, vType, k, v, i, ratio, d, q, scale, softcap, sparse, lmK, lmV, out, level?): the sparse attention of a
// query at position i over rows 0..i of one KV head (back to back), the landmarks those sparseLandmarks makes.
Napi::Value KvAttendSparse(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int64_t kt, vt, i, ratio, d;
  int level;
  prima_sparse_cfg c;
  Bytes k, v, q, lk, lv, out;
  if (!GetInt(env, info[0], "kType", 0, PRIMA_TYPE_COUNT - 1, kt) || !GetInt(env, info[1], "vType", 0, PRIMA_TYPE_COUNT - 1, vt) ||
      !GetTyped(env, info[2], napi_uint8_array, "k", k, true) || !GetTyped(env, info[3], napi_uint8_array, "v", v, true) ||
      !GetInt(env, info[4], "i", 0, 1 << 22, i) || !GetInt(env, info[5], "ratio", 1, 64, ratio) ||
      !GetInt(env, info[6], "d", 1, 1024, d) || !GetTyped(env, info[7], napi_float32_array, "q", q, true) ||
      !info[8].IsNumber() || !info[9].IsNumber() || !GetSparse(env, info[10], c) ||
      !GetTyped(env, info[11], napi_float32_array, "lmK", lk, true) || !GetTyped(env, info[12], napi_float32_array, "lmV", lv, true) ||
      !GetTyped(env, info[13], napi_float32_array, "out", out, false) || !GetLevel(env, info[14], level))
    return env.Undefined();
  const char *why = prima_kv_type_problem((int)kt, (int)d);
  if (!why) why = prima_kv_type_problem((int)vt, (int)d);
  if (why) return Fail(env, std::string("kvAttendSparse: a cache type ") + why), env.Undefined();
  const size_t kRow = prima_row_bytes((int)kt, d), vRow = prima_row_bytes((int)vt, d), nPos = (size_t)i + 1;
  int sink_end, wlo, n_blocks, rungs[PRIMA_SPARSE_MAX_RUNGS];
  prima_sparse_select(&c, (int)i, &sink_end, &wlo, rungs, &n_blocks);
  if (k.length < kRow * nPos || v.length < vRow * nPos || q.length != 4 * (size_t)(ratio * d) || out.length != 4 * (size_t)(ratio * d) ||
      lk.length < 4 * (size_t)n_blocks * d || lv.length < 4 * (size_t)n_blocks * d)
    return Fail(env, "kvAttendSparse: k, v must hold i + 1 rows, q and out ratio x d floats, lmK and lmV the landmarks below the window"),
           env.Undefined();
  std::vector<uint8_t> scratch(prima_kv_attend_scratch_bytes((int)ratio, (int)d) + 64);
  void *aligned = reinterpret_cast<void *>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t(63));
  const prima_kv_head K = {(int)kt, k.data, kRow, 0}, V = {(int)vt, v.data, vRow, 0};
  prima_sparse_attend(&c, &K, &V, reinterpret_cast<const float *>(lk.data), reinterpret_cast<const float *>(lv.data),
                      reinterpret_cast<const float *>(q.data), (int)ratio, (int)d, (int)i, (float)info[8].As<Napi::Number>().DoubleValue(),
                      (float)info[9].As<Napi::Number>().DoubleValue(), nullptr, reinterpret_cast<float *>(out.data), aligned, level);
  out.CopyOut();
  return env.Undefined();
}

// kvAttendBench(kType, vType, k, v, i, ratio, d, q, scale, sparse | null, lmK, lmV, minSeconds): microseconds one query's
// attention at position i takes (dense over rows 0..i, or sparse with those settings and landmarks), timed in a loop here
// so that no copy of the arguments counts.
Napi::Value KvAttendBench(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int64_t kt, vt, i, ratio, d;
  prima_sparse_cfg c = {0, 0, 0, 0};
  Bytes k, v, q, lk, lv;
  if (!GetInt(env, info[0], "kType", 0, PRIMA_TYPE_COUNT - 1, kt) || !GetInt(env, info[1], "vType", 0, PRIMA_TYPE_COUNT - 1, vt) ||
      !GetTyped(env, info[2], napi_uint8_array, "k", k, true) || !GetTyped(env, info[3], napi_uint8_array, "v", v, true) ||
      !GetInt(env, info[4], "i", 0, 1 << 22, i) || !GetInt(env, info[5], "ratio", 1, 64, ratio) ||
      !GetInt(env, info[6], "d", 1, 1024, d) || !GetTyped(env, info[7], napi_float32_array, "q", q, true) || !info[8].IsNumber() ||
      (!info[9].IsNull() && !GetSparse(env, info[9], c)) ||
      !GetTyped(env, info[10], napi_float32_array, "lmK", lk, true) || !GetTyped(env, info[11], napi_float32_array, "lmV", lv, true) ||
      !info[12].IsNumber())
    return env.Undefined();
  const char *why = prima_kv_type_problem((int)kt, (int)d);
  if (!why) why = prima_kv_type_problem((int)vt, (int)d);
  if (why) return Fail(env, std::string("kvAttendBench: a cache type ") + why), env.Undefined();
  const size_t kRow = prima_row_bytes((int)kt, d), vRow = prima_row_bytes((int)vt, d), nPos = (size_t)i + 1;
  int sink_end, wlo, n_blocks = 0, rungs[PRIMA_SPARSE_MAX_RUNGS];
  if (c.window > 0) prima_sparse_select(&c, (int)i, &sink_end, &wlo, rungs, &n_blocks);
  if (k.length < kRow * nPos || v.length < vRow * nPos || q.length != 4 * (size_t)(ratio * d) || lk.length < 4 * (size_t)n_blocks * d ||
      lv.length < 4 * (size_t)n_blocks * d)
    return Fail(env, "kvAttendBench: k, v must hold i + 1 rows, q ratio x d floats, lmK and lmV the landmarks below the window"), env.Undefined();
  std::vector<uint8_t> scratch(prima_kv_attend_scratch_bytes((int)ratio, (int)d) + 64);
  void *aligned = reinterpret_cast<void *>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t(63));
  std::vector<float> out((size_t)(ratio * d));
  const prima_kv_head K = {(int)kt, k.data, kRow, 0}, V = {(int)vt, v.data, vRow, 0};
  const float scale = (float)info[8].As<Napi::Number>().DoubleValue();
  const double min_s = info[12].As<Napi::Number>().DoubleValue();
  const int level = prima_simd_level();
  int64_t n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double el = 0;
  do {
    if (c.window > 0)
      prima_sparse_attend(&c, &K, &V, reinterpret_cast<const float *>(lk.data), reinterpret_cast<const float *>(lv.data),
                          reinterpret_cast<const float *>(q.data), (int)ratio, (int)d, (int)i, scale, 0, nullptr, out.data(), aligned, level);
    else
      prima_kv_attend(&K, &V, reinterpret_cast<const float *>(q.data), (int)ratio, (int)d, 0, (int)nPos, scale, 0, nullptr, out.data(),
                      aligned, level);
    n++;
    el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (el < min_s);
  return Napi::Number::New(env, el * 1e6 / (double)n);
}

// All threads of a benchmark wait here between passes (spinning: a pass can be microseconds).
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void Wait() {
    const int gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_release);
    } else {
      while (gen_.load(std::memory_order_acquire) == gen) {
      }
    }
  }

 private:
  const int n_;
  std::atomic<int> count_{0}, gen_{0};
};

// benchDot(type, n, w, a, aStride, nc, rows, minSeconds, level?, threads?) -> { calls, seconds, bestPassSeconds }:
// runs the dot over every row of w (nc activation rows each), pass after pass, until minSeconds pass; times
// only the C loop. With threads > 1 each pass splits the rows into contiguous slices, one per thread (how a
// matmul streams a weight matrix). The fastest pass is the least disturbed by other work on a shared machine.
Napi::Value BenchDot(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int level;
  int64_t rows, threads = 1;
  DotArgs d;
  if (!GetLevel(env, info[8], level) || !GetInt(env, info[6], "rows", 1, INT32_MAX, rows) ||
      !GetDotArgs(env, info, "benchDot", level, rows, d))
    return env.Undefined();
  if (!info[7].IsNumber()) return Fail(env, "benchDot: minSeconds must be a number"), env.Undefined();
  if (!info[9].IsUndefined() && !GetInt(env, info[9], "threads", 1, 64, threads)) return env.Undefined();
  if (threads > rows) threads = rows;
  const double minSeconds = info[7].As<Napi::Number>().DoubleValue();
  SpinBarrier barrier((int)threads);
  std::atomic<bool> stop{false};
  int64_t calls = 0;
  double seconds = 0, best = 1e30;
  auto work = [&](int t) {
    const int64_t r0 = rows * t / threads, r1 = rows * (t + 1) / threads;
    float out[PRIMA_MAX_NC];
    volatile float sink = 0;
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      barrier.Wait();
      const auto p0 = std::chrono::steady_clock::now();
      for (int64_t r = r0; r < r1; r++) {
        d.k->dot((int)d.n, d.w.data + r * d.wRow, d.a.data, (size_t)d.stride, (int)d.nc, out);
        sink = sink + out[0];
      }
      barrier.Wait();
      if (t == 0) {
        const auto p1 = std::chrono::steady_clock::now();
        best = std::min(best, std::chrono::duration<double>(p1 - p0).count());
        calls += rows;
        seconds = std::chrono::duration<double>(p1 - start).count();
        stop.store(seconds >= minSeconds);
      }
      barrier.Wait();
      if (stop.load()) break;
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; t++) helpers.emplace_back(work, t);
  work(0);
  for (auto &h : helpers) h.join();
  Napi::Object o = Napi::Object::New(env);
  o.Set("calls", (double)calls);
  o.Set("seconds", seconds);
  o.Set("bestPassSeconds", best);
  return o;
}

// Half/bfloat16 conversions: fp32ToHalf(src, dst: Uint16Array, "f16"|"bf16"), halfToFp32(src, dst, kind).
bool GetHalfKind(Napi::Env env, const Napi::Value &v, bool &bf16) {
  std::string s = v.IsString() ? v.As<Napi::String>().Utf8Value() : "";
  if (s != "f16" && s != "bf16") return Fail(env, "kind must be 'f16' or 'bf16'");
  bf16 = s == "bf16";
  return true;
}

Napi::Value Fp32ToHalf(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Bytes src, dst;
  bool bf16;
  if (!GetTyped(env, info[0], napi_float32_array, "fp32ToHalf: src", src, true) ||
      !GetTyped(env, info[1], napi_uint16_array, "fp32ToHalf: dst", dst, false) || !GetHalfKind(env, info[2], bf16))
    return env.Undefined();
  size_t n = src.length / 4;
  if (dst.length != n * 2) return Fail(env, "fp32ToHalf: dst must have as many elements as src"), env.Undefined();
  const float *s = reinterpret_cast<const float *>(src.data);
  uint16_t *o = reinterpret_cast<uint16_t *>(dst.data);
  for (size_t i = 0; i < n; i++) o[i] = bf16 ? prima_fp32_to_bf16(s[i]) : prima_fp32_to_fp16(s[i]);
  dst.CopyOut();
  return env.Undefined();
}

// geglu(gate, up, level?): gate[i] = gelu(gate[i]) * up[i] in place, at a SIMD level (tests compare levels).
Napi::Value Geglu(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Bytes gate, up;
  int level;
  if (!GetTyped(env, info[0], napi_float32_array, "geglu: gate", gate, true) ||
      !GetTyped(env, info[1], napi_float32_array, "geglu: up", up, true) || !GetLevel(env, info[2], level))
    return env.Undefined();
  if (gate.length != up.length) return Fail(env, "geglu: gate and up must have as many elements"), env.Undefined();
  prima_ops_init();
  prima_geglu_at(level, reinterpret_cast<float *>(gate.data), reinterpret_cast<const float *>(up.data), (int)(gate.length / 4));
  gate.CopyOut();
  return env.Undefined();
}

Napi::Value HalfToFp32(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Bytes src, dst;
  bool bf16;
  if (!GetTyped(env, info[0], napi_uint16_array, "halfToFp32: src", src, true) ||
      !GetTyped(env, info[1], napi_float32_array, "halfToFp32: dst", dst, false) || !GetHalfKind(env, info[2], bf16))
    return env.Undefined();
  size_t n = src.length / 2;
  if (dst.length != n * 4) return Fail(env, "halfToFp32: dst must have as many elements as src"), env.Undefined();
  const uint16_t *s = reinterpret_cast<const uint16_t *>(src.data);
  float *o = reinterpret_cast<float *>(dst.data);
  for (size_t i = 0; i < n; i++) o[i] = bf16 ? prima_bf16_to_fp32(s[i]) : prima_fp16_to_fp32(s[i]);
  dst.CopyOut();
  return env.Undefined();
}

}  // namespace

void RegisterKernels(Napi::Env env, Napi::Object exports) {
  prima_kernels_init();
  Napi::Object k = Napi::Object::New(env);
  k.Set("simdLevel", Napi::Function::New(env, SimdLevel, "simdLevel"));
  k.Set("simdLevels", Napi::Function::New(env, SimdLevels, "simdLevels"));
  k.Set("typeInfo", Napi::Function::New(env, TypeInfo, "typeInfo"));
  k.Set("rowBytes", Napi::Function::New(env, RowBytes, "rowBytes"));
  k.Set("quantizeRef", Napi::Function::New(env, QuantizeRef, "quantizeRef"));
  k.Set("dequantize", Napi::Function::New(env, Dequantize, "dequantize"));
  k.Set("quantizeAct", Napi::Function::New(env, QuantizeAct, "quantizeAct"));
  k.Set("dot", Napi::Function::New(env, Dot, "dot"));
  k.Set("dotRows", Napi::Function::New(env, DotRows, "dotRows"));
  k.Set("gemm", Napi::Function::New(env, Gemm, "gemm"));
  k.Set("benchDot", Napi::Function::New(env, BenchDot, "benchDot"));
  k.Set("fp32ToHalf", Napi::Function::New(env, Fp32ToHalf, "fp32ToHalf"));
  k.Set("halfToFp32", Napi::Function::New(env, HalfToFp32, "halfToFp32"));
  k.Set("geglu", Napi::Function::New(env, Geglu, "geglu"));
  k.Set("kvStore", Napi::Function::New(env, KvStore, "kvStore"));
  k.Set("kvAttend", Napi::Function::New(env, KvAttend, "kvAttend"));
  k.Set("kvAttendRows", Napi::Function::New(env, KvAttendRows, "kvAttendRows"));
  k.Set("kvAttendSparse", Napi::Function::New(env, KvAttendSparse, "kvAttendSparse"));
  k.Set("sparseLandmarks", Napi::Function::New(env, SparseLandmarks, "sparseLandmarks"));
  k.Set("sparseSelect", Napi::Function::New(env, SparseSelect, "sparseSelect"));
  k.Set("kvAttendBench", Napi::Function::New(env, KvAttendBench, "kvAttendBench"));
  k.Set("maxNc", Napi::Number::New(env, PRIMA_MAX_NC));
  exports.Set("kernels", k);
}

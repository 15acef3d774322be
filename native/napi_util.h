// What every binding file (bind_*.cc) needs: JS errors with a message, and whole-number arguments
// checked against a range before they reach C.
#ifndef PRIMA_NAPI_UTIL_H
#define PRIMA_NAPI_UTIL_H

#include <napi.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace prima_napi {

constexpr size_t kErrLen = 512;

inline Napi::Value ThrowErr(Napi::Env env, const std::string &msg) {
  Napi::Error::New(env, msg).ThrowAsJavaScriptException();
  return env.Undefined();
}

inline Napi::Value ThrowType(Napi::Env env, const std::string &msg) {
  Napi::TypeError::New(env, msg).ThrowAsJavaScriptException();
  return env.Undefined();
}

/** v is a whole number in [lo, hi]: stores it and returns true. */
inline bool IntArg(const Napi::Value &v, int64_t lo, int64_t hi, int64_t *out) {
  if (!v.IsNumber()) return false;
  const double d = v.As<Napi::Number>().DoubleValue();
  if (!std::isfinite(d) || d != std::floor(d) || d < (double)lo || d > (double)hi) return false;
  *out = (int64_t)d;
  return true;
}

}  // namespace prima_napi

#endif

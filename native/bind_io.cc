// File I/O helpers for JS memory: direct I/O (O_DIRECT) needs buffers aligned to the disk's block,
// and JS allocates without a say in alignment, so this tells where the aligned part of a buffer starts.
#include <napi.h>

#include <cstdint>

namespace {

/* alignGap(view, align): bytes from the view's first byte to the first address that is a multiple of
 * align (a power of two). */
Napi::Value AlignGap(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsTypedArray() || !info[1].IsNumber()) {
    Napi::TypeError::New(env, "alignGap(view, align)").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Napi::TypedArray view = info[0].As<Napi::TypedArray>();
  const int64_t align = info[1].As<Napi::Number>().Int64Value();
  if (align <= 0 || (align & (align - 1)) != 0) {
    Napi::RangeError::New(env, "alignGap: align must be a power of two").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  napi_typedarray_type type;
  size_t length, offset;
  void *data = nullptr;
  napi_value ab;
  if (napi_get_typedarray_info(env, view, &type, &length, &data, &ab, &offset) != napi_ok || data == nullptr) {
    Napi::TypeError::New(env, "alignGap: the view has no memory").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  const uintptr_t a = reinterpret_cast<uintptr_t>(data);
  const uintptr_t gap = (static_cast<uintptr_t>(align) - (a & static_cast<uintptr_t>(align - 1))) & static_cast<uintptr_t>(align - 1);
  return Napi::Number::New(env, static_cast<double>(gap));
}

}  // namespace

void RegisterIo(Napi::Env env, Napi::Object exports) {
  Napi::Object io = Napi::Object::New(env);
  io.Set("alignGap", Napi::Function::New(env, AlignGap, "alignGap"));
  exports.Set("io", io);
}

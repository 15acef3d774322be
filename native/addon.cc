// Node entry point of the native core: each bind_*.cc registers its part of the surface.
#include <napi.h>

void RegisterKernels(Napi::Env env, Napi::Object exports);
void RegisterModel(Napi::Env env, Napi::Object exports);
void RegisterLane(Napi::Env env, Napi::Object exports);
void RegisterProfile(Napi::Env env, Napi::Object exports);
void RegisterIo(Napi::Env env, Napi::Object exports);

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  RegisterKernels(env, exports);
  RegisterModel(env, exports);
  RegisterLane(env, exports);
  RegisterProfile(env, exports);
  RegisterIo(env, exports);
  return exports;
}

NODE_API_MODULE(prima, Init)

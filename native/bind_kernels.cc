#include <napi.h>
void RegisterKernels(Napi::Env env, Napi::Object exports) {}

#include <napi.h>
void RegisterModel(Napi::Env env, Napi::Object exports) {}

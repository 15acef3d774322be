// What the model's binding (bind_model.cc) shares with the lane's (bind_lane.cc): the state a model
// and its windows hold together, the window object, the promise-returning worker, and checked
// unwrapping of a JS model or window.
#ifndef PRIMA_BIND_MODEL_H
#define PRIMA_BIND_MODEL_H

#include <napi.h>

#include <atomic>
#include <cstdint>
#include <memory>

extern "C" {
#include "model.h"
}

namespace prima_bind {

// Shared by a Model and its Windows, so whichever the garbage collector finalizes first, the C model
// is closed only after its last window.
struct ModelState {
  prima_model *m = nullptr;
  std::atomic<int> busy{0};
  std::atomic<int> windows{0};
  ~ModelState() {
    if (m) prima_model_close(m);
  }
};

class Window : public Napi::ObjectWrap<Window> {
 public:
  static Napi::Function Define(Napi::Env env);
  explicit Window(const Napi::CallbackInfo &info);
  ~Window() override { Free(); }

  prima_window *w = nullptr;
  std::shared_ptr<ModelState> st;
  std::atomic<int> busy{0};

  void Free();

 private:
  Napi::Value Forward(const Napi::CallbackInfo &info);
  Napi::Value ForwardNow(const Napi::CallbackInfo &info);
  Napi::Value ForwardSeqs(const Napi::CallbackInfo &info);
  bool ForwardArgs(const Napi::CallbackInfo &info, int64_t *pos, int64_t *n, Napi::Value *logits);
  Napi::Value Prefetch(const Napi::CallbackInfo &info);
  Napi::Value Release(const Napi::CallbackInfo &info);
  Napi::Value StreamBeyond(const Napi::CallbackInfo &info);
  Napi::Value ExpertPrefetch(const Napi::CallbackInfo &info);
  Napi::Value Residency(const Napi::CallbackInfo &info);
  Napi::Value ExpertResidency(const Napi::CallbackInfo &info);
  Napi::Value ExpertsRandom(const Napi::CallbackInfo &info);
  Napi::Value KvClear(const Napi::CallbackInfo &info);
  Napi::Value KvTruncate(const Napi::CallbackInfo &info);
  Napi::Value KvResumable(const Napi::CallbackInfo &info);
  Napi::Value KvShift(const Napi::CallbackInfo &info);
  Napi::Value H2oScores(const Napi::CallbackInfo &info);
  Napi::Value KvSave(const Napi::CallbackInfo &info);
  Napi::Value KvLoad(const Napi::CallbackInfo &info);
  Napi::Value Info(const Napi::CallbackInfo &info);
  Napi::Value Close(const Napi::CallbackInfo &info);
  bool Alive(Napi::Env env);
};

// An AsyncWorker whose result is a promise; Done() runs on the JS thread before it settles.
class PromiseWorker : public Napi::AsyncWorker {
 public:
  explicit PromiseWorker(Napi::Env env) : Napi::AsyncWorker(env), deferred(Napi::Promise::Deferred::New(env)) {}
  void OnOK() override {
    Done();
    deferred.Resolve(Env().Undefined());
  }
  void OnError(const Napi::Error &e) override {
    Done();
    deferred.Reject(e.Value());
  }
  Napi::Promise Promise() { return deferred.Promise(); }

 protected:
  virtual void Done() = 0;

 private:
  Napi::Promise::Deferred deferred;
};

// The state of v when it is a NativeModel (open or closed), else null: unwrapping another kind of
// object as a model would read it as the wrong C++ type.
std::shared_ptr<ModelState> ModelStateOf(const Napi::Value &v);
// v as a NativeWindow, else null.
Window *WindowOf(const Napi::Value &v);
// kvShift(p0, nDiscard, nPast)'s arguments (native/src/kv_shift.h), checked.
bool ShiftArgs(const Napi::CallbackInfo &info, int64_t *p0, int64_t *d, int64_t *n_past);

}  // namespace prima_bind

#endif

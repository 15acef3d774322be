// JS surface of the model and its windows (native/model.ts types it). Every argument is checked here
// before it reaches C: a wrong length or an out-of-range id is a JS exception, never a crash.
#include <napi.h>

#include "napi_util.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

extern "C" {
#include "kernels.h"
#include "kv_cache.h"
#include "kv_shift.h"
#include "lane.h"
#include "model.h"
}

namespace {

using prima_napi::IntArg;
using prima_napi::kErrLen;
using prima_napi::ThrowErr;
using prima_napi::ThrowType;

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
  Napi::Value Residency(const Napi::CallbackInfo &info);
  Napi::Value KvClear(const Napi::CallbackInfo &info);
  Napi::Value KvTruncate(const Napi::CallbackInfo &info);
  Napi::Value KvResumable(const Napi::CallbackInfo &info);
  Napi::Value KvShift(const Napi::CallbackInfo &info);
  Napi::Value KvSave(const Napi::CallbackInfo &info);
  Napi::Value H2oScores(const Napi::CallbackInfo &info);
  Napi::Value KvLoad(const Napi::CallbackInfo &info);
  Napi::Value Info(const Napi::CallbackInfo &info);
  Napi::Value Close(const Napi::CallbackInfo &info);
  bool Alive(Napi::Env env);
};

class Model : public Napi::ObjectWrap<Model> {
 public:
  static Napi::Function Define(Napi::Env env);
  explicit Model(const Napi::CallbackInfo &info);
  ~Model() override { Free(); }

  std::shared_ptr<ModelState> st = std::make_shared<ModelState>();
  static Napi::FunctionReference windowCtor;

  void Free() {}

 private:
  Napi::Value MakeWindow(const Napi::CallbackInfo &info);
  Napi::Value Embed(const Napi::CallbackInfo &info);
  Napi::Value Relax(const Napi::CallbackInfo &info);
  Napi::Value Prewake(const Napi::CallbackInfo &info);
  Napi::Value Logits(const Napi::CallbackInfo &info);
  Napi::Value OutputNorm(const Napi::CallbackInfo &info);
  Napi::Value FileProblem(const Napi::CallbackInfo &info);
  Napi::Value Close(const Napi::CallbackInfo &info);
};

Napi::FunctionReference Model::windowCtor;

// ---- async work -------------------------------------------------------------------------------

// Runs a forward pass (or a head-only pass) on a libuv thread, which joins the model's pool as its
// thread 0; the promise settles on the JS thread.
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

class ForwardWorker : public PromiseWorker {
 public:
  ForwardWorker(Napi::Env env, Window *win, std::shared_ptr<ModelState> model, Napi::Object self, Napi::Float32Array acts,
                int pos, int n, Napi::Value logits)
      : PromiseWorker(env), win(win), model(std::move(model)), pos(pos), n(n) {
    selfRef = Napi::Persistent(self);
    actsRef = Napi::Persistent(acts);
    actsPtr = acts.Data();
    if (logits.IsTypedArray()) {
      auto l = logits.As<Napi::Float32Array>();
      logitsRef = Napi::Persistent(l);
      logitsPtr = l.Data();
    }
    if (win) win->busy++;
    this->model->busy++;
  }
  void Execute() override {
    char err[kErrLen] = {0};
    if (win) {
      if (prima_window_forward(win->w, actsPtr, pos, n, logitsPtr, err, sizeof err) != 0) SetError(err);
    } else {
      prima_model_logits(model->m, actsPtr + (size_t)(n - 1) * model->m->hp.n_embd, logitsPtr);
      if (prima_model_check_file(model->m, 0, err, sizeof err) != 0) SetError(err);
    }
  }

 private:
  void Done() override {
    if (win) win->busy--;
    model->busy--;
  }
  Window *win;
  std::shared_ptr<ModelState> model;
  Napi::ObjectReference selfRef;
  Napi::Reference<Napi::Float32Array> actsRef, logitsRef;
  float *actsPtr = nullptr;
  float *logitsPtr = nullptr;
  int pos, n;
};

// A decode step of several sequences (prima_window_forward_seqs): every window it touches is busy
// until it settles, so none is truncated, saved or stepped twice meanwhile.
class SeqsWorker : public PromiseWorker {
 public:
  SeqsWorker(Napi::Env env, Window *lead, std::vector<Window *> seqs, std::vector<Napi::ObjectReference> refs,
             std::shared_ptr<ModelState> model, Napi::Float32Array acts, std::vector<int> pos, Napi::Value logits)
      : PromiseWorker(env), lead(lead), seqs(std::move(seqs)), refs(std::move(refs)), model(std::move(model)), pos(std::move(pos)) {
    actsRef = Napi::Persistent(acts);
    actsPtr = acts.Data();
    if (logits.IsTypedArray()) {
      auto l = logits.As<Napi::Float32Array>();
      logitsRef = Napi::Persistent(l);
      logitsPtr = l.Data();
    }
    for (Window *w : Touched()) w->busy++;
    this->model->busy++;
    for (Window *s : this->seqs) ws.push_back(s->w);
  }
  void Execute() override {
    char err[kErrLen] = {0};
    if (prima_window_forward_seqs(lead->w, ws.data(), pos.data(), (int)pos.size(), actsPtr, logitsPtr, err, sizeof err) != 0) SetError(err);
  }

 private:
  std::vector<Window *> Touched() {
    std::vector<Window *> t = seqs;
    bool in = false;
    for (Window *s : seqs) in |= s == lead;
    if (!in) t.push_back(lead);
    return t;
  }
  void Done() override {
    for (Window *w : Touched()) w->busy--;
    model->busy--;
  }
  Window *lead;
  std::vector<Window *> seqs;
  std::vector<Napi::ObjectReference> refs; /* the windows stay alive while the step runs */
  std::vector<prima_window *> ws;
  std::shared_ptr<ModelState> model;
  std::vector<int> pos;
  Napi::Reference<Napi::Float32Array> actsRef, logitsRef;
  float *actsPtr = nullptr;
  float *logitsPtr = nullptr;
};

// ---- Model ------------------------------------------------------------------------------------

Napi::Function Model::Define(Napi::Env env) {
  return DefineClass(env, "NativeModel",
                     {InstanceMethod("window", &Model::MakeWindow), InstanceMethod("embed", &Model::Embed),
                      InstanceMethod("logits", &Model::Logits), InstanceMethod("outputNorm", &Model::OutputNorm),
                      InstanceMethod("relax", &Model::Relax),
                      InstanceMethod("prewake", &Model::Prewake), InstanceMethod("fileProblem", &Model::FileProblem),
                      InstanceMethod("close", &Model::Close)});
}

// new NativeModel(path, tensors[], hparams, { threads })
Model::Model(const Napi::CallbackInfo &info) : Napi::ObjectWrap<Model>(info) {
  Napi::Env env = info.Env();
  if (info.Length() < 4 || !info[0].IsString() || !info[1].IsArray() || !info[2].IsObject() || !info[3].IsObject()) {
    ThrowType(env, "NativeModel(path, tensors, hparams, options) expected");
    return;
  }
  const std::string path = info[0].As<Napi::String>();
  Napi::Array arr = info[1].As<Napi::Array>();
  std::vector<std::string> names(arr.Length());
  std::vector<prima_tensor_desc> descs(arr.Length());
  for (uint32_t i = 0; i < arr.Length(); i++) {
    Napi::Value v = arr.Get(i);
    if (!v.IsObject()) {
      ThrowType(env, "tensor table entries must be objects");
      return;
    }
    Napi::Object o = v.As<Napi::Object>();
    int64_t type, ne0, ne1, offset, nBytes;
    if (!o.Get("name").IsString() || !IntArg(o.Get("type"), 0, PRIMA_TYPE_COUNT, &type) ||
        !IntArg(o.Get("ne0"), 1, INT64_C(1) << 40, &ne0) || !IntArg(o.Get("ne1"), 1, INT64_C(1) << 40, &ne1) ||
        !IntArg(o.Get("offset"), 0, INT64_C(1) << 52, &offset) || !IntArg(o.Get("nBytes"), 0, INT64_C(1) << 52, &nBytes)) {
      ThrowType(env, "tensor table entry " + std::to_string(i) + " needs name, type, ne0, ne1, offset, nBytes");
      return;
    }
    names[i] = o.Get("name").As<Napi::String>();
    descs[i] = {nullptr, (int)type, ne0, ne1, (uint64_t)offset, (uint64_t)nBytes};
  }
  for (size_t i = 0; i < descs.size(); i++) descs[i].name = names[i].c_str();

  Napi::Object h = info[2].As<Napi::Object>();
  prima_hparams hp{};
  int64_t v;
  struct {
    const char *key;
    int *dst;
  } ints[] = {{"nVocab", &hp.n_vocab},   {"nEmbd", &hp.n_embd},       {"nLayers", &hp.n_layers},
              {"nHead", &hp.n_head},     {"nHeadKv", &hp.n_head_kv},  {"headDim", &hp.head_dim},
              {"nFf", &hp.n_ff},         {"ropeDims", &hp.rope_dims}, {"nCtxOrig", &hp.n_ctx_orig}};
  for (auto &f : ints) {
    if (!IntArg(h.Get(f.key), 1, 1 << 24, &v)) {
      ThrowType(env, std::string("hparams.") + f.key + " must be a positive integer");
      return;
    }
    *f.dst = (int)v;
  }
  // Mixture of experts: 0 for a dense model.
  struct {
    const char *key;
    int *dst;
  } moe[] = {{"nExpert", &hp.n_expert}, {"nExpertUsed", &hp.n_expert_used}, {"nFfExp", &hp.n_ff_exp}};
  for (auto &f : moe) {
    if (!IntArg(h.Get(f.key), 0, 1 << 24, &v)) {
      ThrowType(env, std::string("hparams.") + f.key + " must be a whole number from 0");
      return;
    }
    *f.dst = (int)v;
  }
  // Every switch of the shared blocks is required: a family file that forgets one is an error here,
  // not a silent llama default (model/arch/ computes them, engine/local-model.ts passes them).
  struct {
    const char *key;
    float *dst;
  } floats[] = {{"normEps", &hp.norm_eps},         {"ropeFreqBase", &hp.rope_base},
                {"ropeFreqScale", &hp.rope_freq_scale}, {"embdScale", &hp.embd_scale},
                {"queryScale", &hp.q_scale},        {"scoreScale", &hp.kq_scale},
                {"ropeFreqBaseSwa", &hp.rope_base_swa}, {"ropeFreqScaleSwa", &hp.rope_freq_scale_swa},
                {"ropeAttnFactor", &hp.rope_attn_factor}, {"attnSoftcap", &hp.attn_softcap},
                {"finalSoftcap", &hp.final_softcap},    {"ropeYarnExtFactor", &hp.rope_yarn_ext},
                {"ropeYarnBetaFast", &hp.rope_yarn_beta_fast}, {"ropeYarnBetaSlow", &hp.rope_yarn_beta_slow}};
  for (auto &f : floats) {
    if (!h.Get(f.key).IsNumber()) {
      ThrowType(env, std::string("hparams.") + f.key + " must be a number");
      return;
    }
    *f.dst = h.Get(f.key).As<Napi::Number>().FloatValue();
  }
  hp.rope_neox = h.Get("ropeNeox").ToBoolean().Value() ? 1 : 0;
  const std::string act = h.Get("ffnAct").IsString() ? h.Get("ffnAct").As<Napi::String>().Utf8Value() : "";
  if (act != "silu" && act != "gelu" && act != "swiglu-oai") {
    ThrowType(env, "hparams.ffnAct must be \"silu\", \"gelu\" or \"swiglu-oai\"");
    return;
  }
  hp.ffn_act = act == "gelu" ? PRIMA_FFN_GELU : act == "swiglu-oai" ? PRIMA_FFN_SWIGLU_OAI : PRIMA_FFN_SILU;
  const std::string gating = h.Get("moeGating").IsString() ? h.Get("moeGating").As<Napi::String>().Utf8Value() : "";
  if (gating != "softmax-norm" && gating != "topk-softmax") {
    ThrowType(env, "hparams.moeGating must be \"softmax-norm\" or \"topk-softmax\"");
    return;
  }
  hp.moe_gating = gating == "topk-softmax" ? PRIMA_MOE_TOPK_SOFTMAX : PRIMA_MOE_SOFTMAX_NORM;
  Napi::Value lw = h.Get("layerWindow");
  if (!lw.IsArray() || lw.As<Napi::Array>().Length() != (uint32_t)hp.n_layers) {
    ThrowType(env, "hparams.layerWindow must be an array of one window (0: full attention) per layer");
    return;
  }
  std::vector<int> windows(hp.n_layers);
  for (int l = 0; l < hp.n_layers; l++) {
    if (!IntArg(lw.As<Napi::Array>().Get((uint32_t)l), 0, 1 << 24, &v)) {
      ThrowType(env, "hparams.layerWindow[" + std::to_string(l) + "] must be a whole number from 0");
      return;
    }
    windows[l] = (int)v;
  }
  hp.layer_window = windows.data();

  int64_t threads = 1, spinUs = -1;
  Napi::Value tv = info[3].As<Napi::Object>().Get("threads");
  if (!tv.IsUndefined() && !IntArg(tv, 1, 1024, &threads)) {
    ThrowType(env, "options.threads must be an integer from 1 to 1024");
    return;
  }
  Napi::Value sv = info[3].As<Napi::Object>().Get("idleSpinUs");
  if (!sv.IsUndefined() && !IntArg(sv, 0, 1000000, &spinUs)) {
    ThrowType(env, "options.idleSpinUs must be an integer from 0 to 1000000");
    return;
  }
  const bool spread = info[3].As<Napi::Object>().Get("spreadThreads").ToBoolean().Value();
  char err[kErrLen] = {0};
  st->m = prima_model_open(path.c_str(), descs.data(), (int)descs.size(), &hp, (int)threads, (int)spinUs, err, sizeof err);
  if (!st->m) ThrowErr(env, std::string(path) + ": " + err);
  else if (spread) prima_pool_spread(st->m->pool, 1);
}

Napi::Value Model::MakeWindow(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!st->m) return ThrowErr(env, "model is closed");
  return windowCtor.New({info.This(), info.Length() > 0 ? info[0] : env.Undefined(),
                         info.Length() > 1 ? info[1] : env.Undefined(), info.Length() > 2 ? info[2] : env.Undefined()});
}

// embed(tokens: Int32Array, out: Float32Array)
Napi::Value Model::Embed(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!st->m) return ThrowErr(env, "model is closed");
  if (info.Length() < 2 || !info[0].IsTypedArray() || !info[1].IsTypedArray() ||
      info[0].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array ||
      info[1].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array)
    return ThrowType(env, "embed(tokens: Int32Array, out: Float32Array) expected");
  auto tokens = info[0].As<Napi::Int32Array>();
  auto out = info[1].As<Napi::Float32Array>();
  const size_t n = tokens.ElementLength();
  if (out.ElementLength() < n * (size_t)st->m->hp.n_embd)
    return ThrowType(env, "embed: output holds " + std::to_string(out.ElementLength()) + " floats, needs " +
                              std::to_string(n * st->m->hp.n_embd));
  for (size_t i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= st->m->hp.n_vocab)
      return ThrowErr(env, "embed: token id " + std::to_string(tokens[i]) + " is outside the vocabulary of " +
                               std::to_string(st->m->hp.n_vocab));
  prima_model_embed(st->m, tokens.Data(), (int)n, out.Data());
  char err[kErrLen] = {0};
  if (prima_model_check_file(st->m, 0, err, sizeof err) != 0) return ThrowErr(env, err);
  return env.Undefined();
}

// fileProblem(): null while the mapped file is the one opened and reads of it succeed; else why not,
// naming the file (checked now: see prima_model_check_file).
Napi::Value Model::FileProblem(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!st->m) return env.Null();
  char err[kErrLen] = {0};
  if (prima_model_check_file(st->m, 1, err, sizeof err) == 0) return env.Null();
  return Napi::String::New(env, err);
}

// logits(acts: Float32Array (rows of nEmbd; the last is used), out: Float32Array(nVocab)): Promise<void>
Napi::Value Model::Logits(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!st->m) return ThrowErr(env, "model is closed");
  if (info.Length() < 2 || !info[0].IsTypedArray() || !info[1].IsTypedArray() ||
      info[0].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array ||
      info[1].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array)
    return ThrowType(env, "logits(acts: Float32Array, out: Float32Array) expected");
  auto acts = info[0].As<Napi::Float32Array>();
  auto out = info[1].As<Napi::Float32Array>();
  const size_t E = (size_t)st->m->hp.n_embd;
  if (acts.ElementLength() < E || acts.ElementLength() % E != 0)
    return ThrowType(env, "logits: activations must be whole rows of " + std::to_string(E));
  if (out.ElementLength() < (size_t)st->m->hp.n_vocab) return ThrowType(env, "logits: output is shorter than the vocabulary");
  auto *w = new ForwardWorker(env, nullptr, st, info.This().As<Napi::Object>(), acts, 0, (int)(acts.ElementLength() / E), out);
  auto p = w->Promise();
  w->Queue();
  return p;
}

// outputNorm(acts: Float32Array (whole rows of nEmbd), out: Float32Array (as long)): the output norm of
// every row, on the calling thread (n x nEmbd multiply-adds: an embedding's rows, not a pass).
Napi::Value Model::OutputNorm(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!st->m) return ThrowErr(env, "model is closed");
  if (info.Length() < 2 || !info[0].IsTypedArray() || !info[1].IsTypedArray() ||
      info[0].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array ||
      info[1].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array)
    return ThrowType(env, "outputNorm(acts: Float32Array, out: Float32Array) expected");
  auto acts = info[0].As<Napi::Float32Array>();
  auto out = info[1].As<Napi::Float32Array>();
  const size_t E = (size_t)st->m->hp.n_embd;
  if (acts.ElementLength() % E != 0) return ThrowType(env, "outputNorm: activations must be whole rows of " + std::to_string(E));
  if (out.ElementLength() < acts.ElementLength()) return ThrowType(env, "outputNorm: the output is shorter than the activations");
  prima_model_output_norm(st->m, acts.Data(), out.Data(), (int)(acts.ElementLength() / E));
  char err[kErrLen] = {0};
  if (prima_model_check_file(st->m, 0, err, sizeof err) != 0) return ThrowErr(env, err);
  return env.Undefined();
}

// relax(): the compute threads stop spinning for a next job (see prima_pool_relax).
Napi::Value Model::Relax(const Napi::CallbackInfo &info) {
  if (st->m) prima_pool_relax(st->m->pool);
  return info.Env().Undefined();
}

// prewake(): a pass is coming soon; sleeping compute threads wake and spin for it (prima_pool_prewake).
Napi::Value Model::Prewake(const Napi::CallbackInfo &info) {
  if (st->m) prima_pool_prewake(st->m->pool);
  return info.Env().Undefined();
}

Napi::Value Model::Close(const Napi::CallbackInfo &info) {
  if (st->busy > 0) return ThrowErr(info.Env(), "model is busy: wait for its forward passes to finish before closing it");
  if (st->windows > 0) return ThrowErr(info.Env(), "model still has open windows: close them first");
  if (st->m) prima_model_close(st->m);
  st->m = nullptr;
  return info.Env().Undefined();
}

// ---- Window -----------------------------------------------------------------------------------

Napi::Function Window::Define(Napi::Env env) {
  return DefineClass(env, "NativeWindow",
                     {InstanceMethod("forward", &Window::Forward), InstanceMethod("forwardNow", &Window::ForwardNow),
                      InstanceMethod("forwardSeqs", &Window::ForwardSeqs),
                      InstanceMethod("prefetch", &Window::Prefetch),
                      InstanceMethod("release", &Window::Release),
                      InstanceMethod("streamBeyond", &Window::StreamBeyond), InstanceMethod("residency", &Window::Residency),
                      InstanceMethod("kvClear", &Window::KvClear), InstanceMethod("kvTruncate", &Window::KvTruncate),
                      InstanceMethod("kvResumable", &Window::KvResumable),
                      InstanceMethod("kvShift", &Window::KvShift), InstanceMethod("h2oScores", &Window::H2oScores),
                      InstanceMethod("kvSave", &Window::KvSave), InstanceMethod("kvLoad", &Window::KvLoad),
                      InstanceMethod("info", &Window::Info), InstanceMethod("close", &Window::Close)});
}

// new NativeWindow(model, firstLayer, endLayer, { ctx, maxBatch })
Window::Window(const Napi::CallbackInfo &info) : Napi::ObjectWrap<Window>(info) {
  Napi::Env env = info.Env();
  if (info.Length() < 4 || !info[0].IsObject() || !info[3].IsObject()) {
    ThrowType(env, "window(firstLayer, endLayer, { ctx, maxBatch }) expected");
    return;
  }
  Model *model = Model::Unwrap(info[0].As<Napi::Object>());
  if (!model || !model->st->m) {
    ThrowErr(env, "model is closed");
    return;
  }
  const int L = model->st->m->hp.n_layers;
  int64_t first, end, ctx, batch = 128;
  Napi::Object o = info[3].As<Napi::Object>();
  if (!IntArg(info[1], 0, L - 1, &first) || !IntArg(info[2], first + 1, L, &end)) {
    ThrowType(env, "window layers must satisfy 0 <= first < end <= " + std::to_string(L));
    return;
  }
  if (!IntArg(o.Get("ctx"), 1, 1 << 22, &ctx)) {
    ThrowType(env, "window options.ctx must be a positive integer");
    return;
  }
  if (!o.Get("maxBatch").IsUndefined() && !IntArg(o.Get("maxBatch"), 1, 4096, &batch)) {
    ThrowType(env, "window options.maxBatch must be an integer from 1 to 4096");
    return;
  }
  // the KV cache's types as ggml type ids (F16 when absent); prima_window_create names a wrong one
  int64_t kv_types[2] = {PRIMA_F16, PRIMA_F16};
  const char *kv_keys[2] = {"cacheTypeK", "cacheTypeV"};
  for (int i = 0; i < 2; i++) {
    if (!o.Get(kv_keys[i]).IsUndefined() && !IntArg(o.Get(kv_keys[i]), 0, PRIMA_KV_ROTATED | 0xFF, &kv_types[i])) {
      ThrowType(env, std::string("window options.") + kv_keys[i] + " must be a ggml type id (| 0x100: rotated)");
      return;
    }
  }
  // sparse attention of the full-attention layers: {window, sinks, logStride, block} (absent: dense)
  prima_sparse_cfg sparse = {0, 0, 0, 0};
  if (!o.Get("sparse").IsUndefined()) {
    if (!o.Get("sparse").IsObject()) {
      ThrowType(env, "window options.sparse must be {window, sinks, logStride, block}");
      return;
    }
    Napi::Object so = o.Get("sparse").As<Napi::Object>();
    int64_t sw, ss, sb;
    if (!IntArg(so.Get("window"), 1, 1 << 22, &sw) || !IntArg(so.Get("sinks"), 0, 1 << 22, &ss) ||
        !IntArg(so.Get("block"), 0, 1 << 22, &sb) || !so.Get("logStride").IsBoolean()) {
      ThrowType(env, "window options.sparse must be {window >= 1, sinks >= 0, logStride: boolean, block >= 0}");
      return;
    }
    sparse = {(int)sw, (int)ss, so.Get("logStride").As<Napi::Boolean>().Value() ? 1 : 0, (int)sb};
  }
  char err[kErrLen] = {0};
  w = prima_window_create(model->st->m, (int)first, (int)end, (int)ctx, (int)batch, (int)kv_types[0], (int)kv_types[1], err,
                          sizeof err);
  if (!w) {
    ThrowErr(env, err);
    return;
  }
  if (!o.Get("h2o").IsUndefined() && !o.Get("h2o").IsBoolean()) {
    prima_window_destroy(w);
    w = nullptr;
    ThrowType(env, "window options.h2o must be a boolean");
    return;
  }
  if (o.Get("h2o").ToBoolean().Value() && prima_window_set_h2o(w, err, sizeof err) != 0) {
    prima_window_destroy(w);
    w = nullptr;
    ThrowErr(env, err);
    return;
  }
  if (sparse.window > 0 && prima_window_set_sparse(w, &sparse, err, sizeof err) != 0) {
    prima_window_destroy(w);
    w = nullptr;
    ThrowErr(env, err);
    return;
  }
  st = model->st;
  st->windows++;
}

void Window::Free() {
  if (w) {
    prima_window_destroy(w);
    w = nullptr;
    st->windows--;
  }
}

bool Window::Alive(Napi::Env env) {
  if (w) return true;
  ThrowErr(env, "window is closed");
  return false;
}

// Checks forward's arguments (acts: Float32Array, pos, nTokens, logits?: Float32Array); false after
// throwing a TypeError that names what is wrong.
bool Window::ForwardArgs(const Napi::CallbackInfo &info, int64_t *pos, int64_t *n, Napi::Value *logits) {
  Napi::Env env = info.Env();
  if (info.Length() < 3 || !info[0].IsTypedArray() ||
      info[0].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array || !IntArg(info[1], 0, 1 << 30, pos) ||
      !IntArg(info[2], 1, 1 << 30, n)) {
    ThrowType(env, "forward(acts: Float32Array, position, nTokens, logits?) expected");
    return false;
  }
  auto acts = info[0].As<Napi::Float32Array>();
  const size_t E = (size_t)st->m->hp.n_embd;
  if (acts.ElementLength() < (size_t)*n * E) {
    ThrowType(env, "forward: activations hold " + std::to_string(acts.ElementLength()) + " floats, " +
                       std::to_string(*n) + " tokens need " + std::to_string(*n * E));
    return false;
  }
  *logits = info.Length() > 3 ? info[3] : env.Undefined();
  if (!logits->IsUndefined() && !logits->IsNull()) {
    if (!logits->IsTypedArray() || logits->As<Napi::TypedArray>().TypedArrayType() != napi_float32_array ||
        logits->As<Napi::Float32Array>().ElementLength() < (size_t)st->m->hp.n_vocab) {
      ThrowType(env, "forward: logits must be a Float32Array of the vocabulary size");
      return false;
    }
  }
  return true;
}

// forward(acts: Float32Array, pos, nTokens, logits?: Float32Array): Promise<void>
Napi::Value Window::Forward(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int64_t pos, n;
  Napi::Value logits;
  if (!Alive(env) || !ForwardArgs(info, &pos, &n, &logits)) return env.Undefined();
  auto *worker = new ForwardWorker(env, this, st, info.This().As<Napi::Object>(), info[0].As<Napi::Float32Array>(),
                                   (int)pos, (int)n, logits);
  auto p = worker->Promise();
  worker->Queue();
  return p;
}

// forwardNow(acts, pos, nTokens, logits?): the same pass on the calling thread. It blocks the event
// loop for its duration, so it is for short calls (a decode step), where it saves the two thread
// hand-offs of the asynchronous path.
Napi::Value Window::ForwardNow(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int64_t pos, n;
  Napi::Value logits;
  if (!Alive(env) || !ForwardArgs(info, &pos, &n, &logits)) return env.Undefined();
  if (busy > 0) return ThrowErr(env, "window is busy: wait for its forward pass to finish");
  float *logitsPtr = logits.IsTypedArray() ? logits.As<Napi::Float32Array>().Data() : nullptr;
  char err[kErrLen] = {0};
  if (prima_window_forward(w, info[0].As<Napi::Float32Array>().Data(), (int)pos, (int)n, logitsPtr, err, sizeof err) != 0)
    return ThrowErr(env, err);
  return env.Undefined();
}

// forwardSeqs(windows: NativeWindow[], acts: Float32Array, positions: Int32Array, logits?: Float32Array):
// Promise<void>. One decode step of windows.length sequences on this window's scratch: row i of acts
// at positions[i] in windows[i]'s KV cache; logits (windows.length rows of the vocabulary) per row.
Napi::Value Window::ForwardSeqs(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Alive(env)) return env.Undefined();
  if (info.Length() < 3 || !info[0].IsArray() || !info[1].IsTypedArray() ||
      info[1].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array || !info[2].IsTypedArray() ||
      info[2].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
    return ThrowType(env, "forwardSeqs(windows: NativeWindow[], acts: Float32Array, positions: Int32Array, logits?) expected");
  auto arr = info[0].As<Napi::Array>();
  auto acts = info[1].As<Napi::Float32Array>();
  auto positions = info[2].As<Napi::Int32Array>();
  const size_t n = arr.Length();
  if (n < 1 || n > (size_t)w->max_batch)
    return ThrowType(env, "forwardSeqs: from 1 to " + std::to_string(w->max_batch) + " sequences (the window's maxBatch) expected");
  if (positions.ElementLength() != n) return ThrowType(env, "forwardSeqs: one position per window expected");
  const size_t E = (size_t)st->m->hp.n_embd, V = (size_t)st->m->hp.n_vocab;
  if (acts.ElementLength() < n * E) return ThrowType(env, "forwardSeqs: activations must hold one row per window");
  Napi::Value logits = info.Length() > 3 ? info[3] : env.Undefined();
  if (!logits.IsUndefined() && !logits.IsNull() &&
      (!logits.IsTypedArray() || logits.As<Napi::TypedArray>().TypedArrayType() != napi_float32_array ||
       logits.As<Napi::Float32Array>().ElementLength() < n * V))
    return ThrowType(env, "forwardSeqs: logits must be a Float32Array of one vocabulary row per window");
  if (busy > 0) return ThrowErr(env, "window is busy: wait for its forward pass to finish");
  std::vector<Window *> seqs;
  std::vector<Napi::ObjectReference> refs;
  std::vector<int> pos;
  for (size_t i = 0; i < n; i++) {
    Napi::Value v = arr.Get((uint32_t)i);
    if (!v.IsObject() || !v.As<Napi::Object>().InstanceOf(Model::windowCtor.Value()))
      return ThrowType(env, "forwardSeqs: windows[" + std::to_string(i) + "] is not a NativeWindow");
    Window *s = Window::Unwrap(v.As<Napi::Object>());
    if (!s->w) return ThrowErr(env, "forwardSeqs: windows[" + std::to_string(i) + "] is closed");
    if (s->st != st) return ThrowType(env, "forwardSeqs: windows[" + std::to_string(i) + "] belongs to another model");
    if (s->busy > 0) return ThrowErr(env, "forwardSeqs: windows[" + std::to_string(i) + "] is busy");
    seqs.push_back(s);
    refs.push_back(Napi::Persistent(v.As<Napi::Object>()));
    pos.push_back(positions[i]);
  }
  refs.push_back(Napi::Persistent(info.This().As<Napi::Object>()));
  // The rest (same layers and context, distinct windows, positions) the C side checks and reports.
  auto *worker = new SeqsWorker(env, this, std::move(seqs), std::move(refs), st, acts, std::move(pos), logits);
  auto p = worker->Promise();
  worker->Queue();
  return p;
}

Napi::Value Window::Prefetch(const Napi::CallbackInfo &info) {
  if (!Alive(info.Env())) return info.Env().Undefined();
  uint64_t maxBytes = UINT64_MAX;
  if (info.Length() > 0 && !info[0].IsUndefined()) {
    int64_t v;
    if (!IntArg(info[0], 0, INT64_C(1) << 52, &v)) return ThrowType(info.Env(), "prefetch(maxBytes?) needs a byte count >= 0");
    maxBytes = (uint64_t)v;
  }
  const int rc = prima_window_prefetch(w, maxBytes);
  if (rc) return ThrowErr(info.Env(), std::string("prefetch failed: ") + strerror(rc));
  return info.Env().Undefined();
}

Napi::Value Window::Release(const Napi::CallbackInfo &info) {
  if (!Alive(info.Env())) return info.Env().Undefined();
  const int rc = prima_window_release(w);
  if (rc) return ThrowErr(info.Env(), std::string("release failed: ") + strerror(rc));
  return info.Env().Undefined();
}

Napi::Value Window::StreamBeyond(const Napi::CallbackInfo &info) {
  if (!Alive(info.Env())) return info.Env().Undefined();
  int64_t room;
  if (!IntArg(info[0], 0, INT64_C(1) << 52, &room)) return ThrowType(info.Env(), "streamBeyond(roomBytes) needs a byte count >= 0");
  prima_window_stream_beyond(w, (uint64_t)room);
  return info.Env().Undefined();
}

Napi::Value Window::Residency(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Alive(env)) return env.Undefined();
  uint64_t resident = 0, total = 0;
  const int rc = prima_window_residency(w, &resident, &total);
  if (rc) return ThrowErr(env, std::string("residency failed: ") + strerror(rc));
  Napi::Object o = Napi::Object::New(env);
  o.Set("residentBytes", Napi::Number::New(env, (double)resident));
  o.Set("totalBytes", Napi::Number::New(env, (double)total));
  return o;
}

Napi::Value Window::KvClear(const Napi::CallbackInfo &info) {
  if (!Alive(info.Env())) return info.Env().Undefined();
  if (busy > 0) return ThrowErr(info.Env(), "window is busy");
  w->n_filled = 0;
  return info.Env().Undefined();
}

Napi::Value Window::KvTruncate(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Alive(env)) return env.Undefined();
  if (busy > 0) return ThrowErr(env, "window is busy");
  int64_t pos;
  if (info.Length() < 1 || !IntArg(info[0], 0, w->n_filled, &pos))
    return ThrowType(env, "kvTruncate(position) needs 0 <= position <= " + std::to_string(w->n_filled));
  w->n_filled = (int)pos;
  return env.Undefined();
}

Napi::Value Window::KvResumable(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Alive(env)) return env.Undefined();
  int64_t pos;
  if (info.Length() < 1 || !IntArg(info[0], 0, INT32_MAX, &pos)) return ThrowType(env, "kvResumable(position) needs a position >= 0");
  return Napi::Number::New(env, prima_window_kv_resumable(w, (int)pos));
}

// kvShift(p0, nDiscard, nPast): context shift (native/src/kv_shift.h).
static bool ShiftArgs(const Napi::CallbackInfo &info, int64_t *p0, int64_t *d, int64_t *n_past) {
  return info.Length() >= 3 && IntArg(info[0], 0, 1 << 30, p0) && IntArg(info[1], 1, 1 << 30, d) && IntArg(info[2], 1, 1 << 30, n_past);
}

Napi::Value Window::KvShift(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Alive(env)) return env.Undefined();
  if (busy > 0) return ThrowErr(env, "window is busy");
  int64_t p0, d, n_past;
  if (!ShiftArgs(info, &p0, &d, &n_past)) return ThrowType(env, "kvShift(p0, nDiscard, nPast) expected (nDiscard >= 1)");
  char err[kErrLen] = {0};
  if (prima_window_kv_shift(w, (int)p0, (int)d, (int)n_past, err, sizeof err)) return ThrowErr(env, err);
  return env.Undefined();
}

// h2oScores(): Float32Array of the positions the cache holds: H2O's accumulated attention (made with h2o: true), else null.
Napi::Value Window::H2oScores(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Alive(env)) return env.Undefined();
  if (busy > 0) return ThrowErr(env, "window is busy");
  if (!w->h2o_acc) return env.Null();
  Napi::Float32Array out = Napi::Float32Array::New(env, (size_t)w->n_filled);
  prima_window_h2o_scores(w, out.Data());
  return out;
}

Napi::Value Window::KvSave(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Alive(env)) return env.Undefined();
  if (info.Length() < 1 || !info[0].IsString()) return ThrowType(env, "kvSave(path) expected");
  if (busy > 0) return ThrowErr(env, "window is busy");
  char err[kErrLen] = {0};
  if (prima_window_kv_save(w, info[0].As<Napi::String>().Utf8Value().c_str(), err, sizeof err)) return ThrowErr(env, err);
  return env.Undefined();
}

Napi::Value Window::KvLoad(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Alive(env)) return env.Undefined();
  if (info.Length() < 1 || !info[0].IsString()) return ThrowType(env, "kvLoad(path) expected");
  if (busy > 0) return ThrowErr(env, "window is busy");
  char err[kErrLen] = {0};
  if (prima_window_kv_load(w, info[0].As<Napi::String>().Utf8Value().c_str(), err, sizeof err)) return ThrowErr(env, err);
  return env.Undefined();
}

Napi::Value Window::Info(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Alive(env)) return env.Undefined();
  Napi::Object o = Napi::Object::New(env);
  o.Set("firstLayer", w->first);
  o.Set("endLayer", w->end);
  o.Set("ctx", w->n_ctx);
  o.Set("maxBatch", w->max_batch);
  o.Set("filled", w->n_filled);
  o.Set("anonBytes", Napi::Number::New(env, (double)w->anon_bytes));
  // K and V rows in their types over all the window's layers (sliding-window layers hold a ring, not n_ctx)
  o.Set("kvBytes", Napi::Number::New(env, (double)w->kv_bytes));
  o.Set("cacheTypeK", w->k_type | (w->k_rot ? PRIMA_KV_ROTATED : 0));
  o.Set("cacheTypeV", w->v_type | (w->v_rot ? PRIMA_KV_ROTATED : 0));
  if (w->expert_hits) {
    // per layer of the window: how many tokens each expert has run (routing seen from outside)
    const int X = w->m->hp.n_expert;
    Napi::Array layers = Napi::Array::New(env, (size_t)(w->end - w->first));
    for (int li = 0; li < w->end - w->first; li++) {
      Napi::Array hits = Napi::Array::New(env, (size_t)X);
      for (int e = 0; e < X; e++) hits.Set((uint32_t)e, Napi::Number::New(env, (double)w->expert_hits[(size_t)li * X + e]));
      layers.Set((uint32_t)li, hits);
    }
    o.Set("expertHits", layers);
  }
  return o;
}

Napi::Value Window::Close(const Napi::CallbackInfo &info) {
  if (busy > 0) return ThrowErr(info.Env(), "window is busy: wait for its forward pass before closing it");
  Free();
  return info.Env().Undefined();
}


// ---- Lane --------------------------------------------------------------------------------------

// new NativeLane(model, windows: NativeWindow[], cycles: number[], options, onEvent): a ring worker's
// data path on its own thread (src/lane.h). Its windows stay busy (no forward, close or KV call from
// JS) until stop(); KV commands go through the lane's kvClear/kvTruncate, between frames.
class Lane : public Napi::ObjectWrap<Lane> {
 public:
  static Napi::Function Define(Napi::Env env);
  explicit Lane(const Napi::CallbackInfo &info);
  ~Lane() override { Stop(); }

 private:
  struct Event {
    prima_lane_event_kind kind;
    int link, code;
    std::string kindName, text;
    std::vector<uint8_t> data;
  };
  static void OnEvent(void *ctx, const prima_lane_event *ev);
  void Stop();
  bool Running(Napi::Env env);
  Napi::Value Attach(const Napi::CallbackInfo &info);
  Napi::Value Send(const Napi::CallbackInfo &info);
  Napi::Value Resume(const Napi::CallbackInfo &info);
  Napi::Value CloseLink(const Napi::CallbackInfo &info);
  Napi::Value SetWeightRoom(const Napi::CallbackInfo &info);
  Napi::Value SetReleaseAfterUse(const Napi::CallbackInfo &info);
  Napi::Value Stats(const Napi::CallbackInfo &info);
  Napi::Value ResetStats(const Napi::CallbackInfo &info);
  Napi::Value KvClear(const Napi::CallbackInfo &info);
  Napi::Value KvTruncate(const Napi::CallbackInfo &info);
  Napi::Value KvShift(const Napi::CallbackInfo &info);
  Napi::Value StopJs(const Napi::CallbackInfo &info);
  Napi::Value RunFrame(const Napi::CallbackInfo &info);
  friend class LaneRunWorker;

  prima_lane *lane = nullptr;
  int runs = 0;             // runFrame passes in flight (they use the lane)
  bool stopWanted = false;  // stop() came while one was: the last one to finish stops
  std::shared_ptr<ModelState> st;
  std::vector<Napi::ObjectReference> windowRefs;
  std::vector<Window *> windows;
  Napi::ThreadSafeFunction tsfn;
};

Napi::Function Lane::Define(Napi::Env env) {
  return DefineClass(env, "NativeLane",
                     {InstanceMethod("attach", &Lane::Attach), InstanceMethod("send", &Lane::Send),
                      InstanceMethod("resume", &Lane::Resume), InstanceMethod("closeLink", &Lane::CloseLink),
                      InstanceMethod("setWeightRoom", &Lane::SetWeightRoom),
                      InstanceMethod("setReleaseAfterUse", &Lane::SetReleaseAfterUse),
                      InstanceMethod("stats", &Lane::Stats), InstanceMethod("resetStats", &Lane::ResetStats),
                      InstanceMethod("kvClear", &Lane::KvClear), InstanceMethod("kvTruncate", &Lane::KvTruncate),
                      InstanceMethod("kvShift", &Lane::KvShift),
                      InstanceMethod("runFrame", &Lane::RunFrame), InstanceMethod("stop", &Lane::StopJs)});
}

Lane::Lane(const Napi::CallbackInfo &info) : Napi::ObjectWrap<Lane>(info) {
  Napi::Env env = info.Env();
  if (info.Length() < 5 || !info[0].IsObject() || !info[1].IsArray() || !info[2].IsArray() || !info[3].IsObject() ||
      !info[4].IsFunction()) {
    ThrowType(env, "new NativeLane(model, windows, cycles, options, onEvent) expected");
    return;
  }
  Model *model = Napi::ObjectWrap<Model>::Unwrap(info[0].As<Napi::Object>());
  if (!model || !model->st->m) {
    ThrowErr(env, "model is closed");
    return;
  }
  st = model->st;
  auto wins = info[1].As<Napi::Array>();
  auto cycles = info[2].As<Napi::Array>();
  if (wins.Length() == 0 || wins.Length() != cycles.Length()) {
    ThrowType(env, "NativeLane: one cycle per window, at least one window");
    return;
  }
  Napi::Object o = info[3].As<Napi::Object>();
  std::vector<prima_lane_window> lw;
  for (uint32_t i = 0; i < wins.Length(); i++) {
    Napi::Value wv = wins.Get(i);
    int64_t cycle;
    Window *w = wv.IsObject() ? Napi::ObjectWrap<Window>::Unwrap(wv.As<Napi::Object>()) : nullptr;
    if (!w || !w->w || w->st != st || !IntArg(cycles.Get(i), 0, 65535, &cycle)) {
      ThrowType(env, "NativeLane: windows must be open windows of this model, cycles whole numbers 0-65535");
      return;
    }
    lw.push_back({w->w, (int)cycle});
    windows.push_back(w);
    windowRefs.push_back(Napi::Persistent(wv.As<Napi::Object>()));
  }
  prima_lane_config cfg = {};
  cfg.model = st->m;
  cfg.windows = lw.data();
  cfg.n_windows = (int)lw.size();
  // Every option is required (native/lane.ts types them): a misspelt one is an error, not a default.
  const struct { const char *key; int64_t lo, hi; } opts[] = {
      {"cycles", 1, 65535}, {"maxTokensPerFrame", 1, 65535}, {"maxPayloadBytes", 1, UINT32_MAX},
      {"maxMessageBytes", 1, INT64_C(1) << 40}, {"fragmentBytes", 1, UINT32_MAX},
      {"weightBytes", 0, INT64_C(1) << 52}, {"quickPassMs", 1, 3600000},
      {"maxQueuedBytes", 1, INT64_C(1) << 40},
  };
  // The liveness timings come from ring/liveness.ts's livenessRules() (fractions of the timeout).
  const struct { const char *key; double lo; double *to; } timings[] = {
      {"tickMs", 1, &cfg.tick_ms}, {"quietMs", 0, &cfg.quiet_ms}, {"deadAfterMs", 1, &cfg.dead_after_ms},
      {"closeGraceMs", 1, &cfg.close_grace_ms},
  };
  for (const auto &t : timings) {
    Napi::Value tv = o.Get(t.key);
    double d = tv.IsNumber() ? tv.As<Napi::Number>().DoubleValue() : -1;
    if (!(d >= t.lo && d <= 3.6e6)) {
      ThrowType(env, std::string("NativeLane: options.") + t.key + " must be a number of ms from " + std::to_string((int)t.lo) + " to 3600000");
      return;
    }
    *t.to = d;
  }
  int64_t v[sizeof opts / sizeof opts[0]];
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
    if (!IntArg(o.Get(opts[i].key), opts[i].lo, opts[i].hi, &v[i])) {
      ThrowType(env, std::string("NativeLane: options.") + opts[i].key + " must be a whole number from " +
                         std::to_string(opts[i].lo) + " to " + std::to_string(opts[i].hi));
      return;
    }
  }
  cfg.cycles = (int)v[0];
  cfg.hidden_size = (uint32_t)st->m->hp.n_embd;
  cfg.max_tokens_per_frame = (uint32_t)v[1];
  cfg.max_payload_bytes = (uint64_t)v[2];
  cfg.max_message_bytes = (uint64_t)v[3];
  cfg.fragment_bytes = (uint32_t)v[4];
  cfg.weight_bytes = (uint64_t)v[5];
  cfg.quick_pass_ms = (double)v[6];
  cfg.max_queued_bytes = (uint64_t)v[7];
  cfg.prefetch = o.Get("prefetch").ToBoolean().Value();
  cfg.on_event = &Lane::OnEvent;
  cfg.ctx = this;
  tsfn = Napi::ThreadSafeFunction::New(env, info[4].As<Napi::Function>(), "prima-lane", 0, 1);
  tsfn.Unref(env);
  char err[kErrLen] = {0};
  lane = prima_lane_start(&cfg, err, sizeof err);
  if (!lane) {
    tsfn.Release();
    ThrowErr(env, err);
    return;
  }
  for (Window *w : windows) w->busy++;
  st->busy++;
}

// On the lane thread: copy the event and hand it to the JS thread.
void Lane::OnEvent(void *ctx, const prima_lane_event *ev) {
  Lane *self = (Lane *)ctx;
  Event *e = new Event{ev->kind, ev->link, ev->code, ev->kind_name ? ev->kind_name : "", ev->text ? ev->text : "",
                       std::vector<uint8_t>(ev->data, ev->data + ev->len)};
  napi_status s = self->tsfn.NonBlockingCall(e, [](Napi::Env env, Napi::Function cb, Event *e) {
    static const char *kinds[] = {"frame", "failed", "closed", "error"};
    Napi::Object o = Napi::Object::New(env);
    o.Set("kind", kinds[e->kind]);
    o.Set("link", e->link == PRIMA_LANE_IN ? "in" : "out");
    o.Set("code", e->code);
    o.Set("failure", e->kindName);
    o.Set("text", e->text);
    if (e->kind == PRIMA_LANE_EV_FRAME) o.Set("data", Napi::Buffer<uint8_t>::Copy(env, e->data.data(), e->data.size()));
    delete e;
    cb.Call({o});
  });
  if (s != napi_ok) delete e;
}

void Lane::Stop() {
  if (!lane) return;
  if (runs > 0) {
    stopWanted = true;
    return;
  }
  prima_lane_stop(lane);
  lane = nullptr;
  tsfn.Release();
  for (Window *w : windows) w->busy--;
  st->busy--;
  windows.clear();
  windowRefs.clear();
}

bool Lane::Running(Napi::Env env) {
  if (lane && !stopWanted) return true;
  ThrowErr(env, "the lane is stopped");
  return false;
}

static int LinkArg(const Napi::Value &v) {
  if (!v.IsString()) return -1;
  std::string s = v.As<Napi::String>().Utf8Value();
  return s == "in" ? PRIMA_LANE_IN : s == "out" ? PRIMA_LANE_OUT : -1;
}

// One direction of a keyed link: { key: Uint8Array(32), seq: whole number }.
static bool SealArg(const Napi::Value &v, uint8_t *key, uint64_t *seq) {
  if (!v.IsObject()) return false;
  Napi::Object o = v.As<Napi::Object>();
  Napi::Value k = o.Get("key");
  int64_t s;
  if (!k.IsTypedArray() || k.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array || !IntArg(o.Get("seq"), 0, INT64_C(1) << 53, &s))
    return false;
  auto bytes = k.As<Napi::Uint8Array>();
  if (bytes.ByteLength() != PRIMA_WIRE_LINK_KEY_BYTES) return false;
  memcpy(key, bytes.Data(), PRIMA_WIRE_LINK_KEY_BYTES);
  *seq = (uint64_t)s;
  return true;
}

// attach("in" | "out", fd, crypto?: { tx: { key, seq }, rx: { key, seq } }): without crypto, a plaintext link.
Napi::Value Lane::Attach(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Running(env)) return env.Undefined();
  int64_t fd;
  int link = info.Length() > 0 ? LinkArg(info[0]) : -1;
  if (link < 0 || info.Length() < 2 || !IntArg(info[1], 0, 1 << 30, &fd)) return ThrowType(env, "attach(\"in\" | \"out\", fd, crypto?) expected");
  prima_lane_link_crypto crypto;
  bool keyed = info.Length() > 2 && !info[2].IsUndefined();
  if (keyed) {
    Napi::Object c = info[2].IsObject() ? info[2].As<Napi::Object>() : Napi::Object::New(env);
    if (!SealArg(c.Get("tx"), crypto.tx_key, &crypto.tx_seq) || !SealArg(c.Get("rx"), crypto.rx_key, &crypto.rx_seq)) {
      prima_seal_wipe(&crypto, sizeof crypto);
      return ThrowType(env, "attach: crypto must be { tx: { key: Uint8Array(32), seq }, rx: { key: Uint8Array(32), seq } }");
    }
  }
  char err[kErrLen] = {0};
  int rc = prima_lane_attach(lane, link, (int)fd, keyed ? &crypto : nullptr, err, sizeof err);
  prima_seal_wipe(&crypto, sizeof crypto);
  if (rc) return ThrowErr(env, err);
  return env.Undefined();
}

// send(frame: Uint8Array): a whole frame to the successor.
Napi::Value Lane::Send(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Running(env)) return env.Undefined();
  if (info.Length() < 1 || !info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
    return ThrowType(env, "send(frame: Uint8Array) expected");
  auto b = info[0].As<Napi::Uint8Array>();
  prima_lane_send(lane, b.Data(), b.ByteLength());
  return env.Undefined();
}

Napi::Value Lane::Resume(const Napi::CallbackInfo &info) {
  if (Running(info.Env())) prima_lane_resume(lane);
  return info.Env().Undefined();
}

// closeLink("in" | "out", code (0: at once, no close frame), reason)
Napi::Value Lane::CloseLink(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Running(env)) return env.Undefined();
  int64_t code;
  int link = info.Length() > 0 ? LinkArg(info[0]) : -1;
  if (link < 0 || info.Length() < 2 || !IntArg(info[1], 0, 4999, &code))
    return ThrowType(env, "closeLink(\"in\" | \"out\", code, reason?) expected");
  std::string reason = info.Length() > 2 && info[2].IsString() ? info[2].As<Napi::String>().Utf8Value() : "";
  prima_lane_close_link(lane, link, (int)code, reason.c_str());
  return env.Undefined();
}

Napi::Value Lane::SetWeightRoom(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Running(env)) return env.Undefined();
  if (info.Length() < 1 || !info[0].IsNumber()) return ThrowType(env, "setWeightRoom(bytes) expected");
  double d = info[0].As<Napi::Number>().DoubleValue();
  prima_lane_set_weight_room(lane, !(d < 1.8e19) ? UINT64_MAX : d <= 0 ? 0 : (uint64_t)d);
  return env.Undefined();
}

Napi::Value Lane::SetReleaseAfterUse(const Napi::CallbackInfo &info) {
  if (Running(info.Env())) prima_lane_set_release_after_use(lane, info.Length() > 0 && info[0].ToBoolean().Value());
  return info.Env().Undefined();
}

// stats(): { waitMs, sendMs, descheduledMs, frames, windows: [{ computeMs, frames, tokens, majorFaults }] } (windows in
// the constructor's order)
Napi::Value Lane::Stats(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Running(env)) return env.Undefined();
  prima_lane_stats s;
  std::vector<prima_lane_window_stats> ws(windows.size());
  prima_lane_read_stats(lane, &s, ws.data());
  Napi::Object o = Napi::Object::New(env);
  o.Set("waitMs", s.wait_ms);
  o.Set("sendMs", s.send_ms);
  o.Set("descheduledMs", s.descheduled_ms);
  o.Set("frames", (double)s.frames);
  Napi::Array a = Napi::Array::New(env, ws.size());
  for (size_t i = 0; i < ws.size(); i++) {
    Napi::Object w = Napi::Object::New(env);
    w.Set("computeMs", ws[i].compute_ms);
    w.Set("frames", (double)ws[i].frames);
    w.Set("tokens", (double)ws[i].tokens);
    w.Set("majorFaults", (double)ws[i].major_faults);
    a.Set((uint32_t)i, w);
  }
  o.Set("windows", a);
  return o;
}

Napi::Value Lane::ResetStats(const Napi::CallbackInfo &info) {
  if (Running(info.Env())) prima_lane_reset_stats(lane);
  return info.Env().Undefined();
}

struct KvJob {
  std::vector<Window *> *windows;
  int64_t position;  // -1: clear
};

static void RunKv(void *arg) {
  KvJob *job = (KvJob *)arg;
  for (Window *w : *job->windows) {
    if (job->position < 0) w->w->n_filled = 0;
    else if (job->position < w->w->n_filled) w->w->n_filled = (int)job->position;
  }
}

// kvClear(): every window's cache emptied, between frames.
Napi::Value Lane::KvClear(const Napi::CallbackInfo &info) {
  if (!Running(info.Env())) return info.Env().Undefined();
  KvJob job = {&windows, -1};
  prima_lane_exclusive(lane, RunKv, &job);
  return info.Env().Undefined();
}

// kvTruncate(position): every window keeps at most the first `position` tokens, between frames.
Napi::Value Lane::KvTruncate(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Running(env)) return env.Undefined();
  int64_t pos;
  if (info.Length() < 1 || !IntArg(info[0], 0, 1 << 30, &pos)) return ThrowType(env, "kvTruncate(position) expected");
  KvJob job = {&windows, pos};
  prima_lane_exclusive(lane, RunKv, &job);
  return env.Undefined();
}

struct KvShiftJob {
  std::vector<Window *> *windows;
  int p0, d, n_past;
  char err[kErrLen];
  int rc;
};

static void RunKvShift(void *arg) {
  KvShiftJob *job = (KvShiftJob *)arg;
  for (Window *w : *job->windows)
    if (job->rc == 0) job->rc = prima_window_kv_shift(w->w, job->p0, job->d, job->n_past, job->err, sizeof job->err);
}

// kvShift(p0, nDiscard, nPast): every window's context shift, between frames.
Napi::Value Lane::KvShift(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Running(env)) return env.Undefined();
  int64_t p0, d, n_past;
  if (!ShiftArgs(info, &p0, &d, &n_past)) return ThrowType(env, "kvShift(p0, nDiscard, nPast) expected (nDiscard >= 1)");
  KvShiftJob job = {&windows, (int)p0, (int)d, (int)n_past, {0}, 0};
  prima_lane_exclusive(lane, RunKvShift, &job);
  if (job.rc != 0) return ThrowErr(env, job.err);
  return env.Undefined();
}

// Runs a frame the lane left to JS with code 1 on a libuv thread (prima_lane_run); the promise settles
// once its rows (or an ERROR frame) are queued for the successor.
class LaneRunWorker : public PromiseWorker {
 public:
  LaneRunWorker(Napi::Env env, Lane *lane, Napi::Object self, Napi::Buffer<uint8_t> frame)
      : PromiseWorker(env), lane(lane), data(frame.Data()), len(frame.Length()) {
    selfRef = Napi::Persistent(self);
    frameRef = Napi::Persistent(frame);
    lane->runs++;
  }
  void Execute() override {
    char err[kErrLen] = {0};
    if (prima_lane_run(lane->lane, data, len, err, sizeof err) != 0) SetError(err);
  }

 private:
  void Done() override {
    if (--lane->runs == 0 && lane->stopWanted) {
      lane->stopWanted = false;
      lane->Stop();
    }
  }
  Lane *lane;
  Napi::ObjectReference selfRef;
  Napi::Reference<Napi::Buffer<uint8_t>> frameRef;
  uint8_t *data;
  size_t len;
};

// runFrame(frame: Buffer): Promise<void>
Napi::Value Lane::RunFrame(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Running(env)) return env.Undefined();
  if (info.Length() < 1 || !info[0].IsBuffer()) return ThrowType(env, "runFrame(frame: Buffer) expected");
  auto *w = new LaneRunWorker(env, this, info.This().As<Napi::Object>(), info[0].As<Napi::Buffer<uint8_t>>());
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

// stop(): the thread ends and its sockets close (no close frames: closeLink first for those). With a
// runFrame pass in flight, the lane stops when it ends.
Napi::Value Lane::StopJs(const Napi::CallbackInfo &info) {
  Stop();
  return info.Env().Undefined();
}

// laneFrameCycle(frame, hiddenSize, maxTokensPerFrame, maxPayloadBytes): the cycle of an ACTIVATIONS
// frame the lane would run, or -1 (see prima_lane_frame_cycle; for the test that fuzzes it).
Napi::Value LaneFrameCycle(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int64_t hidden, tokens, payload;
  if (info.Length() < 4 || !info[0].IsTypedArray() || !IntArg(info[1], 1, UINT32_MAX, &hidden) ||
      !IntArg(info[2], 1, 65535, &tokens) || !IntArg(info[3], 1, UINT32_MAX, &payload))
    return ThrowType(env, "laneFrameCycle(frame: Uint8Array, hiddenSize, maxTokensPerFrame, maxPayloadBytes) expected");
  Napi::TypedArray t = info[0].As<Napi::TypedArray>();
  const uint8_t *p = (const uint8_t *)t.ArrayBuffer().Data() + t.ByteOffset();
  return Napi::Number::New(env, prima_lane_frame_cycle((uint32_t)hidden, (uint32_t)tokens, (uint64_t)payload, p, t.ByteLength()));
}

}  // namespace

void RegisterModel(Napi::Env env, Napi::Object exports) {
  Model::windowCtor = Napi::Persistent(Window::Define(env));
  Model::windowCtor.SuppressDestruct();
  exports.Set("NativeModel", Model::Define(env));
  exports.Set("NativeWindow", Model::windowCtor.Value());
  exports.Set("NativeLane", Lane::Define(env));
  exports.Set("laneFrameCycle", Napi::Function::New(env, LaneFrameCycle, "laneFrameCycle"));
  exports.Set("streamMarginBytes", Napi::Number::New(env, (double)PRIMA_STREAM_MARGIN_BYTES));
}

// JS surface of the model and its windows (native/model.ts types it). Every argument is checked here
// before it reaches C: a wrong length or an out-of-range id is a JS exception, never a crash.
#include "bind_model.h"

#include "napi_util.h"

#include <string>
#include <vector>

extern "C" {
#include "expert_prefetch.h"
#include "kernels.h"
#include "kv_cache.h"
#include "kv_shift.h"
}

namespace prima_bind {

using prima_napi::IntArg;
using prima_napi::kErrLen;
using prima_napi::ThrowErr;
using prima_napi::ThrowType;

class Model : public Napi::ObjectWrap<Model> {
 public:
  static Napi::Function Define(Napi::Env env);
  explicit Model(const Napi::CallbackInfo &info);

  std::shared_ptr<ModelState> st = std::make_shared<ModelState>();

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

// The classes' constructors, one pair per environment that loads the addon (the main thread and each
// worker thread or vm context): a reference made in one environment must not be used from another
// (V8 aborts the process), so they live in the environment's instance data, not in statics.
struct Constructors {
  Napi::FunctionReference model, window;
};

static Constructors *ConstructorsOf(Napi::Env env) { return env.GetInstanceData<Constructors>(); }

std::shared_ptr<ModelState> ModelStateOf(const Napi::Value &v) {
  Constructors *c = ConstructorsOf(v.Env());
  if (!v.IsObject() || !c || !v.As<Napi::Object>().InstanceOf(c->model.Value())) return nullptr;
  Model *model = Model::Unwrap(v.As<Napi::Object>());
  return model ? model->st : nullptr;
}

Window *WindowOf(const Napi::Value &v) {
  Constructors *c = ConstructorsOf(v.Env());
  if (!v.IsObject() || !c || !v.As<Napi::Object>().InstanceOf(c->window.Value())) return nullptr;
  return Window::Unwrap(v.As<Napi::Object>());
}

// ---- async work -------------------------------------------------------------------------------

// Runs a forward pass (or a head-only pass) on a libuv thread, which joins the model's pool as its
// thread 0; the promise settles on the JS thread.
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
  return ConstructorsOf(env)->window.New({info.This(), info.Length() > 0 ? info[0] : env.Undefined(),
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
                      InstanceMethod("streamBeyond", &Window::StreamBeyond),
                      InstanceMethod("expertPrefetch", &Window::ExpertPrefetch), InstanceMethod("residency", &Window::Residency),
                      InstanceMethod("expertResidency", &Window::ExpertResidency), InstanceMethod("expertsRandom", &Window::ExpertsRandom),
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
  std::shared_ptr<ModelState> model = ModelStateOf(info[0]);
  if (!model) {
    ThrowType(env, "window(...): the first argument is not a NativeModel");
    return;
  }
  if (!model->m) {
    ThrowErr(env, "model is closed");
    return;
  }
  const int L = model->m->hp.n_layers;
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
  w = prima_window_create(model->m, (int)first, (int)end, (int)ctx, (int)batch, (int)kv_types[0], (int)kv_types[1], err,
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
  st = model;
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
    Window *s = WindowOf(v);
    if (!s) return ThrowType(env, "forwardSeqs: windows[" + std::to_string(i) + "] is not a NativeWindow");
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
    if (!IntArg(info[0], 0, INT64_C(1) << 52, &v)) return ThrowType(info.Env(), "prefetch(maxBytes?, background?) needs a byte count >= 0");
    maxBytes = (uint64_t)v;
  }
  const bool background = info.Length() > 1 && info[1].IsBoolean() && info[1].As<Napi::Boolean>().Value();
  const int rc = background ? prima_window_prefetch_background(w, maxBytes) : prima_window_prefetch(w, maxBytes);
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
  const bool experts = info.Length() > 1 && info[1].IsBoolean() && info[1].As<Napi::Boolean>().Value();
  prima_window_stream_beyond(w, (uint64_t)room, experts ? 1 : 0);
  return info.Env().Undefined();
}

// expertPrefetch("off" | "ahead" | "early" | "exact"): when a MoE layer's experts are predicted and advised
Napi::Value Window::ExpertPrefetch(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Alive(env)) return env.Undefined();
  const std::string mode = info.Length() > 0 && info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : "";
  const int m = mode == "off" ? PRIMA_XP_OFF : mode == "ahead" ? PRIMA_XP_AHEAD : mode == "exact" ? PRIMA_XP_EXACT : mode == "early" ? PRIMA_XP_EARLY : -1;
  if (m < 0) return ThrowType(env, "expertPrefetch(mode) needs \"off\", \"ahead\", \"early\" or \"exact\"");
  char err[kErrLen] = {0};
  if (prima_window_expert_prefetch(w, m, err, sizeof err)) return ThrowErr(env, err);
  return env.Undefined();
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

Napi::Value Window::ExpertsRandom(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Alive(env)) return env.Undefined();
  const int random = info.Length() > 0 && info[0].ToBoolean().Value() ? 1 : 0;
  const int rc = prima_window_experts_random(w, random);
  if (rc) return ThrowErr(env, std::string("madvise on the experts failed: ") + strerror(rc));
  w->experts_random = random;
  w->experts_random_pinned = 1;
  return env.Undefined();
}

Napi::Value Window::ExpertResidency(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Alive(env)) return env.Undefined();
  Napi::Object o = Napi::Object::New(env);
  uint64_t xr = 0, xt = 0;
  const int xrc = prima_window_expert_residency(w, &xr, &xt);
  if (xrc) return ThrowErr(env, std::string("expert residency failed: ") + strerror(xrc));
  o.Set("expertsResident", Napi::Number::New(env, (double)xr));
  o.Set("expertsTotal", Napi::Number::New(env, (double)xt));
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
bool ShiftArgs(const Napi::CallbackInfo &info, int64_t *p0, int64_t *d, int64_t *n_past) {
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
    // the expert prefetch's prediction against the routing (expert_prefetch.h)
    const prima_xp_counters c = prima_window_expert_prefetch_counters(w);
    Napi::Object xp = Napi::Object::New(env);
    xp.Set("layers", Napi::Number::New(env, (double)c.layers));
    xp.Set("predicted", Napi::Number::New(env, (double)c.predicted));
    xp.Set("hits", Napi::Number::New(env, (double)c.hits));
    xp.Set("misses", Napi::Number::New(env, (double)c.misses));
    xp.Set("advisedBytes", Napi::Number::New(env, (double)c.advised_bytes));
    xp.Set("usedBytes", Napi::Number::New(env, (double)c.used_bytes));
    xp.Set("wastedBytes", Napi::Number::New(env, (double)c.wasted_bytes));
    o.Set("expertPrefetch", xp);
  }
  return o;
}

Napi::Value Window::Close(const Napi::CallbackInfo &info) {
  if (busy > 0) return ThrowErr(info.Env(), "window is busy: wait for its forward pass before closing it");
  Free();
  return info.Env().Undefined();
}


}  // namespace prima_bind

using namespace prima_bind;

void RegisterModel(Napi::Env env, Napi::Object exports) {
  auto *c = new Constructors{Napi::Persistent(Model::Define(env)), Napi::Persistent(Window::Define(env))};
  env.SetInstanceData(c);  // deleted with the environment
  exports.Set("NativeModel", c->model.Value());
  exports.Set("NativeWindow", c->window.Value());
  exports.Set("streamMarginBytes", Napi::Number::New(env, (double)PRIMA_STREAM_MARGIN_BYTES));
}

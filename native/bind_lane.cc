// JS surface of the lane (native/lane.ts types it; src/lane.h is the C side): a ring worker's data
// path over windows of a model opened by bind_model.cc. Every argument is checked here before it
// reaches C.
#include "bind_model.h"

#include "napi_util.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "kv_shift.h"
#include "lane.h"
#include "seal.h"
}

namespace {

using namespace prima_bind;
using prima_napi::IntArg;
using prima_napi::kErrLen;
using prima_napi::ThrowErr;
using prima_napi::ThrowType;

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
  Napi::Value H2oScores(const Napi::CallbackInfo &info);
  Napi::Value StopJs(const Napi::CallbackInfo &info);
  Napi::Value RunFrame(const Napi::CallbackInfo &info);
  friend class LaneRunWorker;

  prima_lane *lane = nullptr;
  int runs = 0;             // runFrame passes in flight (they use the lane)
  bool stopWanted = false;  // stop() came while one was: the last one to finish stops
  std::shared_ptr<ModelState> st;
  std::vector<Napi::ObjectReference> windowRefs;
  std::vector<Window *> windows;
  // Per window, its sequence slots' windows (slots[i][0] is windows[i]); the lane reads slotPtrs.
  std::vector<std::vector<Window *>> slots;
  std::vector<std::vector<prima_window *>> slotPtrs;
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
                      InstanceMethod("kvShift", &Lane::KvShift), InstanceMethod("h2oScores", &Lane::H2oScores),
                      InstanceMethod("runFrame", &Lane::RunFrame), InstanceMethod("stop", &Lane::StopJs)});
}

Lane::Lane(const Napi::CallbackInfo &info) : Napi::ObjectWrap<Lane>(info) {
  Napi::Env env = info.Env();
  if (info.Length() < 5 || !info[0].IsObject() || !info[1].IsArray() || !info[2].IsArray() || !info[3].IsObject() ||
      !info[4].IsFunction()) {
    ThrowType(env, "new NativeLane(model, windows, cycles, options, onEvent) expected");
    return;
  }
  st = ModelStateOf(info[0]);
  if (!st) {
    ThrowType(env, "NativeLane: the first argument is not a NativeModel");
    return;
  }
  if (!st->m) {
    ThrowErr(env, "model is closed");
    return;
  }
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
    Window *w = WindowOf(wv);
    if (!w || !w->w || w->st != st || !IntArg(cycles.Get(i), 0, 65535, &cycle)) {
      ThrowType(env, "NativeLane: windows must be open windows of this model, cycles whole numbers 0-65535");
      return;
    }
    lw.push_back({w->w, (int)cycle, nullptr, 0});
    windows.push_back(w);
    windowRefs.push_back(Napi::Persistent(wv.As<Napi::Object>()));
  }
  // options.seqWindows (optional): per window, its sequence slots' windows, the window itself first.
  Napi::Value sv = o.Get("seqWindows");
  if (!sv.IsUndefined()) {
    const char *shape = "NativeLane: options.seqWindows must hold, per window, its slots' open windows over the same layers, the window first";
    if (!sv.IsArray() || sv.As<Napi::Array>().Length() != wins.Length()) {
      ThrowType(env, shape);
      return;
    }
    for (uint32_t i = 0; i < wins.Length(); i++) {
      Napi::Value row = sv.As<Napi::Array>().Get(i);
      // every window holds the same slots
      if (!row.IsArray() || row.As<Napi::Array>().Length() < 1 || row.As<Napi::Array>().Length() > 4096 ||
          (i > 0 && row.As<Napi::Array>().Length() != slots[0].size())) {
        ThrowType(env, shape);
        return;
      }
      std::vector<Window *> ws;
      std::vector<prima_window *> ps;
      for (uint32_t k = 0; k < row.As<Napi::Array>().Length(); k++) {
        Napi::Value v = row.As<Napi::Array>().Get(k);
        Window *w = WindowOf(v);
        if (!w || !w->w || w->st != st || w->w->first != windows[i]->w->first || w->w->end != windows[i]->w->end ||
            (k == 0) != (w == windows[i]) || std::find(ws.begin(), ws.end(), w) != ws.end()) {
          ThrowType(env, shape);
          return;
        }
        ws.push_back(w);
        ps.push_back(w->w);
        if (k > 0) windowRefs.push_back(Napi::Persistent(v.As<Napi::Object>()));
      }
      slots.push_back(ws);
      slotPtrs.push_back(ps);
    }
    for (size_t i = 0; i < lw.size(); i++) lw[i].seqs = slotPtrs[i].data(), lw[i].n_seqs = (int)slotPtrs[i].size();
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
  for (auto &row : slots)
    for (size_t k = 1; k < row.size(); k++) row[k]->busy++;
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
  for (auto &row : slots)
    for (size_t k = 1; k < row.size(); k++) row[k]->busy--;
  st->busy--;
  windows.clear();
  slots.clear();
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

// kvShift(p0, nDiscard, nPast, slot?): every window's context shift (of one sequence slot's windows
// with slot), between frames.
Napi::Value Lane::KvShift(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Running(env)) return env.Undefined();
  int64_t p0, d, n_past, slot = 0;
  if (!ShiftArgs(info, &p0, &d, &n_past)) return ThrowType(env, "kvShift(p0, nDiscard, nPast, slot?) expected (nDiscard >= 1)");
  const int64_t held = slots.empty() ? 1 : (int64_t)slots[0].size();
  if (info.Length() > 3 && !info[3].IsUndefined() && !IntArg(info[3], 0, 1 << 30, &slot))
    return ThrowType(env, "kvShift(p0, nDiscard, nPast, slot?) expected (nDiscard >= 1)");
  if (slot >= held) return ThrowErr(env, "sequence slot " + std::to_string(slot) + " is not on this device (it holds " + std::to_string(held) + ")");
  std::vector<Window *> targets;
  for (size_t i = 0; i < windows.size(); i++) targets.push_back(slots.empty() ? windows[i] : slots[i][(size_t)slot]);
  KvShiftJob job = {&targets, (int)p0, (int)d, (int)n_past, {0}, 0};
  prima_lane_exclusive(lane, RunKvShift, &job);
  if (job.rc != 0) return ThrowErr(env, job.err);
  return env.Undefined();
}

struct H2oJob {
  std::vector<Window *> *windows;
  std::vector<std::vector<float>> scores;  // empty for a window without the statistics
  std::vector<bool> gathered;
};

static void RunH2oScores(void *arg) {
  H2oJob *job = (H2oJob *)arg;
  for (Window *w : *job->windows) {
    job->gathered.push_back(w->w->h2o_acc != nullptr);
    job->scores.emplace_back(w->w->h2o_acc ? (size_t)w->w->n_filled : 0);
    if (w->w->h2o_acc) prima_window_h2o_scores(w->w, job->scores.back().data());
  }
}

// h2oScores(): each window's H2O statistics (NativeWindow.h2oScores: null without them), read between frames.
Napi::Value Lane::H2oScores(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!Running(env)) return env.Undefined();
  H2oJob job = {&windows, {}, {}};
  prima_lane_exclusive(lane, RunH2oScores, &job);
  Napi::Array out = Napi::Array::New(env, job.scores.size());
  for (size_t i = 0; i < job.scores.size(); i++) {
    if (!job.gathered[i]) {
      out.Set((uint32_t)i, env.Null());
      continue;
    }
    Napi::Float32Array a = Napi::Float32Array::New(env, job.scores[i].size());
    std::copy(job.scores[i].begin(), job.scores[i].end(), a.Data());
    out.Set((uint32_t)i, a);
  }
  return out;
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

void RegisterLane(Napi::Env env, Napi::Object exports) {
  exports.Set("NativeLane", Lane::Define(env));
  exports.Set("laneFrameCycle", Napi::Function::New(env, LaneFrameCycle, "laneFrameCycle"));
}

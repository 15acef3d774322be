// JS surface of the device micro-benchmarks (native/src/profile.h), for profiler/. Every argument is
// checked here; bad input is a JS exception naming the argument, never a crash. The calls are
// synchronous: profiling happens before a device joins a ring, and each call is bounded in time.
#include <napi.h>
#include <v8.h>

#include "napi_util.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <fcntl.h>
#include <sys/mman.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

extern "C" {
#include "kernels.h"
#include "profile.h"
#include "threadpool.h"
}

namespace {

using prima_napi::kErrLen;
Napi::Value Throw(Napi::Env env, const std::string &msg) { return prima_napi::ThrowErr(env, msg); }

bool Int(const Napi::CallbackInfo &info, size_t i, const char *what, double lo, double hi, double &out) {
  int64_t v;
  if (!prima_napi::IntArg(info[i], (int64_t)lo, (int64_t)hi, &v)) {
    Throw(info.Env(), std::string(what) + " must be a whole number in " + std::to_string((long long)lo) + ".." +
                          std::to_string((long long)hi) + " (got " + info[i].ToString().Utf8Value() + ")");
    return false;
  }
  out = (double)v;
  return true;
}

bool Seconds(const Napi::CallbackInfo &info, size_t i, const char *what, double &out) {
  const Napi::Value v = info[i];
  if (!v.IsNumber() || !std::isfinite(v.As<Napi::Number>().DoubleValue()) || v.As<Napi::Number>().DoubleValue() < 0 ||
      v.As<Napi::Number>().DoubleValue() > 60) {
    Throw(info.Env(), std::string(what) + " must be a number of seconds in 0..60");
    return false;
  }
  out = v.As<Napi::Number>().DoubleValue();
  return true;
}

bool Path(const Napi::CallbackInfo &info, size_t i, std::string &out) {
  if (!info[i].IsString() || info[i].As<Napi::String>().Utf8Value().empty()) {
    Throw(info.Env(), "path must be a non-empty string");
    return false;
  }
  out = info[i].As<Napi::String>().Utf8Value();
  if (out.find('\0') != std::string::npos) {
    Throw(info.Env(), "path must not contain NUL");
    return false;
  }
  return true;
}

// matmul([{type, ne0, ne1}, ...], nTokens, threads, workingSetBytes, minSeconds) -> {secondsPerPass, passes, copies}
Napi::Value Matmul(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (!info[0].IsArray()) return Throw(env, "matrices must be an array of {type, ne0, ne1}");
  Napi::Array list = info[0].As<Napi::Array>();
  const uint32_t n = list.Length();
  if (n < 1 || n > PRIMA_PROFILE_MAX_ITEMS) return Throw(env, "a step has 1.." + std::to_string(PRIMA_PROFILE_MAX_ITEMS) + " matrices, not " + std::to_string(n));
  int types[PRIMA_PROFILE_MAX_ITEMS];
  int64_t ne0s[PRIMA_PROFILE_MAX_ITEMS], ne1s[PRIMA_PROFILE_MAX_ITEMS];
  for (uint32_t i = 0; i < n; i++) {
    Napi::Value v = list.Get(i);
    if (!v.IsObject()) return Throw(env, "matrix " + std::to_string(i) + " must be an object {type, ne0, ne1}");
    Napi::Object o = v.As<Napi::Object>();
    const char *fields[3] = {"type", "ne0", "ne1"};
    const double hi[3] = {PRIMA_TYPE_COUNT - 1, 1 << 20, 1 << 22};
    double got[3];
    for (int f = 0; f < 3; f++) {
      Napi::Value x = o.Get(fields[f]);
      const double d = x.IsNumber() ? x.As<Napi::Number>().DoubleValue() : NAN;
      if (!std::isfinite(d) || d != std::floor(d) || d < (f == 0 ? 0 : 1) || d > hi[f])
        return Throw(env, "matrix " + std::to_string(i) + ": " + fields[f] + " must be a whole number in " +
                              std::to_string(f == 0 ? 0 : 1) + ".." + std::to_string((long long)hi[f]));
      got[f] = d;
    }
    types[i] = (int)got[0];
    ne0s[i] = (int64_t)got[1];
    ne1s[i] = (int64_t)got[2];
  }
  double nTokens, threads, ws, minS;
  if (!Int(info, 1, "nTokens", 1, PRIMA_MAX_NC * 64, nTokens) || !Int(info, 2, "threads", 1, 1024, threads) ||
      !Int(info, 3, "workingSetBytes", 0, (double)(1ull << 36), ws) || !Seconds(info, 4, "minSeconds", minS))
    return env.Undefined();
  prima_mm_bench r;
  char err[kErrLen] = {0};
  if (prima_profile_matmul(types, ne0s, ne1s, (int)n, (int)nTokens, (int)threads, (size_t)ws, minS, &r, err, sizeof err) != 0)
    return Throw(env, err);
  Napi::Object o = Napi::Object::New(env);
  o.Set("secondsPerPass", r.seconds_per_pass);
  o.Set("passes", r.passes);
  o.Set("copies", r.copies);
  return o;
}

// memRead(bytes, threads, minSeconds) -> bytes per second
Napi::Value MemRead(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  double bytes, threads, minS;
  if (!Int(info, 0, "bytes", 1 << 20, (double)(1ull << 34), bytes) || !Int(info, 1, "threads", 1, 1024, threads) ||
      !Seconds(info, 2, "minSeconds", minS))
    return env.Undefined();
  double bps = 0;
  char err[kErrLen] = {0};
  if (prima_profile_mem_read((size_t)bytes, (int)threads, minS, &bps, err, sizeof err) != 0) return Throw(env, err);
  return Napi::Number::New(env, bps);
}

// kvCopy(kvFloats, nCtx, minSeconds) -> seconds per write of one token's K and V rows
Napi::Value KvCopy(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  double kv, ctx, minS;
  if (!Int(info, 0, "kvFloats", 2, 1 << 22, kv) || !Int(info, 1, "nCtx", 1, 1 << 20, ctx) || !Seconds(info, 2, "minSeconds", minS))
    return env.Undefined();
  if ((int)kv % 2) return Throw(env, "kvFloats must be even (K and V rows of equal width)");
  double s = 0;
  char err[kErrLen] = {0};
  if (prima_profile_kv_copy((int)kv, (int)ctx, minS, &s, err, sizeof err) != 0) return Throw(env, err);
  return Napi::Number::New(env, s);
}

// disk(path, fileBytes, seqBlock, randBlock, seqSeconds, randSeconds, allowDirect) -> {seqBytesPerS, randBytesPerS, ...}
Napi::Value Disk(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  std::string path;
  double fileBytes, seqBlock, randBlock, seqS, randS;
  if (!Path(info, 0, path) || !Int(info, 1, "fileBytes", 4096, (double)(1ull << 40), fileBytes) ||
      !Int(info, 2, "seqBlock", 4096, 64 << 20, seqBlock) || !Int(info, 3, "randBlock", 4096, 64 << 20, randBlock) ||
      !Seconds(info, 4, "seqSeconds", seqS) || !Seconds(info, 5, "randSeconds", randS))
    return env.Undefined();
  if (!info[6].IsBoolean()) return Throw(env, "allowDirect must be true or false");
  const bool allowDirect = info[6].As<Napi::Boolean>().Value();
  prima_disk_bench r;
  char err[kErrLen] = {0};
  if (prima_profile_disk(path.c_str(), (uint64_t)fileBytes, (size_t)seqBlock, (size_t)randBlock, seqS, randS, allowDirect ? 1 : 0, &r, err,
                         sizeof err) != 0)
    return Throw(env, err);
  Napi::Object o = Napi::Object::New(env);
  o.Set("seqBytesPerS", r.seq_bytes_per_s);
  o.Set("seqCpuShare", r.seq_cpu_share);
  o.Set("randBytesPerS", r.rand_bytes_per_s);
  o.Set("seqBytesRead", (double)r.seq_bytes_read);
  o.Set("randReads", (double)r.rand_reads);
  o.Set("direct", r.direct != 0);
  return o;
}

// dropCache(path): write back and drop the file's cached pages.
Napi::Value DropCache(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  std::string path;
  if (!Path(info, 0, path)) return env.Undefined();
  char err[kErrLen] = {0};
  if (prima_profile_drop_cache(path.c_str(), err, sizeof err) != 0) return Throw(env, err);
  return env.Undefined();
}

// forgetRange(fd, offset, length): the page cache of a range of an open file, dropped where no
// process maps it (posix_fadvise DONTNEED; a no-op where the call does not exist). For reads that must
// not stay charged to this process's memory group (hashing other devices' windows).
Napi::Value ForgetRange(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  double fd, off, len;
  if (!Int(info, 0, "fd", 0, 2147483647, fd) || !Int(info, 1, "offset", 0, 9.0e15, off) || !Int(info, 2, "length", 0, 9.0e15, len)) return env.Undefined();
#if defined(POSIX_FADV_DONTNEED)
  posix_fadvise((int)fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
#endif
  return env.Undefined();
}

// ---- what a window call costs besides its layers ------------------------------------------------
// A pool whose idle threads sleep at once (as a ring device's do between tokens), and an async call
// that wakes them for one barrier, the way a window's forward is dispatched: JS -> libuv thread ->
// pool -> promise. Timing it from JS gives the per-call cost the layers' FLOPs do not include.

struct BenchPool {
  prima_pool *pool = nullptr;
  std::atomic<int> busy{0};
  bool closed = false;
};

void EmptyJob(const prima_task *t, void *) { prima_pool_barrier(t); }

class WakeWorker : public Napi::AsyncWorker {
 public:
  WakeWorker(Napi::Env env, BenchPool *p) : Napi::AsyncWorker(env), deferred(Napi::Promise::Deferred::New(env)), p(p) { p->busy++; }
  void Execute() override { prima_pool_run(p->pool, EmptyJob, nullptr); }
  void OnOK() override {
    p->busy--;
    deferred.Resolve(Env().Undefined());
  }
  void OnError(const Napi::Error &e) override {
    p->busy--;
    deferred.Reject(e.Value());
  }
  Napi::Promise Promise() { return deferred.Promise(); }

 private:
  Napi::Promise::Deferred deferred;
  BenchPool *p;
};

void FreePool(Napi::Env, BenchPool *p) {
  if (p->pool && p->busy == 0) prima_pool_destroy(p->pool);
  delete p;
}

// createPool(threads) -> handle: a pool whose idle threads sleep immediately.
Napi::Value CreatePool(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  double threads;
  if (!Int(info, 0, "threads", 1, 1024, threads)) return env.Undefined();
  auto *p = new BenchPool();
  p->pool = prima_pool_create((int)threads, 0);
  if (!p->pool) {
    delete p;
    return Throw(env, "cannot start a thread pool of " + std::to_string((int)threads) + " threads");
  }
  return Napi::External<BenchPool>::New(env, p, FreePool);
}

BenchPool *PoolArg(const Napi::CallbackInfo &info) {
  if (!info[0].IsExternal()) {
    Throw(info.Env(), "expected a pool from createPool()");
    return nullptr;
  }
  BenchPool *p = info[0].As<Napi::External<BenchPool>>().Data();
  if (p->closed) {
    Throw(info.Env(), "the pool is closed");
    return nullptr;
  }
  return p;
}

// wakePool(handle) -> Promise: one empty job (a barrier) on the pool, dispatched as a forward is.
Napi::Value WakePool(const Napi::CallbackInfo &info) {
  BenchPool *p = PoolArg(info);
  if (!p) return info.Env().Undefined();
  if (p->busy) return Throw(info.Env(), "the pool is already running a job");
  auto *w = new WakeWorker(info.Env(), p);
  Napi::Promise promise = w->Promise();
  w->Queue();
  return promise;
}

// closePool(handle): stops the pool's threads (once no job runs).
Napi::Value ClosePool(const Napi::CallbackInfo &info) {
  BenchPool *p = PoolArg(info);
  if (!p) return info.Env().Undefined();
  if (p->busy) return Throw(info.Env(), "the pool is running a job");
  prima_pool_destroy(p->pool);
  p->pool = nullptr;
  p->closed = true;
  return info.Env().Undefined();
}

/* Makes the process hold `bytes` more of anonymous memory for a moment, off the JS thread (a device's
 * heartbeats go on): pages mapped, populated by the kernel (zeroed, no user code runs meanwhile) and
 * unmapped again. Under a memory cgroup this makes reclaim take the group's idle file pages, as a
 * ring's windows do once they fill it (profiler's reclaimIdlePages). Resolves with whether the pages
 * could be had. */
class PressWorker : public Napi::AsyncWorker {
 public:
  PressWorker(Napi::Env env, size_t bytes) : Napi::AsyncWorker(env), deferred(Napi::Promise::Deferred::New(env)), bytes(bytes) {}
  void Execute() override {
#if defined(MAP_POPULATE)
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
#else
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED)
      for (size_t i = 0; i < bytes; i += 4096) ((volatile char *)p)[i] = 1;
#endif
    held = p != MAP_FAILED;
    if (held) munmap(p, bytes);
  }
  void OnOK() override { deferred.Resolve(Napi::Boolean::New(Env(), held)); }
  void OnError(const Napi::Error &e) override { deferred.Reject(e.Value()); }
  Napi::Promise Promise() { return deferred.Promise(); }

 private:
  Napi::Promise::Deferred deferred;
  size_t bytes;
  bool held = false;
};

Napi::Value PressMemory(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  double bytes;
  if (!Int(info, 0, "bytes", 1, 1e15, bytes)) return env.Undefined();
  auto *w = new PressWorker(env, (size_t)bytes);
  w->Queue();
  return w->Promise();
}

/* Frees what earlier work left behind, so that a reading of resident memory taken next is the live set:
 * V8's low-memory collection (full collections that also shrink the young generation, which a burst of
 * allocation had grown by tens of MiB, and free the buffers garbage held), then the C heap's free pages
 * handed back (glibc's malloc_trim; elsewhere nothing). Node offers no JS call for either. */
Napi::Value ReleaseFreeMemory(const Napi::CallbackInfo &info) {
  v8::Isolate *isolate = v8::Isolate::GetCurrent();
  if (isolate) isolate->LowMemoryNotification();
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  return info.Env().Undefined();
}

// threadClock(): [cpuMs, involuntary switches, voluntary switches] of the calling thread.
Napi::Value ThreadClock(const Napi::CallbackInfo &info) {
  prima_thread_clock c;
  prima_thread_clock_read(&c);
  Napi::Array a = Napi::Array::New(info.Env(), 3);
  a.Set(0u, c.cpu_ms);
  a.Set(1u, (double)c.involuntary);
  a.Set(2u, (double)c.voluntary);
  return a;
}

static prima_thread_clock ClockArg(const Napi::Value &v) {
  Napi::Array a = v.As<Napi::Array>();
  return prima_thread_clock{a.Get(0u).As<Napi::Number>().DoubleValue(), (long)a.Get(1u).As<Napi::Number>().Int64Value(),
                            (long)a.Get(2u).As<Napi::Number>().Int64Value()};
}

// descheduledMs(before, after, wallMs): prima_descheduled_ms over two threadClock() readings.
Napi::Value DescheduledMs(const Napi::CallbackInfo &info) {
  prima_thread_clock a = ClockArg(info[0]), b = ClockArg(info[1]);
  return Napi::Number::New(info.Env(), prima_descheduled_ms(&a, &b, info[2].As<Napi::Number>().DoubleValue()));
}

}  // namespace

void RegisterProfile(Napi::Env env, Napi::Object exports) {
  Napi::Object p = Napi::Object::New(env);
  p.Set("matmul", Napi::Function::New(env, Matmul, "matmul"));
  p.Set("memRead", Napi::Function::New(env, MemRead, "memRead"));
  p.Set("kvCopy", Napi::Function::New(env, KvCopy, "kvCopy"));
  p.Set("disk", Napi::Function::New(env, Disk, "disk"));
  p.Set("dropCache", Napi::Function::New(env, DropCache, "dropCache"));
  p.Set("forgetRange", Napi::Function::New(env, ForgetRange, "forgetRange"));
  p.Set("createPool", Napi::Function::New(env, CreatePool, "createPool"));
  p.Set("wakePool", Napi::Function::New(env, WakePool, "wakePool"));
  p.Set("closePool", Napi::Function::New(env, ClosePool, "closePool"));
  p.Set("pressMemory", Napi::Function::New(env, PressMemory, "pressMemory"));
  p.Set("releaseFreeMemory", Napi::Function::New(env, ReleaseFreeMemory, "releaseFreeMemory"));
  p.Set("threadClock", Napi::Function::New(env, ThreadClock, "threadClock"));
  p.Set("descheduledMs", Napi::Function::New(env, DescheduledMs, "descheduledMs"));
  exports.Set("profile", p);
}

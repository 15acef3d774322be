#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getcpu, CPU_* and pthread_setaffinity_np */
#endif
#include "threadpool.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <sys/resource.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void cpu_relax(void) { _mm_pause(); }
#elif defined(__aarch64__) || defined(__arm__)
static inline void cpu_relax(void) { __asm__ __volatile__("yield"); }
#else
static inline void cpu_relax(void) {}
#endif

struct prima_pool {
  int n;
  pthread_t *threads;
  prima_task *tasks;
  pthread_mutex_t run_mu; /* one job at a time */
  prima_job_fn fn;
  void *ctx;
  int64_t spin_ns;
  _Atomic int generation;
  _Atomic int n_done;
  _Atomic int stop;
  _Atomic int barrier_count;
  _Atomic int barrier_gen;
  _Atomic int chunk;
  _Atomic int sleepers; /* threads blocked in a futex: wakers skip the syscall when 0 */
  _Atomic int relaxed;  /* set by prima_pool_relax: idle workers sleep now rather than spin on */
  _Atomic int idle_word; /* what idle workers sleep on: changed by a new job and by prima_pool_prewake */
  int spread;           /* prima_pool_spread: hold the threads on distinct CPUs during each job */
  int spread_cpu;       /* the CPU the workers were last kept off (-1: none yet) */
  int64_t wait_spin_ns; /* how long the running job's threads spin at barriers before sleeping */
#ifdef __linux__
  cpu_set_t caller_cpus; /* the calling thread's own CPU set, given back after the job */
  cpu_set_t spread_from; /* the caller's CPU set when the workers were last kept off spread_cpu */
#endif
};

/* Spinning is right while every thread has a core; when the device is busy with other programs the
 * thread we wait for may not be running, and spinning would steal its time. So: spin briefly, then
 * sleep until the value changes (a futex on Linux, yielding elsewhere). */
#define SPIN_NS 20000
/* A spread pass holds its CPUs (one thread each), so a thread waiting for the others takes no core
 * from them by spinning; sleeping costs a wake-up, which on a virtual CPU that halted can take
 * 0.1-0.8 ms (perf sched) and staggers the threads so the next barrier waits again. */
#define SPREAD_SPIN_NS 1000000

static int64_t now_ns(void);

/* Spins until *addr != val, for up to spin_ns (and, if relaxable, only until the pool is relaxed).
 * Returns whether it changed. */
static int spin_until_change(prima_pool *p, _Atomic int *addr, int val, int64_t spin_ns, int relaxable) {
  int64_t deadline = 0;
  for (int i = 1;; i++) {
    if (atomic_load_explicit(addr, memory_order_acquire) != val) return 1;
    cpu_relax();
    if ((i & 63) == 0) {
      if (relaxable && atomic_load_explicit(&p->relaxed, memory_order_relaxed)) return 0;
      const int64_t t = now_ns();
      if (deadline == 0) deadline = t + spin_ns;
      else if (t > deadline) return 0;
    }
  }
}

static void futex_wait(_Atomic int *addr, int val) {
#ifdef __linux__
  syscall(SYS_futex, (int *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
  (void)addr;
  (void)val;
  sched_yield();
#endif
}

static void wait_change(prima_pool *p, _Atomic int *addr, int val, int64_t spin_ns) {
  if (spin_until_change(p, addr, val, spin_ns, 0)) return;
  atomic_fetch_add(&p->sleepers, 1);
  while (atomic_load(addr) == val) futex_wait(addr, val);
  atomic_fetch_sub(&p->sleepers, 1);
}

static void wake_all(prima_pool *p, _Atomic int *addr) {
#ifdef __linux__
  if (atomic_load(&p->sleepers) > 0) syscall(SYS_futex, (int *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
  (void)p;
  (void)addr;
#endif
}

/* Idle workers sleep on idle_word, which changes for a new job and for a prewake. */
static void wake_idle(prima_pool *p) {
  atomic_fetch_add(&p->idle_word, 1);
  wake_all(p, &p->idle_word);
}

/* An idle worker waits for the job after `seen`: it spins, then sleeps until a job starts, or until a
 * prewake sends it back to spinning. */
static void wait_job(prima_pool *p, int seen) {
  while (!spin_until_change(p, &p->generation, seen, p->spin_ns, 1)) {
    atomic_fetch_add(&p->sleepers, 1);
    int word;
    do {
      word = atomic_load(&p->idle_word);
      if (atomic_load(&p->generation) != seen) break; /* the spin above returns at once */
      futex_wait(&p->idle_word, word);
    } while (atomic_load(&p->idle_word) == word); /* changed: a job, or a prewake (spin again) */
    atomic_fetch_sub(&p->sleepers, 1);
  }
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *worker_main(void *arg) {
  prima_task *t = (prima_task *)arg;
  prima_pool *p = t->pool;
  int seen = 0;
  for (;;) {
    /* The next job of a token loop usually comes within microseconds: spin longer here. */
    wait_job(p, seen);
    if (atomic_load(&p->stop)) break;
    seen = atomic_load_explicit(&p->generation, memory_order_acquire);
    p->fn(t, p->ctx);
    atomic_fetch_add_explicit(&p->n_done, 1, memory_order_release);
    wake_all(p, &p->n_done);
  }
  return NULL;
}

prima_pool *prima_pool_create(int n_threads, int idle_spin_us) {
  if (n_threads < 1) n_threads = 1;
  prima_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = n_threads;
  p->tasks = calloc((size_t)n_threads, sizeof *p->tasks);
  p->threads = calloc((size_t)n_threads, sizeof *p->threads);
  if (!p->tasks || !p->threads) goto fail;
  const char *spin = getenv("PRIMA_SPIN_US");
  p->spin_ns = (int64_t)(idle_spin_us >= 0 ? idle_spin_us : spin ? atoll(spin) : 300) * 1000;
  pthread_mutex_init(&p->run_mu, NULL);
  atomic_store(&p->chunk, n_threads);
  for (int i = 0; i < n_threads; i++) p->tasks[i] = (prima_task){ .pool = p, .ith = i, .nth = n_threads };
  for (int i = 1; i < n_threads; i++) {
    if (pthread_create(&p->threads[i], NULL, worker_main, &p->tasks[i]) != 0) {
      p->n = i; /* destroy joins the ones that started */
      prima_pool_destroy(p);
      return NULL;
    }
  }
  return p;
fail:
  free(p->tasks);
  free(p->threads);
  free(p);
  return NULL;
}

void prima_pool_destroy(prima_pool *p) {
  if (!p) return;
  atomic_store(&p->stop, 1);
  atomic_fetch_add(&p->generation, 1);
  wake_idle(p);
  for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
  pthread_mutex_destroy(&p->run_mu);
  free(p->tasks);
  free(p->threads);
  free(p);
}

int prima_pool_threads(const prima_pool *p) { return p->n; }

void prima_pool_relax(prima_pool *p) { atomic_store_explicit(&p->relaxed, 1, memory_order_relaxed); }

void prima_pool_prewake(prima_pool *p) {
  atomic_store_explicit(&p->relaxed, 0, memory_order_relaxed);
  wake_idle(p);
}

void prima_pool_spread(prima_pool *p, int on) {
  p->spread = on && p->n > 1;
  p->spread_cpu = -1;
}

#ifdef __linux__
static void set_workers_cpus(prima_pool *p, const cpu_set_t *cpus) {
  for (int i = 1; i < p->n; i++) pthread_setaffinity_np(p->threads[i], sizeof *cpus, cpus);
}
#endif

/* The caller stays on the CPU it runs on, the workers keep off it (set again only when the caller
 * moved or its CPU set changed). Returns whether it did; the caller's own CPU set is kept to be given
 * back after the job. When it cannot spread, workers it had kept off a CPU get the caller's set. */
static int spread_begin(prima_pool *p) {
#ifdef __linux__
  const int c = sched_getcpu();
  if (c < 0 || sched_getaffinity(0, sizeof p->caller_cpus, &p->caller_cpus) != 0) return 0;
  if (!CPU_ISSET(c, &p->caller_cpus) || CPU_COUNT(&p->caller_cpus) < p->n) {
    if (p->spread_cpu >= 0) set_workers_cpus(p, &p->caller_cpus);
    p->spread_cpu = -1;
    return 0;
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(c, &one);
  if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) != 0) return 0;
  if (c != p->spread_cpu || !CPU_EQUAL(&p->spread_from, &p->caller_cpus)) {
    cpu_set_t rest = p->caller_cpus;
    CPU_CLR(c, &rest);
    set_workers_cpus(p, &rest);
    p->spread_cpu = c;
    p->spread_from = p->caller_cpus;
  }
  return 1;
#else
  (void)p;
  return 0;
#endif
}

static void spread_end(prima_pool *p) {
#ifdef __linux__
  pthread_setaffinity_np(pthread_self(), sizeof p->caller_cpus, &p->caller_cpus);
#else
  (void)p;
#endif
}

void prima_pool_run_alone(prima_pool *p, prima_job_fn fn, void *ctx) {
  pthread_mutex_lock(&p->run_mu);
  const prima_task solo = { .pool = p, .ith = 0, .nth = 1 };
  atomic_store(&p->chunk, 1);
  fn(&solo, ctx);
  pthread_mutex_unlock(&p->run_mu);
}

void prima_pool_run(prima_pool *p, prima_job_fn fn, void *ctx) {
  pthread_mutex_lock(&p->run_mu);
  p->fn = fn;
  p->ctx = ctx;
  atomic_store(&p->n_done, 0);
  atomic_store(&p->chunk, p->n);
  atomic_store(&p->barrier_count, 0);
  atomic_store_explicit(&p->relaxed, 0, memory_order_relaxed);
  const int spread = p->spread && spread_begin(p); /* before the workers see the job */
  p->wait_spin_ns = spread ? SPREAD_SPIN_NS : SPIN_NS;
  atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
  wake_idle(p);
  fn(&p->tasks[0], ctx);
  for (int done; (done = atomic_load_explicit(&p->n_done, memory_order_acquire)) < p->n - 1;)
    wait_change(p, &p->n_done, done, p->wait_spin_ns);
  if (spread) spread_end(p);
  pthread_mutex_unlock(&p->run_mu);
}

void prima_pool_barrier(const prima_task *t) {
  prima_pool *p = t->pool;
  if (t->nth == 1) {
    atomic_store_explicit(&p->chunk, 1, memory_order_relaxed);
    return;
  }
  int gen = atomic_load_explicit(&p->barrier_gen, memory_order_acquire);
  if (atomic_fetch_add_explicit(&p->barrier_count, 1, memory_order_acq_rel) == t->nth - 1) {
    atomic_store_explicit(&p->barrier_count, 0, memory_order_relaxed);
    atomic_store_explicit(&p->chunk, t->nth, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->barrier_gen, 1, memory_order_release);
    wake_all(p, &p->barrier_gen);
  } else {
    wait_change(p, &p->barrier_gen, gen, p->wait_spin_ns);
  }
}

int prima_pool_next_chunk(const prima_task *t) {
  return atomic_fetch_add_explicit(&t->pool->chunk, 1, memory_order_relaxed);
}

void prima_thread_clock_read(prima_thread_clock *c) {
  struct timespec ts = {0, 0};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  c->cpu_ms = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
  c->involuntary = c->voluntary = 0;
#ifdef RUSAGE_THREAD
  struct rusage ru;
  if (getrusage(RUSAGE_THREAD, &ru) == 0) {
    c->involuntary = ru.ru_nivcsw;
    c->voluntary = ru.ru_nvcsw;
  }
#endif
}

double prima_descheduled_ms(const prima_thread_clock *before, const prima_thread_clock *after, double wall_ms) {
  if (after->involuntary <= before->involuntary || after->voluntary != before->voluntary) return 0;
  double d = wall_ms - (after->cpu_ms - before->cpu_ms);
  return d > 0 ? d : 0;
}

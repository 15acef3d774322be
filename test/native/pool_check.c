/* The thread pool's CPU spreading (prima_pool_spread), in plain C: during a job the caller is held on
 * its CPU and the workers off it, the caller's own CPUs come back after the job, threads waiting at a
 * barrier of a spread job keep their CPU (spin) rather than sleep, and a process with fewer CPUs than
 * threads leaves spreading off (workers it had moved get the caller's CPUs). Also prima_pool_prewake:
 * relaxed (sleeping) workers wake and spin. Prints "pool ok" or the first failure. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "threadpool.h"

#define MAX_THREADS 8

typedef struct {
  int cpu[MAX_THREADS];
  cpu_set_t mask[MAX_THREADS];
  int ran[MAX_THREADS];
} record;

static void record_job(const prima_task *t, void *ctx) {
  record *r = ctx;
  prima_pool_barrier(t); /* every thread is up before any looks where it runs */
  r->cpu[t->ith] = sched_getcpu();
  sched_getaffinity(0, sizeof r->mask[t->ith], &r->mask[t->ith]);
  r->ran[t->ith] = 1;
}

/* Thread 0 arrives 300 us late at a barrier; the others count their voluntary context switches
 * (sleeps) while they wait for it, and everyone notes when they arrived. */
typedef struct {
  long sleeps[MAX_THREADS];
  long long arrived_ns[MAX_THREADS];
} late_record;

static long voluntary_switches(void) {
  struct rusage u;
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_nvcsw;
}

static long long mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void late_job(const prima_task *t, void *ctx) {
  late_record *r = ctx;
  prima_pool_barrier(t);
  if (t->ith == 0) {
    const long long start = mono_ns();
    while (mono_ns() - start < 300000) {
    }
  }
  const long before = voluntary_switches();
  r->arrived_ns[t->ith] = mono_ns();
  prima_pool_barrier(t);
  r->sleeps[t->ith] = voluntary_switches() - before;
}

static int fail(const char *what);

static void tid_job(const prima_task *t, void *ctx) { ((int *)ctx)[t->ith] = gettid(); }

/* The scheduler state letter of one of this process's threads (R running or runnable, S sleeping). */
static char thread_state(int tid) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
  FILE *f = fopen(path, "r");
  if (!f) return '?';
  const size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *close_paren = strrchr(buf, ')');
  return close_paren && close_paren[1] == ' ' ? close_paren[2] : '?';
}

static void sleep_ms(int ms) {
  struct timespec d = { ms / 1000, (long)(ms % 1000) * 1000000 };
  nanosleep(&d, NULL);
}

/* A relaxed pool's workers sleep; a prewake sets them spinning (for the pool's idle spin, 200 ms here). */
static int check_prewake(void) {
  prima_pool *p = prima_pool_create(2, 200000);
  if (!p) return fail("prima_pool_create");
  int tids[2] = { 0, 0 };
  prima_pool_run(p, tid_job, tids);
  prima_pool_relax(p);
  sleep_ms(30);
  if (thread_state(tids[1]) != 'S') return fail("a relaxed worker did not sleep");
  prima_pool_prewake(p);
  sleep_ms(30);
  if (thread_state(tids[1]) != 'R') return fail("a prewoken worker was not spinning");
  prima_pool_relax(p);
  sleep_ms(30);
  if (thread_state(tids[1]) != 'S') return fail("a prewoken worker did not sleep again once relaxed");
  int again[2] = { 0, 0 };
  prima_pool_run(p, tid_job, again);
  if (again[1] != tids[1]) return fail("the job after a prewake did not run on the worker");
  prima_pool_destroy(p);
  return 0;
}

static int fail(const char *what) {
  printf("pool check failed: %s\n", what);
  return 1;
}

int main(void) {
  cpu_set_t all;
  if (sched_getaffinity(0, sizeof all, &all) != 0) return fail("sched_getaffinity");
  const int n = CPU_COUNT(&all) < MAX_THREADS ? CPU_COUNT(&all) : MAX_THREADS;
  if (n < 2) {
    printf("pool ok (one CPU: nothing to spread)\n");
    return 0;
  }
  prima_pool *p = prima_pool_create(n, 0);
  if (!p) return fail("prima_pool_create");
  prima_pool_spread(p, 1);
  for (int round = 0; round < 20; round++) {
    record r;
    memset(&r, 0, sizeof r);
    prima_pool_run(p, record_job, &r);
    for (int i = 0; i < n; i++)
      if (!r.ran[i]) return fail("a thread did not run the job");
    if (CPU_COUNT(&r.mask[0]) != 1 || !CPU_ISSET(r.cpu[0], &r.mask[0])) return fail("the caller was not held on its CPU during the job");
    for (int i = 1; i < n; i++) {
      if (CPU_ISSET(r.cpu[0], &r.mask[i])) return fail("a worker may run on the caller's CPU");
      if (r.cpu[i] == r.cpu[0]) return fail("a worker ran on the caller's CPU");
    }
    cpu_set_t after;
    sched_getaffinity(0, sizeof after, &after);
    if (!CPU_EQUAL(&after, &all)) return fail("the caller's CPUs were not restored after the job");
    /* move the caller elsewhere now and then: the workers must follow the change */
    if (round % 5 == 4) {
      cpu_set_t other = all;
      CPU_CLR(r.cpu[0], &other);
      if (sched_setaffinity(0, sizeof other, &other) != 0) return fail("moving the caller");
      sched_setaffinity(0, sizeof all, &all); /* free again, but now running elsewhere */
      record moved;
      memset(&moved, 0, sizeof moved);
      prima_pool_run(p, record_job, &moved);
      if (moved.cpu[0] == r.cpu[0]) return fail("the caller did not move");
      for (int i = 1; i < n; i++)
        if (moved.cpu[i] == moved.cpu[0]) return fail("after the caller moved, a worker ran on its CPU");
    }
  }
  /* A round counts when the caller really was under 0.7 ms late: on a loaded machine its 300 us of
   * busy waiting can be preempted past the spin, and then sleeping is right. */
  int counted = 0;
  for (int round = 0; round < 50 && counted < 5; round++) {
    late_record r;
    memset(&r, 0, sizeof r);
    prima_pool_run(p, late_job, &r);
    for (int i = 1; i < n; i++) {
      if (r.arrived_ns[0] - r.arrived_ns[i] >= 700000) continue;
      counted++;
      if (r.sleeps[i] != 0) return fail("a worker slept at a barrier of a spread job while the caller was 300 us late");
    }
  }
  if (counted == 0) return fail("the caller was never less than 0.7 ms late (machine too busy to check barrier spinning)");

  /* the caller's CPU set narrows to fewer CPUs than threads: no spreading, and the workers it had kept
   * off the caller's CPU now get the caller's set rather than their old one */
  {
    record before;
    memset(&before, 0, sizeof before);
    prima_pool_run(p, record_job, &before);
    cpu_set_t mine;
    CPU_ZERO(&mine);
    CPU_SET(before.cpu[0], &mine);
    if (sched_setaffinity(0, sizeof mine, &mine) != 0) return fail("narrowing the caller");
    record narrow;
    memset(&narrow, 0, sizeof narrow);
    prima_pool_run(p, record_job, &narrow);
    for (int i = 1; i < n; i++)
      if (!CPU_EQUAL(&narrow.mask[i], &mine)) return fail("after the caller's CPUs narrowed, a worker kept its old CPU set");
    sched_setaffinity(0, sizeof all, &all);
  }
  prima_pool_destroy(p);

  /* fewer CPUs than threads: no spreading, the job still runs on every thread, the caller keeps its CPU */
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &all)) {
      CPU_SET(c, &one);
      break;
    }
  sched_setaffinity(0, sizeof one, &one);
  p = prima_pool_create(2, 0);
  if (!p) return fail("prima_pool_create");
  prima_pool_spread(p, 1);
  record r;
  memset(&r, 0, sizeof r);
  prima_pool_run(p, record_job, &r);
  if (!r.ran[0] || !r.ran[1]) return fail("with one CPU, a thread did not run the job");
  cpu_set_t kept;
  sched_getaffinity(0, sizeof kept, &kept);
  if (!CPU_EQUAL(&kept, &one)) return fail("with one CPU, the caller's CPU set changed");
  prima_pool_destroy(p);
  sched_setaffinity(0, sizeof all, &all);
  if (check_prewake()) return 1;
  printf("pool ok (%d threads)\n", n);
  return 0;
}

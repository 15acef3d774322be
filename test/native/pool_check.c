/* The thread pool's CPU spreading (prima_pool_spread), in plain C: during a job the caller is held on
 * its CPU and the workers off it, the caller's own CPUs come back after the job, threads waiting at a
 * barrier of a spread job keep their CPU (spin) rather than sleep, and a process with fewer CPUs than
 * threads leaves spreading off. Prints "pool ok" or the first failure. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

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
 * (sleeps) while they wait for it. */
typedef struct {
  long sleeps[MAX_THREADS];
} late_record;

static long voluntary_switches(void) {
  struct rusage u;
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_nvcsw;
}

static void late_job(const prima_task *t, void *ctx) {
  late_record *r = ctx;
  prima_pool_barrier(t);
  if (t->ith == 0) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    do clock_gettime(CLOCK_MONOTONIC, &b);
    while ((b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec) < 300000);
  }
  const long before = voluntary_switches();
  prima_pool_barrier(t);
  r->sleeps[t->ith] = voluntary_switches() - before;
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
  for (int round = 0; round < 5; round++) {
    late_record r;
    memset(&r, 0, sizeof r);
    prima_pool_run(p, late_job, &r);
    for (int i = 1; i < n; i++)
      if (r.sleeps[i] != 0) return fail("a worker slept at a barrier of a spread job while the caller was 300 us late");
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
  printf("pool ok (%d threads)\n", n);
  return 0;
}

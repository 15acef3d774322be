/* A persistent thread pool for one forward pass at a time.
 *
 * The caller of prima_pool_run becomes thread 0 and the pool's n-1 workers join it; inside the job
 * all threads meet at barriers between steps (prima_pool_barrier), so one wake-up pays for a whole
 * window of layers. Every wait spins briefly and then sleeps on a futex: spinning alone would steal
 * the core from the very thread being waited for when the device is busy with other programs, and
 * an idle device must not burn its CPU. PRIMA_SPIN_US sets the idle spin between jobs (default 300). */
#ifndef PRIMA_THREADPOOL_H
#define PRIMA_THREADPOOL_H

#include <stdint.h>

typedef struct prima_pool prima_pool;

/* Per-thread view handed to a job. */
typedef struct {
  prima_pool *pool;
  int ith; /* 0..nth-1; 0 is the caller */
  int nth;
} prima_task;

typedef void (*prima_job_fn)(const prima_task *t, void *ctx);

/* n_threads >= 1 in total (including the caller); idle_spin_us: how long idle workers spin for the next
 * job before sleeping (< 0: PRIMA_SPIN_US or 300). Returns NULL on failure. */
prima_pool *prima_pool_create(int n_threads, int idle_spin_us);
void prima_pool_destroy(prima_pool *p);
int prima_pool_threads(const prima_pool *p);

/* Runs fn on every thread and returns when all have finished. Jobs on one pool are serialized:
 * a second caller waits for the first job to end. */
void prima_pool_run(prima_pool *p, prima_job_fn fn, void *ctx);

/* Runs fn on the caller alone (nth = 1): for jobs too small to repay waking the workers and meeting
 * them at every barrier. Serialized with prima_pool_run. */
void prima_pool_run_alone(prima_pool *p, prima_job_fn fn, void *ctx);
/* No job is coming soon (a ring device handed its rows on): idle workers stop spinning and sleep, so
 * the cores go to whoever runs next. The next job wakes them as usual. */
void prima_pool_relax(prima_pool *p);

/* A job is coming soon (a ring device's input is arriving): sleeping workers wake and spin for it (for
 * the pool's idle spin), so waking them is off the job's critical path. */
void prima_pool_prewake(prima_pool *p);

/* During each job, hold the threads on distinct CPUs: the caller on the one it runs on, the workers
 * off it (Linux; needs at least as many CPUs as threads, else it stays off). For pools whose threads
 * all sleep between jobs, as a ring device's do: woken together, they were often stacked on one CPU
 * by the scheduler, trading places at every barrier for milliseconds while the other CPU idled.
 * Holding a CPU each, the threads of such a job spin longer at its barriers (up to 1 ms) before
 * sleeping: waking a thread whose CPU went idle can take most of a millisecond on a virtual CPU. */
void prima_pool_spread(prima_pool *p, int on);

/* All threads of the running job wait here until every one has arrived. */
void prima_pool_barrier(const prima_task *t);

/* Dynamic scheduling inside a step: thread ith takes chunk ith first, then calls this for the next
 * chunk index (nth, nth+1, ...). Every barrier (and every job start) resets the counter to nth, so
 * each step between two barriers has its own sequence. */
int prima_pool_next_chunk(const prima_task *t);

/* The calling thread's CPU time and context switches. Between two readings, a thread that was only
 * switched out involuntarily (preempted: on a shared host, by another device's threads) and never
 * blocked spent its wall time less its CPU time waiting for a CPU: prima_descheduled_ms. A thread that
 * also blocked may have waited on purpose (a barrier, a full socket, a page from disk), so that
 * interval counts none. */
typedef struct {
  double cpu_ms;
  long involuntary, voluntary;
} prima_thread_clock;
void prima_thread_clock_read(prima_thread_clock *c);
double prima_descheduled_ms(const prima_thread_clock *before, const prima_thread_clock *after, double wall_ms);

#endif

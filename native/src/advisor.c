#include "advisor.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

struct prima_advisor {
  const prima_model *m;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  int stop;           /* under lock */
  uint64_t gen;       /* the latest request's number (atomic): advice under way stops when it moves */
  uint64_t taken;     /* the last request the thread took (under lock) */
  uint64_t *pending;  /* the latest request's [lo, hi) pairs (under lock) */
  int n_pending, cap;
};

static void *advisor_main(void *arg) {
  prima_advisor *a = arg;
  uint64_t *mine = NULL;
  int cap = 0;
  pthread_mutex_lock(&a->lock);
  for (;;) {
    while (!a->stop && a->taken == __atomic_load_n(&a->gen, __ATOMIC_ACQUIRE)) pthread_cond_wait(&a->wake, &a->lock);
    if (a->stop) break;
    const uint64_t gen = a->taken = __atomic_load_n(&a->gen, __ATOMIC_ACQUIRE);
    const int n = a->n_pending;
    if (n > cap) {
      uint64_t *g = realloc(mine, sizeof *g * 2 * (size_t)n);
      if (!g) continue; /* advice is optional: skip this request */
      mine = g, cap = n;
    }
    if (n > 0) memcpy(mine, a->pending, sizeof *mine * 2 * (size_t)n);
    pthread_mutex_unlock(&a->lock);
    for (int i = 0; i < n; i++) prima_willneed(a->m, a->m->map + mine[2 * i], (size_t)(mine[2 * i + 1] - mine[2 * i]), &a->gen, gen);
    pthread_mutex_lock(&a->lock);
  }
  pthread_mutex_unlock(&a->lock);
  free(mine);
  return NULL;
}

prima_advisor *prima_advisor_start(const prima_model *m) {
  prima_advisor *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  a->m = m;
  if (pthread_mutex_init(&a->lock, NULL) != 0) {
    free(a);
    return NULL;
  }
  pthread_cond_init(&a->wake, NULL);
  if (pthread_create(&a->thread, NULL, advisor_main, a) != 0) {
    pthread_cond_destroy(&a->wake);
    pthread_mutex_destroy(&a->lock);
    free(a);
    return NULL;
  }
  return a;
}

int prima_advisor_request(prima_advisor *a, const uint64_t *ranges, int n) {
  pthread_mutex_lock(&a->lock);
  if (n > a->cap) {
    uint64_t *g = realloc(a->pending, sizeof *g * 2 * (size_t)n);
    if (!g) {
      pthread_mutex_unlock(&a->lock);
      return ENOMEM;
    }
    a->pending = g, a->cap = n;
  }
  if (n > 0) memcpy(a->pending, ranges, sizeof *ranges * 2 * (size_t)n);
  a->n_pending = n;
  __atomic_fetch_add(&a->gen, 1, __ATOMIC_ACQ_REL);
  pthread_cond_signal(&a->wake);
  pthread_mutex_unlock(&a->lock);
  return 0;
}

void prima_advisor_stop(prima_advisor *a) {
  if (!a) return;
  pthread_mutex_lock(&a->lock);
  a->stop = 1;
  __atomic_fetch_add(&a->gen, 1, __ATOMIC_ACQ_REL); /* stops advice under way too */
  pthread_cond_signal(&a->wake);
  pthread_mutex_unlock(&a->lock);
  pthread_join(a->thread, NULL);
  pthread_cond_destroy(&a->wake);
  pthread_mutex_destroy(&a->lock);
  free(a->pending);
  free(a);
}

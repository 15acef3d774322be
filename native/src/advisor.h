#ifndef PRIMA_ADVISOR_H
#define PRIMA_ADVISOR_H

#include <stdint.h>

struct prima_model;

/* A thread that gives MADV_WILLNEED advice on byte ranges of a model's mapping, off its caller's
 * thread: advice that reads allocates the pages and queues their reads before it returns (~25 ms for
 * 100 MiB here), which delayed the pass or the frame it was meant to hide behind. The latest request
 * replaces one not yet taken, and stops one under way between pieces (prima_willneed): by then what it
 * was for is running. */
typedef struct prima_advisor prima_advisor;

/* NULL where no thread can be started (the caller advises itself, or not at all). */
prima_advisor *prima_advisor_start(const struct prima_model *m);
/* n [lo, hi) pairs of file offsets, copied. 0, or ENOMEM (the request is dropped: advice is optional). */
int prima_advisor_request(prima_advisor *a, const uint64_t *ranges, int n);
/* Stops the thread (and any advice under way) and frees it; NULL is a no-op. */
void prima_advisor_stop(prima_advisor *a);

#endif

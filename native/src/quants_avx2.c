/* AVX2/FMA/F16C twins of quants.c (compiled with -mavx2 -mfma -mf16c into its own static library, and
 * only called after kernels.c saw the CPU run them). */
#include <immintrin.h>
#include <string.h>

#include "quants.h"

void prima_avx2_fns(prima_level_fns *f) { memset(f, 0, sizeof *f); }

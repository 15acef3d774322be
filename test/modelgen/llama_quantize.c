/* llama.cpp's own quantizer as an oracle for the model generator: runs llama_model_quantize (what
 * llama-quantize does, no importance matrix) from node-llama-cpp's prebuilt libllama on a GGUF.
 *
 *   llama_quantize <libdir> <in.gguf> <out.gguf> <llama_ftype> <pure 0|1>
 *
 * Compiled with gcc at test time against the llama.h bundled with node-llama-cpp (same release as the
 * prebuilt library). Exit status 0 on success, 2 with a message on stderr otherwise. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: llama_quantize <libdir> <in.gguf> <out.gguf> <llama_ftype> <pure 0|1>\n");
    return 2;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/libllama.v0.5.0.so", argv[1]);
  void *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    fprintf(stderr, "llama_quantize: dlopen %s failed: %s\n", path, dlerror());
    return 2;
  }
  void (*backend_init)(void) = (void (*)(void))dlsym(lib, "llama_backend_init");
  struct llama_model_quantize_params (*defaults)(void) =
      (struct llama_model_quantize_params(*)(void))dlsym(lib, "llama_model_quantize_default_params");
  uint32_t (*quantize)(const char *, const char *, const struct llama_model_quantize_params *) =
      (uint32_t(*)(const char *, const char *, const struct llama_model_quantize_params *))dlsym(lib, "llama_model_quantize");
  if (!backend_init || !defaults || !quantize) {
    fprintf(stderr, "llama_quantize: missing symbols in %s\n", path);
    return 2;
  }
  backend_init();
  struct llama_model_quantize_params p = defaults();
  p.nthread = 1;
  p.ftype = (enum llama_ftype)atoi(argv[4]);
  p.pure = atoi(argv[5]) != 0;
  uint32_t rc = quantize(argv[2], argv[3], &p);
  if (rc != 0) {
    fprintf(stderr, "llama_quantize: llama_model_quantize returned %u\n", rc);
    return 2;
  }
  return 0;
}

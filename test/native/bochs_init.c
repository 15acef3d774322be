/* PID 1 of the Linux that test/native/bochs.ts boots under bochs: says which AVX-512 extensions the
 * emulated CPU reports, runs simd_check in a child (so an illegal instruction is reported, not a kernel
 * panic), and powers the machine off (bochs then exits). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/reboot.h>
#include <sys/wait.h>
#include <unistd.h>

int simd_check_main(void);

int main(void) {
  __builtin_cpu_init();
  printf("cpu avx512f %d avx512bw %d avx512dq %d avx512vl %d avx512vnni %d\n", !!__builtin_cpu_supports("avx512f"),
         !!__builtin_cpu_supports("avx512bw"), !!__builtin_cpu_supports("avx512dq"), !!__builtin_cpu_supports("avx512vl"),
         !!__builtin_cpu_supports("avx512vnni"));
  fflush(stdout);
  const pid_t child = fork();
  if (child == 0) {
    const int status = simd_check_main();
    fflush(stdout);
    _exit(status);
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) < 0) printf("simd_check could not run\n");
  else if (WIFSIGNALED(status)) printf("simd_check killed by signal %d\n", WTERMSIG(status));
  else printf("simd_check exit %d\n", WEXITSTATUS(status));
  fflush(stdout);
  sync();
  sleep(1); /* let the serial port drain before the power goes */
  reboot(RB_POWER_OFF);
  for (;;) pause();
}

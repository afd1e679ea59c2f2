/* Minimal pod sandbox ("pause") process for the test cluster: sleeps until
 * SIGINT/SIGTERM, reaps zombies (it is PID 1 of the pod when the PID
 * namespace is shared). Built with gcc -static by tests/cluster/build-images. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) { _exit(0); }
static void on_chld(int sig) { while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) { puts("pause (mcp-k8s-test)"); return 0; }
  if (getpid() != 1) fprintf(stderr, "pause: warning: not PID 1\n");
  struct sigaction sa = {0};
  sa.sa_handler = on_term;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sa.sa_handler = on_chld;
  sa.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, NULL);
  for (;;) pause();
}

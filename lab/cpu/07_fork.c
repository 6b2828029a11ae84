/*
 * lab/cpu/07_fork.c: a child forked after the thread pool exists can still run attention
 * (the pool is reset in the child). Exits 0 on success; hangs without the atfork handler.
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude lab/cpu/07_fork.c build-cpu/libflashattn.a -lm -pthread
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flashattn.h"

int main(void) {
    enum { S = 200, H = 4, D = 64 };
    static float q[S * H * D], k[S * H * D], v[S * H * D], o[S * H * D], o_child[S * H * D];
    for (int i = 0; i < S * H * D; i++) q[i] = (float)(i % 7) * 0.1f, k[i] = (float)(i % 5) * 0.1f, v[i] = 1.0f;
    fa_params p;
    memset(&p, 0, sizeof p);
    p.batch = 1, p.seqlen_q = S, p.seqlen_k = S, p.heads_q = H, p.heads_kv = H, p.head_dim = D;
    p.q = q, p.k = k, p.v = v, p.o = o, p.num_threads = 2;
    fa_set_contiguous_strides(&p);
    if (fa_forward(&p) != FA_OK) return 1;
    pid_t child = fork();
    if (child == 0) {
        p.o = o_child;
        alarm(20);
        int ok = fa_forward(&p) == FA_OK && memcmp(o, o_child, sizeof o) == 0;
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    waitpid(child, &status, 0);
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 && fa_forward(&p) == FA_OK;
    printf("%s fork after the pool started\n", ok ? "pass" : "FAIL");
    return !ok;
}

/* scratch: debug the backward sample error */
#include <stdio.h>
#include "../../tools/bench.h"
#include "../../tests/reference.h"
int main(void) {
    bench_case c = {0};
    c.impl = IMPL_FLASH; c.dtype = FA_DTYPE_F32; c.mode = BENCH_BWD; c.b = 1; c.hq = 1; c.hkv = 1; c.sq = 8; c.sk = 8; c.d = 4; c.dv = 4; c.threads = 1; c.threads_used = 1; c.seed = 1;
    c.window_left = c.window_right = -1;
    fa_params p; bench_tensors t;
    bench_alloc_tensors(&c, &p, &t);
    printf("fwd %d\n", fa_forward(&p));
    printf("bwd %d %s\n", fa_backward(&p), fa_last_error());
    for (int i = 0; i < 8; i++) printf("%g ", ((float*)t.dq)[i*4]);
    printf("\nerr %g\n", bench_sample_error_backward(&p, t.dq));
    return 0;
}

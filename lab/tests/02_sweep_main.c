/* lab/tests/02: drives fa_sweep_run without the CLI: 02_sweep_main [quick|full|cuda] [seed] [dtype] */
#include <stdlib.h>
#include <string.h>
#include "../../tests/sweep.h"
int main(int argc, char **argv) {
    fa_sweep_options o = {0};
    o.device = FA_DEVICE_CPU; o.dtype_filter = -1;
    if (argc > 1 && !strcmp(argv[1], "full")) o.level = FA_SWEEP_FULL;
    if (argc > 1 && !strcmp(argv[1], "cuda")) o.device = FA_DEVICE_CUDA;
    if (argc > 2) o.seed = strtoull(argv[2], NULL, 0);
    if (argc > 3) o.dtype_filter = atoi(argv[3]);
    int p, f;
    int rc = fa_sweep_run(&o, stdout, &p, &f);
    printf("rc=%d pass=%d fail=%d\n", rc, p, f);
    return rc;
}

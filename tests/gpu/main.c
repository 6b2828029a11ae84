/*
 * tests/gpu/main.c: `fa_gpu_tests MODE [ARGS]`, the GPU test programs in one binary (built by
 * `make $(BUILD)/fa_gpu_tests` when nvcc is present; run by `make gpu-test`):
 *   determinism [small]     the CUDA forward is bitwise repeatable (determinism.c)
 *   paths [packed]          the default forward kernel against the portable one (paths.c)
 *   backward [CASE...]      backward repeatability on problems reaching every kernel path (backward.c)
 *   bwd_paths [small] [det] the default backward kernel against the portable one (bwd_paths.c)
 *   nan                     a NaN input propagates through every kernel, never a masked row (nan.c)
 *   mods [small]            score bias, dbias, document ids, block-sparse masks against the
 *                           float64 oracle; bad block lists rejected, nothing written (mods.c)
 *   kvcache [small]         fa_kvcache_forward against the oracle and the CPU engine's caches:
 *                           appends of any length, head dims not multiples of 8 (cache.c)
 *   paged [small]           fa_forward with a paged K/V (block_table) against the oracle (cache.c)
 *   kvlarge [small]         fa_kvcache_forward at head dims above 256 (MLA: a latent cache, 576 /
 *                           512, up to 128 query heads on one kv head; other shapes, every
 *                           feature) against the oracle and the CPU engine; bad shapes refused
 *                           (kvcache_large.c)
 *   kvquant [small]         fa_kvcache_forward on int8 / Q8_0 / e4m3 caches: the caches after an
 *                           append equal the CPU engine's bit for bit, o / lse against the oracle
 *                           on the dequantised cache, refused fields (kvquant.c)
 *   dropout [small]         attention dropout against the float64 oracle, the CUDA mask against
 *                           the CPU's (attn_probs), repeatability (dropout.c)
 *   large [small]           fa_forward / fa_backward at head dims above 256 (512, 576 / 512, odd
 *                           sizes, every feature) against the float64 oracle; refusals (large_heads.c)
 *   tail                    varlen rows past the last sequence: zeroed with zero_varlen_tail,
 *                           untouched without, nothing else changed (tail.c)
 * Each mode exits non-zero on failure.
 */
#include <stdio.h>
#include <string.h>

int gpu_determinism_main(int argc, char **argv);
int gpu_paths_main(int argc, char **argv);
int gpu_backward_main(int argc, char **argv);
int gpu_bwd_paths_main(int argc, char **argv);
int gpu_nan_main(int argc, char **argv);
int gpu_mods_main(int argc, char **argv);
int gpu_kvcache_main(int argc, char **argv);
int gpu_paged_main(int argc, char **argv);
int gpu_kvquant_main(int argc, char **argv);
int gpu_kvlarge_main(int argc, char **argv);
int gpu_dropout_main(int argc, char **argv);
int gpu_large_main(int argc, char **argv);
int gpu_tail_main(int argc, char **argv);

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} modes[] = {
    {"determinism", gpu_determinism_main},
    {"paths", gpu_paths_main},
    {"backward", gpu_backward_main},
    {"bwd_paths", gpu_bwd_paths_main},
    {"nan", gpu_nan_main},
    {"mods", gpu_mods_main},
    {"kvcache", gpu_kvcache_main},
    {"paged", gpu_paged_main},
    {"kvquant", gpu_kvquant_main},
    {"kvlarge", gpu_kvlarge_main},
    {"dropout", gpu_dropout_main},
    {"large", gpu_large_main},
    {"tail", gpu_tail_main},
};

int main(int argc, char **argv) {
    if (argc >= 2)
        for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
            if (strcmp(argv[1], modes[i].name) == 0) return modes[i].run(argc - 1, argv + 1);
    fprintf(stderr, "usage: fa_gpu_tests determinism|paths|backward|bwd_paths|nan|mods|kvcache|paged|kvquant|kvlarge|dropout|large|tail [ARGS]\n");
    return 2;
}

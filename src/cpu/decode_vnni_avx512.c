/*
 * decode_vnni_avx512.c: decode_avx512.c's kernels with the int8 scores on AVX512-VNNI (vpdpwssd),
 * built with the AVX-512 flags and -mavx512vnni (Makefile); cpu_decode.c calls them only on CPUs
 * that report AVX512-VNNI (FA_CPU_DECODE_VNNI=0 keeps the plain set).
 */
#define FA_DECODE_VNNI 1
#include "decode_avx512.c"

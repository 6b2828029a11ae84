/*
 * emu_runtime.h: the harness side of the CPU emulator (emu_runtime.cc): run a grid of one kernel
 * body, register the global buffers the kernel may touch, read the counters.
 */
#ifndef FA_EMU_RUNTIME_H
#define FA_EMU_RUNTIME_H

#include <stdint.h>

#include <functional>

namespace emu {
constexpr uint32_t SMEM_CAP = 232448; /* sm_90 opt-in limit per block */

/* Dynamic counts over everything run so far (per warp instruction). */
struct Stats {
    uint64_t ldsm = 0, ldsm_bytes = 0, mma = 0, sts_bytes = 0, barriers = 0, blocks = 0, atomic_bytes = 0;
};

/* Run blocks 0..grid-1 of `threads` threads each, one after the other; every thread runs
 * kernel_body() (which calls the kernel with its parameters). Exits the process on a detected
 * error (bounds, divergence, deadlock). */
void run_grid(int grid, int threads, uint32_t dyn_smem, const std::function<void()> &kernel_body);
void register_buffer(const void *p, size_t n, const char *name);
void clear_buffers();
long race_count();
Stats &counters();
} // namespace emu

#endif /* FA_EMU_RUNTIME_H */

/*
 * emu_runtime.cc: the execution model behind emu_cuda.h (see there): fibers with a minimal x86-64
 * stack switch (no signal-mask syscall, so a block of 256 fibers runs hundreds of thousands of
 * warp collectives per second), warp collectives, barrier, cp.async, shared-memory bounds and
 * race checks, global-buffer checks, 16-bit float conversions.
 */
#include <stdarg.h>

#include <functional>
#include <vector>

#include "emu_cuda.h"
#include "emu_runtime.h"

/* The kernels' `extern __shared__ uint8_t smem_raw[]` resolves to this array. */
__attribute__((aligned(128))) uint8_t smem_raw[emu::SMEM_CAP];

extern "C" void emu_switch(void **save_sp, void *new_sp);
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch,@function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");

namespace emu {

struct Pending {
    uint32_t dst;
    const uint8_t *src;
    int size, src_bytes, group;
};
struct Fiber {
    void *sp = nullptr;
    std::vector<uint8_t> stack;
    emu_dim3 t{0, 0, 0};
    bool done = false;
    int waiting = 0; /* collective kind, or 100 for the barrier (diagnostics) */
    int committed = 0;
    std::vector<Pending> pending;
};
struct LaneArgs {
    uint32_t addr;
    uint32_t *r;
    float *d;
    uint32_t a[4], b[2];
    float shfl_in, *shfl_out; /* shfl.bfly: value given, where the partner's goes */
    uint32_t shfl_mask;
    int shfl_lanes;
};
struct Warp {
    int kind = 0, arrived = 0;
    uint32_t mask = 0;
    uint64_t gen = 0;
    LaneArgs lane[32];
};
struct Buffer {
    const uint8_t *p;
    size_t n;
    const char *name;
};

Fiber *cur = nullptr;
emu_dim3 block_idx{0, 0, 0}, block_dim{0, 1, 1};
uint8_t *smem = smem_raw;
uint32_t smem_size = 0;

static std::vector<Fiber> fibers;
static void *sched_sp = nullptr;
static std::function<void()> body;
static Warp warps[32];
static int bar_arrived = 0;
static uint64_t bar_gen = 0;
static uint32_t epoch = 1;
static uint64_t progress = 0;
static std::vector<Buffer> buffers;
static std::vector<int16_t> w_tid, r_tid;
static std::vector<uint32_t> w_ep, r_ep;
static long races = 0;
static Stats stats;

void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "EMU FAIL (block %u, thread %d): ", block_idx.x, cur ? (int)cur->t.x : -1);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(3);
}

emu_dim3 &tid() { return cur->t; }

static void yield() { emu_switch(&cur->sp, sched_sp); }

static void race(const char *what, uint32_t off, int other) {
    if (races < 10)
        fprintf(stderr, "RACE %s: shared byte 0x%x, thread %d vs %d, block %u, barrier interval %u\n", what, off,
                (int)cur->t.x, other, block_idx.x, epoch);
    ++races;
}

static void shadow_read(uint32_t off, int n) {
    const int16_t me = (int16_t)cur->t.x;
    for (int i = 0; i < n; ++i) {
        const uint32_t o = off + i;
        if (w_ep[o] == epoch && w_tid[o] != me) race("write->read", o, w_tid[o]);
        if (r_ep[o] != epoch) {
            r_ep[o] = epoch;
            r_tid[o] = me;
        } else if (r_tid[o] != me) {
            r_tid[o] = -2; /* several readers */
        }
    }
}

static void shadow_write(uint32_t off, int n) {
    const int16_t me = (int16_t)cur->t.x;
    for (int i = 0; i < n; ++i) {
        const uint32_t o = off + i;
        if (r_ep[o] == epoch && r_tid[o] != me) race("read->write", o, r_tid[o]);
        if (w_ep[o] == epoch && w_tid[o] != me) race("write->write", o, w_tid[o]);
        w_ep[o] = epoch;
        w_tid[o] = me;
    }
}

static uint32_t smem_offset(uint32_t addr, int n, int align, const char *what) {
    if (addr < SMEM_BASE || addr - SMEM_BASE + (uint32_t)n > smem_size)
        fail("%s: shared address 0x%x (+%d) outside [0x%x, 0x%x)", what, addr, n, SMEM_BASE, SMEM_BASE + smem_size);
    if ((addr - SMEM_BASE) % (uint32_t)align != 0)
        fail("%s: shared address 0x%x not %d-byte aligned", what, addr, align);
    return addr - SMEM_BASE;
}

void smem_store(uint32_t addr, const void *v, int n) {
    const uint32_t off = smem_offset(addr, n, n, "st.shared");
    shadow_write(off, n);
    memcpy(smem + off, v, n);
    stats.sts_bytes += n;
}

void smem_load(uint32_t addr, void *v, int n) {
    const uint32_t off = smem_offset(addr, n, n, "ld.shared");
    shadow_read(off, n);
    memcpy(v, smem + off, n);
}

void check_global(const void *p, size_t n, const char *what) {
    const uint8_t *q = static_cast<const uint8_t *>(p);
    for (const Buffer &b : buffers)
        if (q >= b.p && q + n <= b.p + b.n) return;
    fail("%s: global address %p (+%zu) is in no registered buffer", what, p, n);
}

void count_atomic(int bytes) { stats.atomic_bytes += (uint64_t)bytes; }

void register_buffer(const void *p, size_t n, const char *name) {
    buffers.push_back(Buffer{static_cast<const uint8_t *>(p), n, name});
}
void clear_buffers() { buffers.clear(); }

/* ---- collectives ---------------------------------------------------------------------------- */

static const char *kind_name(int k) {
    switch (k) {
    case EMU_LDSM_X4: return "ldmatrix.x4";
    case EMU_LDSM_X4_T: return "ldmatrix.x4.trans";
    case EMU_LDSM_X2: return "ldmatrix.x2";
    case EMU_LDSM_X2_T: return "ldmatrix.x2.trans";
    case EMU_MMA_BF16: return "mma.bf16";
    case EMU_MMA_F16: return "mma.f16";
    case EMU_SHFL_XOR: return "shfl.sync.bfly";
    case 100: return "bar.sync";
    default: return "?";
    }
}

static void exec_ldmatrix(Warp &W) {
    const bool trans = W.kind == EMU_LDSM_X4_T || W.kind == EMU_LDSM_X2_T;
    const int mats = (W.kind == EMU_LDSM_X4 || W.kind == EMU_LDSM_X4_T) ? 4 : 2;
    uint16_t m[4][8][8];
    Fiber *saved = cur;
    const int warp_base = (int)(saved->t.x / 32) * 32;
    for (int i = 0; i < mats; ++i)
        for (int r = 0; r < 8; ++r) {
            const int l = 8 * i + r;
            cur = &fibers[warp_base + l]; /* attribute the read to the lane that gave the address */
            const uint32_t off = smem_offset(W.lane[l].addr, 16, 16, kind_name(W.kind));
            shadow_read(off, 16);
            memcpy(m[i][r], smem + off, 16);
        }
    cur = saved;
    for (int l = 0; l < 32; ++l)
        for (int i = 0; i < mats; ++i) {
            const int row = l / 4, col = 2 * (l % 4);
            uint32_t lo, hi;
            if (!trans) {
                lo = m[i][row][col];
                hi = m[i][row][col + 1];
            } else {
                lo = m[i][col][row];
                hi = m[i][col + 1][row];
            }
            W.lane[l].r[i] = lo | (hi << 16);
        }
    stats.ldsm_bytes += 128u * mats;
    stats.ldsm += 1;
}

static void exec_mma(Warp &W) {
    const bool bf = W.kind == EMU_MMA_BF16;
    auto cvt = [bf](uint32_t h) { return bf ? bf16_to_float((uint16_t)h) : f16_to_float((uint16_t)h); };
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        const LaneArgs &a = W.lane[l];
        const uint32_t *x = a.a;
        A[g][2 * t] = cvt(x[0] & 0xffff), A[g][2 * t + 1] = cvt(x[0] >> 16);
        A[g + 8][2 * t] = cvt(x[1] & 0xffff), A[g + 8][2 * t + 1] = cvt(x[1] >> 16);
        A[g][2 * t + 8] = cvt(x[2] & 0xffff), A[g][2 * t + 9] = cvt(x[2] >> 16);
        A[g + 8][2 * t + 8] = cvt(x[3] & 0xffff), A[g + 8][2 * t + 9] = cvt(x[3] >> 16);
        B[2 * t][g] = cvt(a.b[0] & 0xffff), B[2 * t + 1][g] = cvt(a.b[0] >> 16);
        B[2 * t + 8][g] = cvt(a.b[1] & 0xffff), B[2 * t + 9][g] = cvt(a.b[1] >> 16);
        C[g][2 * t] = a.d[0], C[g][2 * t + 1] = a.d[1];
        C[g + 8][2 * t] = a.d[2], C[g + 8][2 * t + 1] = a.d[3];
    }
    float D[16][8];
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 8; ++j) {
            double s = C[i][j];
            for (int k = 0; k < 16; ++k) s += (double)A[i][k] * (double)B[k][j];
            D[i][j] = (float)s;
        }
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        float *d = W.lane[l].d;
        d[0] = D[g][2 * t], d[1] = D[g][2 * t + 1], d[2] = D[g + 8][2 * t], d[3] = D[g + 8][2 * t + 1];
    }
    stats.mma += 1;
}

static void exec_shfl(Warp &W) {
    for (int l = 0; l < 32; ++l) {
        if (W.lane[l].shfl_mask != 0xffffffffu) fail("shfl with a partial mask (the kernel uses full warps)");
        if (W.lane[l].shfl_lanes != W.lane[0].shfl_lanes) fail("shfl.bfly with different lane masks in one warp");
    }
    for (int l = 0; l < 32; ++l) *W.lane[l].shfl_out = W.lane[l ^ (W.lane[0].shfl_lanes & 31)].shfl_in;
}

static void collective(int kind, const LaneArgs &la) {
    Fiber *f = cur;
    const int w = (int)(f->t.x / 32), l = (int)(f->t.x % 32);
    Warp &W = warps[w];
    if (W.arrived == 0) {
        W.kind = kind;
        W.mask = 0;
    } else if (W.kind != kind) {
        fail("warp %d lane %d reached %s while lanes 0x%08x wait at %s (divergent warp collective)", w, l,
             kind_name(kind), W.mask, kind_name(W.kind));
    }
    if (W.mask & (1u << l)) fail("warp %d lane %d arrived twice", w, l);
    W.mask |= 1u << l;
    W.lane[l] = la;
    if (++W.arrived == 32) {
        if (kind == EMU_MMA_BF16 || kind == EMU_MMA_F16)
            exec_mma(W);
        else if (kind == EMU_SHFL_XOR)
            exec_shfl(W);
        else
            exec_ldmatrix(W);
        W.arrived = 0;
        W.mask = 0;
        ++W.gen;
        ++progress;
        return;
    }
    const uint64_t g = W.gen;
    f->waiting = kind;
    while (W.gen == g) yield();
    f->waiting = 0;
}

void ldmatrix(int kind, uint32_t *r, uint32_t addr) {
    LaneArgs la{};
    la.addr = addr;
    la.r = r;
    collective(kind, la);
}

void mma(int bf16, float *d, const uint32_t *a, const uint32_t *b) {
    LaneArgs la{};
    la.d = d;
    memcpy(la.a, a, 16);
    memcpy(la.b, b, 8);
    collective(bf16 ? EMU_MMA_BF16 : EMU_MMA_F16, la);
}

float shfl_xor(uint32_t mask, float v, int lane_mask) {
    LaneArgs la{};
    float out = 0.0f;
    la.shfl_in = v;
    la.shfl_out = &out;
    la.shfl_mask = mask;
    la.shfl_lanes = lane_mask;
    collective(EMU_SHFL_XOR, la);
    return out;
}

void syncthreads() {
    Fiber *f = cur;
    const int w = (int)(f->t.x / 32);
    if (warps[w].arrived != 0) fail("bar.sync while lanes of warp %d wait at %s", w, kind_name(warps[w].kind));
    if (++bar_arrived == (int)fibers.size()) {
        bar_arrived = 0;
        ++bar_gen;
        ++epoch;
        ++progress;
        ++stats.barriers;
        return;
    }
    const uint64_t g = bar_gen;
    f->waiting = 100;
    while (bar_gen == g) yield();
    f->waiting = 0;
}

/* ---- cp.async ------------------------------------------------------------------------------- */

void cp_async(uint32_t dst, const void *src, int size, int src_bytes) {
    const uint32_t off = smem_offset(dst, size, size, "cp.async");
    if (src_bytes != 0 && src_bytes != size) fail("cp.async: src_bytes %d of %d", src_bytes, size);
    if (src_bytes > 0) check_global(src, (size_t)src_bytes, "cp.async source");
    shadow_write(off, size);
    memset(smem + off, 0xff, size); /* not landed yet: NaN bytes */
    cur->pending.push_back(Pending{off, static_cast<const uint8_t *>(src), size, src_bytes, cur->committed});
}

void cp_async_commit() { ++cur->committed; }

void cp_async_wait(int n) {
    Fiber *f = cur;
    std::vector<Pending> keep;
    for (const Pending &p : f->pending) {
        const bool land = n < 0 || p.group < f->committed - n;
        if (!land) {
            keep.push_back(p);
            continue;
        }
        shadow_write(p.dst, p.size);
        memset(smem + p.dst, 0, p.size);
        if (p.src_bytes > 0) memcpy(smem + p.dst, p.src, p.src_bytes);
    }
    f->pending.swap(keep); /* wait_all (n < 0) also landed the uncommitted copies, as PTX defines it */
}

/* ---- 16-bit floats ---------------------------------------------------------------------------- */

float bf16_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)((u + rounding) >> 16);
}
float f16_to_float(uint16_t h) {
    _Float16 f;
    memcpy(&f, &h, 2);
    return (float)f;
}
uint16_t float_to_f16(float f) {
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

/* ---- blocks ---------------------------------------------------------------------------------- */

static void fiber_entry() {
    body();
    cur->done = true;
    ++progress;
    if (!cur->pending.empty()) fail("thread exits with %zu cp.async copies not waited for", cur->pending.size());
    emu_switch(&cur->sp, sched_sp);
    fail("finished fiber resumed");
}

static void init_fiber(Fiber &f, unsigned t) {
    const size_t STACK = 512 * 1024;
    if (f.stack.size() != STACK) f.stack.assign(STACK, 0);
    uintptr_t top = (reinterpret_cast<uintptr_t>(f.stack.data()) + STACK) & ~(uintptr_t)15;
    void **sp = reinterpret_cast<void **>(top);
    *--sp = nullptr;                                    /* fake return address of fiber_entry */
    *--sp = reinterpret_cast<void *>(&fiber_entry);      /* emu_switch's ret goes here        */
    for (int i = 0; i < 6; ++i) *--sp = nullptr;         /* rbp rbx r12 r13 r14 r15           */
    f.sp = sp;
    f.t = emu_dim3{t, 0, 0};
    f.done = false;
    f.waiting = 0;
    f.committed = 0;
    f.pending.clear();
}

void run_grid(int grid, int threads, uint32_t dyn_smem, const std::function<void()> &kernel_body) {
    if (dyn_smem > SMEM_CAP) fail("dynamic shared memory %u above the emulator's %u", dyn_smem, SMEM_CAP);
    fibers.resize(threads);
    smem_size = dyn_smem;
    w_tid.assign(SMEM_CAP, -1);
    r_tid.assign(SMEM_CAP, -1);
    body = kernel_body;
    block_dim = emu_dim3{(unsigned)threads, 1, 1};
    for (int blk = 0; blk < grid; ++blk) {
        block_idx = emu_dim3{(unsigned)blk, 0, 0};
        memset(smem, 0xff, SMEM_CAP); /* shared memory starts as garbage (NaN) */
        w_ep.assign(SMEM_CAP, 0);
        r_ep.assign(SMEM_CAP, 0);
        epoch = 1;
        bar_arrived = 0;
        for (Warp &w : warps) w.arrived = 0, w.mask = 0;
        for (int t = 0; t < threads; ++t) init_fiber(fibers[t], (unsigned)t);
        for (;;) {
            bool any = false;
            const uint64_t p0 = progress;
            for (Fiber &f : fibers) {
                if (f.done) continue;
                any = true;
                cur = &f;
                emu_switch(&sched_sp, f.sp);
            }
            cur = nullptr;
            if (!any) break;
            if (progress == p0) {
                fprintf(stderr, "EMU DEADLOCK in block %d:", blk);
                for (Fiber &f : fibers)
                    if (!f.done && (f.t.x % 32 == 0)) fprintf(stderr, " t%u@%s", f.t.x, kind_name(f.waiting));
                fprintf(stderr, "\n");
                exit(3);
            }
        }
        ++stats.blocks;
    }
}

long race_count() { return races; }
Stats &counters() { return stats; }

} // namespace emu

// header_cxx.cc: include/flashattn.h compiled as C++ (extern "C" guards, no C-only constructs) and
// linked against the C library: the call below must resolve to the unmangled C symbols.
// tests/run_all.sh builds and runs it; it prints the suite's "N passed, N failed" line.
#include <flashattn.h>

#include <cstdio>
#include <cstring>

int main() {
    fa_params p;
    std::memset(&p, 0, sizeof p);
    const fa_status st = fa_forward(&p); // q etc. are NULL: a clean error, nothing written
    const bool ok = st == FA_ERR_INVALID_SIZE && std::strlen(fa_last_error()) > 0 &&
                    std::strcmp(fa_version(), "") != 0;
    std::printf("header_cxx: fa_forward(zeroed params) -> %s (%s)\n", fa_strerror(st), fa_last_error());
    std::printf("%d passed, %d failed\n", ok ? 1 : 0, ok ? 0 : 1);
    return ok ? 0 : 1;
}

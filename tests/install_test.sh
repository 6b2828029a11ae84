#!/bin/sh
# tests/install_test.sh: `make install` and the programs that use an installed flashattn.
#
#   1. make install PREFIX=<temp>: every file in its place, the soname, the tool runs
#   2. make install / uninstall with DESTDIR: staged under DESTDIR, paths inside without it
#   3. tests/install/consumer.c built with pkg-config against the shared library
#   4. the same, linked statically (pkg-config --static: Libs.private)
#   5. tests/install/CMakeLists.txt: find_package(flashattn 0.1), flashattn::flashattn and
#      flashattn::flashattn_static; find_package(flashattn 1.0) must fail
# Uses the build in $BUILD_DIR (default build; tests/run_all.sh has built it). Prints
# "N passed, N failed, N skipped"; the exit status is non-zero on a failure. A missing
# pkg-config is a skip. cmake: the one on PATH, else pip's cmake wheel in a small environment
# of its own (~/.cache/flashattn/cmake-<python version>, made once), else a skip.
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD_DIR=${BUILD_DIR:-build}
CC=${CC:-cc}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-install.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
passed=0
failed=0
skipped=0
pass() { echo "install: ok: $*"; passed=$((passed + 1)); }
fail() { echo "install: FAILED: $*"; failed=$((failed + 1)); }
skip() { echo "install: skipped: $*"; skipped=$((skipped + 1)); }
finish() {
    echo "$passed passed, $failed failed, $skipped skipped"
    [ "$failed" -eq 0 ]
    exit
}

version=$(make -s BUILD="$BUILD_DIR" print-version)
major=${version%%.*}
cuda_libs=$(make -s BUILD="$BUILD_DIR" print-cuda-libs)

# ---- 1. install into a prefix --------------------------------------------------------------
prefix=$tmp/prefix
if ! make -s BUILD="$BUILD_DIR" PREFIX="$prefix" install > "$tmp/install.log" 2>&1; then
    cat "$tmp/install.log"
    fail "make install PREFIX=$prefix"
    finish
fi
missing=
for f in include/flashattn.h lib/libflashattn.a "lib/libflashattn.so.$version" \
    "lib/libflashattn.so.$major" lib/libflashattn.so bin/flashattn lib/pkgconfig/flashattn.pc \
    lib/cmake/flashattn/flashattnConfig.cmake lib/cmake/flashattn/flashattnConfigVersion.cmake; do
    [ -e "$prefix/$f" ] || missing="$missing $f"
done
if [ -n "$missing" ]; then
    fail "make install left out:$missing"
elif [ "$(readlink "$prefix/lib/libflashattn.so")" != "libflashattn.so.$major" ] ||
     [ "$(readlink "$prefix/lib/libflashattn.so.$major")" != "libflashattn.so.$version" ]; then
    fail "links: libflashattn.so -> $(readlink "$prefix/lib/libflashattn.so"), .so.$major -> $(readlink "$prefix/lib/libflashattn.so.$major")"
elif command -v readelf > /dev/null 2>&1 &&
     ! readelf -d "$prefix/lib/libflashattn.so.$version" | grep -q "SONAME.*\[libflashattn.so.$major\]"; then
    fail "libflashattn.so.$version has no soname libflashattn.so.$major"
elif ! "$prefix/bin/flashattn" version | grep -q "flashattn $version"; then
    fail "the installed flashattn tool does not report version $version"
else
    pass "make install PREFIX: header, libflashattn.a, libflashattn.so.$version (soname .so.$major, links), tool, pkg-config and CMake files"
fi
if [ -n "$cuda_libs" ] && ! grep -q -- '-lcudart' "$prefix/lib/pkgconfig/flashattn.pc"; then
    fail "CUDA build, but flashattn.pc's Libs.private has no CUDA runtime"
fi

# ---- 2. DESTDIR -----------------------------------------------------------------------------
stage=$tmp/stage
if make -s BUILD="$BUILD_DIR" PREFIX=/opt/flashattn DESTDIR="$stage" install > "$tmp/destdir.log" 2>&1 &&
   [ -f "$stage/opt/flashattn/lib/libflashattn.so.$version" ] &&
   grep -q '^prefix=/opt/flashattn$' "$stage/opt/flashattn/lib/pkgconfig/flashattn.pc" &&
   ! grep -rq "$stage" "$stage/opt/flashattn/lib/pkgconfig" "$stage/opt/flashattn/lib/cmake"; then
    if make -s BUILD="$BUILD_DIR" PREFIX=/opt/flashattn DESTDIR="$stage" uninstall > "$tmp/uninstall.log" 2>&1 &&
       [ -z "$(find "$stage" -type f -o -type l)" ]; then
        pass "make install / uninstall with DESTDIR (staged; no DESTDIR inside the pkg-config and CMake files)"
    else
        cat "$tmp/uninstall.log"
        fail "make uninstall DESTDIR left: $(find "$stage" -type f -o -type l | tr '\n' ' ')"
    fi
else
    cat "$tmp/destdir.log"
    fail "make install DESTDIR=... PREFIX=/opt/flashattn"
fi

# ---- 3, 4. pkg-config ------------------------------------------------------------------------
if command -v pkg-config > /dev/null 2>&1; then
    export PKG_CONFIG_LIBDIR="$prefix/lib/pkgconfig"
    unset PKG_CONFIG_PATH
    if [ "$(pkg-config --modversion flashattn 2>&1)" != "$version" ]; then
        fail "pkg-config --modversion flashattn: $(pkg-config --modversion flashattn 2>&1)"
    fi
    # shellcheck disable=SC2046 # pkg-config's flags are meant to split
    if $CC -std=c11 -Wall -Wextra -Werror tests/install/consumer.c \
           $(pkg-config --cflags --libs flashattn) -lm -Wl,-rpath,"$prefix/lib" \
           -o "$tmp/consumer_pc_shared" && "$tmp/consumer_pc_shared" &&
       { ! command -v readelf > /dev/null 2>&1 ||
         readelf -d "$tmp/consumer_pc_shared" | grep -q "NEEDED.*\[libflashattn.so.$major\]"; }; then
        pass "pkg-config, shared: \$(pkg-config --cflags --libs flashattn), runs, needs libflashattn.so.$major"
    else
        fail "a program built with pkg-config against the shared library"
    fi
    # shellcheck disable=SC2046
    if $CC -std=c11 -Wall -Wextra -Werror tests/install/consumer.c $(pkg-config --cflags flashattn) \
           -Wl,-Bstatic -lflashattn -Wl,-Bdynamic \
           $(pkg-config --static --libs flashattn | sed 's/-lflashattn//') \
           -o "$tmp/consumer_pc_static" && "$tmp/consumer_pc_static" &&
       { ! command -v readelf > /dev/null 2>&1 ||
         ! readelf -d "$tmp/consumer_pc_static" | grep -q "NEEDED.*libflashattn"; }; then
        pass "pkg-config, static: libflashattn.a with \$(pkg-config --static --libs flashattn)"
    else
        fail "a program built with pkg-config --static against libflashattn.a"
    fi
    unset PKG_CONFIG_LIBDIR
else
    skip "pkg-config not found: the pkg-config builds (2 checks) did not run (apt-get install pkg-config)"
fi

# ---- 5. CMake --------------------------------------------------------------------------------
CMAKE=$(command -v cmake || true)
if [ -z "$CMAKE" ]; then
    py=${PYTHON:-python3}
    pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2> /dev/null || true)
    tools=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/flashattn/cmake-$pyver
    if [ -x "$tools/bin/cmake" ]; then
        CMAKE=$tools/bin/cmake
    elif [ -n "$pyver" ]; then
        echo "install: cmake is not on PATH: installing pip's cmake wheel into $tools (once, ~40 MB) for the find_package test"
        if "$py" -m venv "$tools" && "$tools/bin/python" -m pip install -q --disable-pip-version-check cmake; then
            CMAKE=$tools/bin/cmake
        else
            rm -rf "$tools"
        fi
    fi
fi
if [ -z "$CMAKE" ]; then
    skip "cmake not found and pip could not install it: the find_package test (1 check) did not run"
else
    echo "install: using $("$CMAKE" --version | head -n 1) ($CMAKE)"
    cm=$tmp/cmake
    if "$CMAKE" -S tests/install -B "$cm" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$CC" \
           > "$cm.log" 2>&1 &&
       "$CMAKE" --build "$cm" >> "$cm.log" 2>&1 &&
       "$cm/consumer_shared" && "$cm/consumer_static"; then
        if "$CMAKE" -S tests/install -B "$cm-1.0" -DCMAKE_PREFIX_PATH="$prefix" -DFLASHATTN_WANT=1.0 \
               > "$cm-1.0.log" 2>&1; then
            fail "find_package(flashattn 1.0) accepted version $version"
        else
            pass "CMake: find_package(flashattn 0.1), flashattn::flashattn and flashattn::flashattn_static build and run; 1.0 is refused"
        fi
    else
        cat "$cm.log"
        fail "the CMake project tests/install (find_package(flashattn))"
    fi
fi
finish

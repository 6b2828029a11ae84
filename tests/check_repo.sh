#!/bin/sh
# check_repo.sh: the repository holds the product only. POSIX sh; run from anywhere.
#
#   (a) no words about how the work is organised in any tracked text file (contents and names)
#   (b) no lab/ directory: experiments live in dev/ while they run and in docs/tuning-log.md after
#   (c) bench/results/ holds one current file per benchmark: no dated, per-run or log files
#   (d) src/ and include/ refer to nothing outside the repository
#
# Files are those `git ls-files` lists; without git metadata (an exported tree) every file under
# the root except build outputs. The last line is "N passed, N failed"; the exit status is
# non-zero when a check fails.
set -u
cd "$(dirname "$0")/.." || exit 1

SELF=tests/check_repo.sh
# the words are spelled in pieces so that this file does not match its own pattern
W_SESS='sess''ion' W_HELP='hel''per' W_ASSIST='assis''tant' W_ISSUE='iss''ue' W_HELP_UPPER='HEL''PER'
WORDS="\\b($W_SESS|$W_HELP|$W_ASSIST)s?\\b|\\b${W_ISSUE}[s]? ?#?[0-9]+|${W_HELP_UPPER}S_CONTEXT|${W_SESS}_[a-z]+"
OUTSIDE='\.\./shared|hopper-kernel-notes'

passed=0
failed=0
tmp=${TMPDIR:-/tmp}/check_repo.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

# The file list, one path per line, relative to the root.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && git ls-files >"$tmp/files" 2>/dev/null &&
    [ -s "$tmp/files" ]; then
    source_of_list="git ls-files"
else
    source_of_list="find"
    find . \( -name .git -o -path ./build -o -path './build-*' -o -path ./.venv -o -name __pycache__ \
        -o -name '*.egg-info' -o -path ./python/build -o -path ./python/flashattn/lib -o -path ./.whl \) \
        -prune -o -type f -print | sed 's|^\./||' | sort >"$tmp/files"
fi
echo "check_repo: $(wc -l <"$tmp/files" | tr -d ' ') files ($source_of_list)"

# report NAME FILE: pass when FILE is empty, else fail and show (at most 20 lines of) it
report() {
    if [ -s "$2" ]; then
        echo "FAIL $1:"
        head -n 20 "$2" | sed 's/^/    /'
        n=$(wc -l <"$2" | tr -d ' ')
        [ "$n" -gt 20 ] && echo "    ... ($n lines)"
        failed=$((failed + 1))
    else
        echo "ok   $1"
        passed=$((passed + 1))
    fi
}

# (a) workflow words: in the contents of text files (JSON and SVG data excluded) and in names
: >"$tmp/a"
grep -v -e "^$SELF\$" -e '\.json$' -e '\.svg$' "$tmp/files" | while IFS= read -r f; do
    [ -f "$f" ] || continue
    grep -I -n -i -E "$WORDS" "$f" 2>/dev/null | cut -c1-160 | sed "s|^|$f:|"
done >>"$tmp/a"
grep -v -e "^$SELF\$" "$tmp/files" | grep -i -E "$WORDS" | sed 's/$/ (file name)/' >>"$tmp/a"
report "(a) no words about how the work is organised" "$tmp/a"

# (b) no lab/ directory
grep -E '^lab/' "$tmp/files" >"$tmp/b"
report "(b) no lab/ directory" "$tmp/b"

# (c) bench/results/: no dated, per-run or log files
grep -E '^bench/results/' "$tmp/files" |
    grep -i -E "20[0-9][0-9]-[0-9][0-9]-[0-9][0-9]|$W_SESS|(^|/)logs/" >"$tmp/c"
report "(c) bench/results/ holds no dated, per-run or log files" "$tmp/c"

# (d) src/ and include/ point at nothing outside the repository
: >"$tmp/d"
grep -E '^(src|include)/' "$tmp/files" | while IFS= read -r f; do
    [ -f "$f" ] || continue
    grep -I -n -E "$OUTSIDE" "$f" 2>/dev/null | cut -c1-160 | sed "s|^|$f:|"
done >>"$tmp/d"
report "(d) src/ and include/ refer to nothing outside the repository" "$tmp/d"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

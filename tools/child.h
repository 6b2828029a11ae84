/*
 * child.h: run a function in a forked child process and copy its fixed-size result back through
 * a pipe, so a measurement's memory peak, threads and crashes stay out of the parent.
 */
#ifndef FA_TOOL_CHILD_H
#define FA_TOOL_CHILD_H

#include <stddef.h>

/* Calls fn(arg, out) in a child and copies `out_size` bytes of *out back into *out.
 * Returns 1 on success; 0 when the child died or could not be started, with the reason in
 * `why` (e.g. "killed by signal 9 (out of memory?)"). */
int child_run(void (*fn)(const void *arg, void *out), const void *arg, void *out, size_t out_size,
              char *why, size_t why_size);

#endif /* FA_TOOL_CHILD_H */

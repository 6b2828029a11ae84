/*
 * check.h: `flashattn check`, the randomised correctness sweep (oracle/sweep.c) from the command
 * line.
 */
#ifndef FA_TOOL_CHECK_H
#define FA_TOOL_CHECK_H

int check_main(int argc, char **argv);

#endif /* FA_TOOL_CHECK_H */

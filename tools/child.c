/*
 * child.c: run a function in a forked child and read its output through a pipe (see child.h).
 */
#include "child.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static int write_all(int fd, const void *data, size_t size) {
    const char *cursor = data;
    while (size > 0) {
        ssize_t n = write(fd, cursor, size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return 0;
        cursor += n;
        size -= (size_t)n;
    }
    return 1;
}

static size_t read_all(int fd, void *data, size_t size) {
    char *cursor = data;
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, cursor + got, size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    return got;
}

int child_run(void (*fn)(const void *arg, void *out), const void *arg, void *out, size_t out_size,
              char *why, size_t why_size) {
    int fds[2];
    fflush(NULL);
    if (pipe(fds) != 0) {
        snprintf(why, why_size, "pipe() failed");
        return 0;
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        snprintf(why, why_size, "fork() failed");
        return 0;
    }
    if (pid == 0) {
        close(fds[0]);
        fn(arg, out);
        _exit(write_all(fds[1], out, out_size) ? 0 : 1);
    }
    close(fds[1]);
    size_t got = read_all(fds[0], out, out_size);
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (got == out_size && WIFEXITED(status) && WEXITSTATUS(status) == 0) return 1;
    if (WIFSIGNALED(status))
        snprintf(why, why_size, "measurement process killed by signal %d%s", WTERMSIG(status),
                 WTERMSIG(status) == SIGKILL ? " (out of memory?)" : "");
    else
        snprintf(why, why_size, "measurement process exited with status %d",
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}

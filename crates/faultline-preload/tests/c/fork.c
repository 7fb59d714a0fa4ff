/* The fork oracle (tests/lifecycle.rs). usage: fork FILE PAGES
 * Maps FILE (served) read-write and shared, writes every page, then:
 * a child that execs (`true`) must exit 0 and leave the mapping intact;
 * a child that touches the inherited mapping must die of SIGSEGV (the
 * served mapping is not in the child: MADV_DONTFORK) and leave it intact
 * too. The parent then checks every page, unmaps (writing back) and
 * prints "fork ok"; the test checks the file. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t pages = strtoull(argv[2], 0, 10), n = pages * 512;
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) { perror("open"); return 1; }
    volatile uint64_t *m = mmap(0, pages * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) { perror("mmap"); return 1; }
    for (size_t i = 0; i < n; i++) m[i] = i ^ 0xF00DF00DULL;
    pid_t c = fork();
    if (c == 0) { execlp("true", "true", (char *)0); _exit(127); }
    int st;
    if (waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "the child that execs failed: status %#x\n", st);
        return 1;
    }
    c = fork();
    if (c == 0) { uint64_t v = m[7]; _exit(v == 7 ? 3 : 4); }
    if (waitpid(c, &st, 0) != c || !WIFSIGNALED(st) || WTERMSIG(st) != SIGSEGV) {
        fprintf(stderr, "the child that touched the mapping was not stopped by SIGSEGV: status %#x\n", st);
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        if (m[i] != (i ^ 0xF00DF00DULL)) { fprintf(stderr, "word %zu changed\n", i); return 1; }
    if (munmap((void *)m, pages * 4096)) { perror("munmap"); return 1; }
    puts("fork ok");
    return 0;
}

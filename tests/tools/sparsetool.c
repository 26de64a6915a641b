/* sparsetool: tiny helper for the sparse-file interop tests, run inside the
 * test VM against files on an NFS mount.
 *
 *   sparsetool map FILE          print "data START END" per data extent,
 *                                found with lseek(SEEK_DATA/SEEK_HOLE)
 *   sparsetool falloc FILE OFF LEN   fallocate (allocate, keep size)
 *   sparsetool punch FILE OFF LEN    fallocate PUNCH_HOLE|KEEP_SIZE
 *
 * Exits non-zero with a message naming the failed call.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(const char *what, const char *file) {
    fprintf(stderr, "sparsetool: %s %s: %s\n", what, file, strerror(errno));
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: sparsetool map FILE | falloc FILE OFF LEN | punch FILE OFF LEN\n");
        return 2;
    }
    const char *cmd = argv[1], *file = argv[2];
    if (strcmp(cmd, "map") == 0) {
        int fd = open(file, O_RDONLY);
        if (fd < 0) return fail("open", file);
        struct stat st;
        if (fstat(fd, &st) < 0) return fail("fstat", file);
        off_t pos = 0;
        while (pos < st.st_size) {
            off_t d = lseek(fd, pos, SEEK_DATA);
            if (d < 0) {
                if (errno == ENXIO) break;
                return fail("lseek SEEK_DATA", file);
            }
            off_t h = lseek(fd, d, SEEK_HOLE);
            if (h < 0) return fail("lseek SEEK_HOLE", file);
            printf("data %lld %lld\n", (long long)d, (long long)h);
            pos = h;
        }
        return 0;
    }
    if (argc != 5) {
        fprintf(stderr, "sparsetool: %s needs FILE OFF LEN\n", cmd);
        return 2;
    }
    off_t off = strtoll(argv[3], NULL, 0), len = strtoll(argv[4], NULL, 0);
    int mode;
    if (strcmp(cmd, "falloc") == 0)
        mode = 0;
    else if (strcmp(cmd, "punch") == 0)
        mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    else {
        fprintf(stderr, "sparsetool: unknown command %s\n", cmd);
        return 2;
    }
    int fd = open(file, O_RDWR | O_CREAT, 0644);
    if (fd < 0) return fail("open", file);
    if (fallocate(fd, mode, off, len) < 0) return fail("fallocate", file);
    if (fsync(fd) < 0) return fail("fsync", file);
    return close(fd) < 0 ? fail("close", file) : 0;
}

// file.c - open, check and map read-only files.
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

void tri__file_close(const char *path, int fd) {
    if (close(fd) != 0) tri__log(TRI_LOG_LEVEL_WARN, "%s: close: %s", path, strerror(errno));
}

tri_status tri__file_open(const char *path, int *out_fd, uint64_t *out_size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tri__fail(errno == ENOENT ? TRI_STATUS_NOT_FOUND : TRI_STATUS_IO, "%s: cannot open: %s",
                         path, strerror(errno));
    struct stat sb;
    tri_status st = TRI_STATUS_OK;
    if (fstat(fd, &sb) != 0)
        st = tri__fail(TRI_STATUS_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = tri__fail(TRI_STATUS_IO, "%s: not a regular file", path);
    else if (sb.st_size < 0 || (uint64_t)sb.st_size > SIZE_MAX)
        st = tri__fail(TRI_STATUS_IO, "%s: %lld bytes do not fit the address space", path,
                       (long long)sb.st_size);
    if (st) {
        tri__file_close(path, fd);
        return st;
    }
    *out_fd = fd;
    *out_size = (uint64_t)sb.st_size;
    return TRI_STATUS_OK;
}

tri_status tri__file_map(const char *path, int fd, uint64_t size, bool populate, const void **out) {
    TRI_ASSERT(size > 0);
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE | (populate ? MAP_POPULATE : 0), fd, 0);
    int err = errno;
    tri__file_close(path, fd);
    if (p == MAP_FAILED)
        return tri__fail(TRI_STATUS_IO, "%s: mmap of %" PRIu64 " bytes: %s", path, size, strerror(err));
    *out = p;
    return TRI_STATUS_OK;
}

void tri__file_unmap(const char *path, const void *map, uint64_t size) {
    if (map && munmap((void *)map, (size_t)size) != 0)
        tri__log(TRI_LOG_LEVEL_WARN, "%s: munmap: %s", path, strerror(errno));
}

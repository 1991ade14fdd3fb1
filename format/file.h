// file.h - opening and mapping the files the readers parse (internal).
#ifndef TRI_FILE_H
#define TRI_FILE_H

#include <stdbool.h>
#include <stdint.h>

#include "triforce.h"

// Opens path read-only (O_CLOEXEC), checks that it is a regular file whose size fits the address
// space, and returns the descriptor and size. NOT_FOUND when it does not exist, IO otherwise;
// the message names the file.
tri_status tri__file_open(const char *path, int *fd, uint64_t *size);

// Maps size (> 0) bytes of fd read-only and private (MAP_POPULATE when populate), then closes fd
// whatever happens: the mapping keeps the file. Release with tri__file_unmap.
tri_status tri__file_map(const char *path, int fd, uint64_t size, bool populate, const void **map);
void tri__file_unmap(const char *path, const void *map, uint64_t size);

// Closes a descriptor of a file opened for reading; a failing close loses nothing, so it is
// logged, not returned.
void tri__file_close(const char *path, int fd);

#endif  // TRI_FILE_H

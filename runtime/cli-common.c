// cli-common.c - what every offload-run subcommand shares: model loading and error reports.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

int tri_cli_fail(const char *what, tri_status status) {
    const char *msg = tri_last_error();
    fprintf(stderr, "offload-run: %s: %s\n", what, msg[0] ? msg : tri_status_str(status));
    return 1;
}

static bool load_progress(float fraction, void *user) {
    (void)user;
    fprintf(stderr, "\rloading model: %3d%%", (int)(fraction * 100.0f + 0.5f));
    if (fraction >= 1.0f) fputc('\n', stderr);
    return true;
}

tri_model *tri_cli_load_model(const char *path) {
    tri_model_params params = tri_model_default_params();
    if (isatty(STDERR_FILENO)) params.progress = load_progress;
    tri_model *model = NULL;
    tri_status st = tri_model_load(path, &params, &model);
    if (st) {
        if (params.progress) fputc('\n', stderr);
        tri_cli_fail("cannot load model", st);
        return NULL;
    }
    return model;
}

bool tri_cli_parse_device(const char *cmd, const char *arg, tri_session_params *sp) {
    if (strchr(arg, ',') || strncmp(arg, "cpu:", 4) == 0) {
        // a device list (tensor parallelism): the session checks it and names what is wrong
        sp->devices = arg;
        return true;
    }
    if (strcmp(arg, "cpu") == 0) {
        sp->device_kind = TRI_DEVICE_CPU;
        return true;
    }
    if (strcmp(arg, "cuda") == 0) {
        sp->device_kind = TRI_DEVICE_CUDA;
        sp->device = 0;
        return true;
    }
    if (strncmp(arg, "cuda:", 5) == 0 && arg[5] >= '0' && arg[5] <= '9') {
        char *end;
        errno = 0;
        long n = strtol(arg + 5, &end, 10);
        if (errno == 0 && *end == '\0' && n <= 1024) {
            sp->device_kind = TRI_DEVICE_CUDA;
            sp->device = (int32_t)n;
            return true;
        }
    }
    fprintf(stderr, "%s: --device '%s': want cpu, cuda or cuda:N, or a list "
            "(cuda:0,cuda:1 or cpu:0,cpu:1)\n", cmd, arg);
    return false;
}

bool tri_cli_parse_size(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0)) return false;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0, end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024, end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024, end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024, end++; break;
    default: break;
    }
    if (mul > 1 && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0)) end += strlen(end);
    if (*end) return false;
    double b = v * mul;
    if (b > 1.8e19) return false;
    *out = (uint64_t)(b + 0.5);
    return true;
}
